"""The rank containers, managed as one group.

Tensor-parallel ranks cannot be restarted one at a time: a new rank 0 cannot rejoin a
surviving headless rank, and rank 0 exits with code 0 when a peer dies (REFERENCE §5). So any
rank that is missing, exited or stale restarts the whole group, in order: stop rank 0 first,
then the other ranks; start the highest rank first and rank 0 last; then wait for readiness.
A hold (`reconciler stop`) or a memory-guard trip keeps the group down.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, replace
from typing import Any

import docker

from reconciler import health, smoke
from reconciler.actions import Action, Blocker, InSync, Outcome, Verb, action_id, shorten
from reconciler.apiclient import ApiTarget
from reconciler.components.apikey import read_key
from reconciler.components.memguard import trip_advice, trips
from reconciler.errors import ReconcilerError
from reconciler.execution import ApplyContext, Executor
from reconciler.facts.containers import ContainerFacts
from reconciler.facts.fabric import subnet_mismatches
from reconciler.facts.node import Facts
from reconciler.redact import redact
from reconciler.serving import (
    LABEL_CONFIG_HASH,
    LABEL_DEPLOYMENT,
    LABEL_OWNER,
    LABEL_RANK,
    OWNER,
    NodeContext,
    RankContainer,
    ResolvedFabric,
    render_group,
)
from reconciler.spec import Deployment, Node

COMPONENT = "ranks"
_SECRET_NAME_RE = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


def resolve_fabric(node: Node, facts: Facts) -> ResolvedFabric | Blocker:
    """Spec overrides win field by field; what is still unknown blocks the group, saying why."""
    detected = facts.nodes[node.name].fabric
    ifname = node.fabric.ifname or detected.ifname
    ip = node.fabric.ip or detected.ip
    hcas = node.fabric.hcas if node.fabric.hcas is not None else detected.hcas
    if ifname is None or ip is None:
        unknown = " and ".join(name for name, value in (("interface", ifname), ("IPv4", ip)) if value is None)
        message = detected.problem or f"fabric {unknown} not detected (no ACTIVE RoCE port with an IPv4 address?)"
        return Blocker(node.name, COMPONENT, message, fabric_hint(node.name, ifname, detected.candidates))
    return ResolvedFabric(ifname=ifname, ip=ip, hcas=tuple(hcas), gid_index=node.fabric.gid_index)


def fabric_hint(node: str, ifname: str | None, candidates: list[str]) -> str:
    """The override that settles it: the interface (its IPv4 and HCAs follow) or, on a known
    interface with several addresses, the IPv4."""
    field = "ifname" if ifname is None else "ip"
    if candidates:
        return (
            f"set nodes[{node}].fabric.{field} to one of {', '.join(candidates)} "
            "(the same QSFP port on every node); the rest is then derived from it"
        )
    return (
        f"check `rdma link` and `ip -br addr` on {node}: give the ACTIVE QSFP port a static IPv4 (netplan), "
        f"or set nodes[{node}].fabric.ifname and .ip"
    )


def subnet_blockers(deployment: Deployment, facts: Facts, contexts: dict[str, NodeContext]) -> list[Blocker]:
    """Every node's fabric address must share a subnet with the head's (prefix lengths from the
    interface that carries the address; unknown for an override on no interface)."""
    addresses: dict[str, tuple[str, int | None]] = {}
    for _, node in deployment.ranked_nodes:
        if node.name in contexts:
            ip = contexts[node.name].fabric.ip
            detected = facts.nodes[node.name].fabric
            addresses[node.name] = (ip, detected.prefixlen if detected.ip == ip else None)
    return [
        Blocker(
            node,
            COMPONENT,
            message,
            "give every node's QSFP port an address in one subnet (netplan), or fix nodes[].fabric.ip; "
            "`ip -br addr` shows them",
        )
        for node, message in subnet_mismatches(addresses)
    ]


def node_contexts(deployment: Deployment, facts: Facts) -> tuple[dict[str, NodeContext], list[Blocker]]:
    contexts: dict[str, NodeContext] = {}
    blockers: list[Blocker] = []
    for _, node in deployment.ranked_nodes:
        observed = facts.nodes[node.name]
        if not observed.reachable:
            blockers.append(
                Blocker(
                    node.name,
                    COMPONENT,
                    f"node unreachable: {observed.error or 'no answer'}",
                    "the rank group is left as it is until every node answers",
                )
            )
            continue
        fabric = resolve_fabric(node, facts)
        if isinstance(fabric, Blocker):
            blockers.append(fabric)
        elif observed.home is None:
            blockers.append(
                Blocker(
                    node.name,
                    COMPONENT,
                    "home directory unknown",
                    "facts must include the node's home",
                )
            )
        else:
            contexts[node.name] = NodeContext(home=observed.home, fabric=fabric)
    return contexts, blockers + subnet_blockers(deployment, facts, contexts)


def owned_containers(deployment: Deployment, facts: Facts, node: str) -> list[ContainerFacts]:
    """Containers labelled as ours and of this deployment; anything else is never touched."""
    return [
        container
        for container in facts.nodes[node].containers
        if container.labels.get(LABEL_OWNER) == OWNER and container.labels.get(LABEL_DEPLOYMENT) == deployment.name
    ]


@dataclass(frozen=True)
class RankState:
    desired: RankContainer
    observed: ContainerFacts | None
    problem: str

    @property
    def healthy(self) -> bool:
        return not self.problem


def assess_rank(desired: RankContainer, observed: ContainerFacts | None) -> RankState:
    if observed is None:
        return RankState(desired, None, "container missing")
    if observed.status != "running":
        return RankState(desired, observed, _exit_description(observed))
    if observed.labels.get(LABEL_CONFIG_HASH) != desired.labels[LABEL_CONFIG_HASH]:
        return RankState(desired, observed, "config changed: " + describe_drift(desired, observed))
    return RankState(desired, observed, "")


def _exit_description(observed: ContainerFacts) -> str:
    if observed.oom_killed:
        return "killed by the kernel OOM killer"
    if observed.status in {"exited", "dead"}:
        when = f" at {observed.finished_at}" if observed.finished_at else ""
        return f"exited with code {observed.exit_code}{when} (any exit fails the group, code 0 included)"
    return f"container is {observed.status}, not running"


def describe_drift(desired: RankContainer, observed: ContainerFacts) -> str:
    """What differs between the running container and the rendered one, secrets redacted."""
    changes: list[str] = []
    if observed.image != desired.image:
        changes.append(f"image {observed.image} -> {desired.image}")
    changes += _flag_changes(_flags(observed.command), _flags([*desired.entrypoint, *desired.command]))
    changes += _env_changes(observed.env, desired.env_dict)
    return shorten(changes, limit=4) if changes else "mounts or runtime options"


def _flags(argv: list[str]) -> dict[str, str]:
    flags: dict[str, str] = {}
    index = 0
    while index < len(argv):
        token = argv[index]
        has_value = index + 1 < len(argv) and not argv[index + 1].startswith("--")
        if token.startswith("--"):
            flags[token] = argv[index + 1] if has_value else ""
            index += 2 if has_value else 1
        else:
            index += 1
    return flags


def _flag_changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    changes = [
        f"{flag} {before[flag]} -> {after[flag]}".replace("  ", " ")
        for flag in after
        if flag in before and before[flag] != after[flag]
    ]
    changes += [f"+{flag} {after[flag]}".rstrip() for flag in after if flag not in before]
    changes += [f"-{flag}" for flag in before if flag not in after]
    return changes


def _env_changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    def shown(name: str, value: str) -> str:
        return "(redacted)" if _SECRET_NAME_RE.search(name) else value

    changes = [
        f"{name} {shown(name, before[name])} -> {shown(name, after[name])}"
        for name in after
        if name in before and before[name] != after[name]
    ]
    changes += [f"+{name}" for name in after if name not in before]
    changes += [f"-{name}" for name in before if name not in after]
    return changes


def plan_ranks(deployment: Deployment, facts: Facts, prerequisites: dict[str, list[str]]) -> Outcome:
    """Group actions; `prerequisites` maps a node to the actions its rank must wait for."""
    outcome = Outcome()
    held = _hold_reasons(deployment, facts)
    if held:
        outcome.notes += held
        outcome.held += held
        outcome.actions += _stop_running(deployment, facts, "ranks are held: " + held[0].split(";")[0])
        return outcome
    contexts, blockers = node_contexts(deployment, facts)
    if blockers:
        outcome.blockers += blockers
        return outcome
    desired = render_group(deployment, contexts)
    states, strays = _match(deployment, facts, desired)
    states = _with_group_signals(deployment, facts, states)
    outcome.actions += [_remove_stray(container, node, deployment) for node, container in strays]
    if all(state.healthy for state in states):
        outcome.in_sync += [
            InSync(state.desired.node, COMPONENT, f"{state.desired.name} running, config current") for state in states
        ]
        return outcome
    outcome.actions += group_restart(deployment, states, prerequisites, [a.id for a in outcome.actions])
    return outcome


def _with_group_signals(deployment: Deployment, facts: Facts, states: list[RankState]) -> list[RankState]:
    """Failures no container state shows: a dead engine behind a live API, a restart cut short."""
    problem = _group_problem(deployment, facts)
    if problem is None or not all(state.healthy for state in states):
        return states
    return [replace(state, problem=problem) if state.desired.rank == 0 else state for state in states]


def _group_problem(deployment: Deployment, facts: Facts) -> str | None:
    intent = facts.nodes[deployment.head.name].restart_intent
    if intent is not None:
        return f"resuming the group restart recorded at {intent.since} ({intent.cause})"
    liveness = facts.liveness
    if liveness is not None and liveness.failures >= deployment.loop.failure_threshold:
        return f"liveness: {liveness.failures} one-token completions failed in a row ({liveness.detail})"
    return None


def _hold_reasons(deployment: Deployment, facts: Facts) -> list[str]:
    reasons = [trip_advice(node, trip) for node, trip in trips(deployment, facts)]
    hold = facts.nodes[deployment.head.name].hold
    if hold is not None:
        reasons.append(f"{hold.reason} since {hold.since}; ranks stay down until `reconciler start`")
    return reasons


def _stop_running(deployment: Deployment, facts: Facts, cause: str) -> list[Action]:
    """Stop (not remove) running ranks: a held group keeps its containers for `logs`."""
    actions: list[Action] = []
    for _, node in deployment.ranked_nodes:
        if not facts.nodes[node.name].reachable:
            continue
        for container in owned_containers(deployment, facts, node.name):
            if container.status == "running":
                summary = f"stop {container.name} (kept for `reconciler logs`)"
                action = _container_action(node.name, container.name, "stop", summary, cause, _last(actions))
                actions.append(replace(action, id=action_id(COMPONENT, f"halt-{container.name}", node.name)))
    return actions


def _match(
    deployment: Deployment, facts: Facts, desired: list[RankContainer]
) -> tuple[list[RankState], list[tuple[str, ContainerFacts]]]:
    """Pair each desired rank with its container; anything else we own is a stray."""
    states: list[RankState] = []
    strays: list[tuple[str, ContainerFacts]] = []
    wanted = {(rank.node, str(rank.rank)): rank for rank in desired}
    found: dict[tuple[str, str], ContainerFacts] = {}
    for _, node in deployment.ranked_nodes:
        for container in owned_containers(deployment, facts, node.name):
            key = (node.name, container.labels.get(LABEL_RANK, ""))
            if key in wanted and key not in found and container.name == wanted[key].name:
                found[key] = container
            else:
                strays.append((node.name, container))
    for key, rank in wanted.items():
        states.append(assess_rank(rank, found.get(key)))
    return states, strays


def _remove_stray(container: ContainerFacts, node: str, deployment: Deployment) -> Action:
    cause = f"owned by deployment {deployment.name} but not a rank of this spec on {node}"
    return _container_action(node, container.name, "remove", f"stop and remove {container.name}", cause, ())


def group_restart(
    deployment: Deployment,
    states: list[RankState],
    prerequisites: dict[str, list[str]],
    earlier: list[str],
) -> list[Action]:
    """Stop rank 0 first, then the rest; start the highest rank first, rank 0 last; wait."""
    ordered = sorted(states, key=lambda state: state.desired.rank)
    trigger = next(state for state in reversed(ordered) if not state.healthy)
    group_cause = f"group restart: {trigger.desired.name} on {trigger.desired.node}: {trigger.problem}"
    actions: list[Action] = []
    for state in ordered:
        if state.observed is not None and state.observed.status in _STOPPABLE:
            summary = f"stop {state.desired.name} (grace {deployment.serving.stop_timeout_s} s)"
            depends = _last(actions) or tuple(earlier[-1:])
            actions.append(
                _container_action(
                    state.desired.node,
                    state.desired.name,
                    "stop",
                    summary,
                    state.problem or group_cause,
                    depends,
                )
            )
    stops = [action.id for action in actions]
    previous_start: list[str] = []
    for state in reversed(ordered):
        actions.append(
            _start_action(
                deployment,
                state,
                group_cause,
                [*stops, *prerequisites.get(state.desired.node, []), *previous_start],
            )
        )
        previous_start = [actions[-1].id]
    actions.append(_wait_ready(deployment, actions[-1].id))
    if deployment.startup.smoke != "off":
        actions.append(_smoke(deployment, actions[-1].id))
    return actions


_STOPPABLE = {"running", "restarting", "paused", "created"}


def _start_action(deployment: Deployment, state: RankState, group_cause: str, depends: list[str]) -> Action:
    rank = state.desired.rank
    role = f"API on :{deployment.serving.port}" if rank == 0 else "headless"
    verb: Verb = "create" if state.observed is None else "replace"
    summary = f"start {state.desired.name} (rank {rank}, {role})"
    return _container_action(
        state.desired.node,
        state.desired.name,
        verb,
        summary,
        state.problem or group_cause,
        tuple(dict.fromkeys(depends)),
    )


def _wait_ready(deployment: Deployment, after: str) -> Action:
    head = deployment.head.name
    minutes = deployment.startup.timeout_s // 60
    return Action(
        action_id(COMPONENT, "wait-ready", head),
        COMPONENT,
        "run",
        head,
        f"wait until GET /v1/models answers 200 with the key (up to {minutes} min); any rank exit fails the group",
        "the group was (re)started",
        (after,),
    )


def _smoke(deployment: Deployment, after: str) -> Action:
    """A started group that cannot answer is not done: the apply fails with the failing checks."""
    head = deployment.head.name
    checks = ", ".join(smoke.check_names(_smoke_checks(deployment)))
    return Action(
        action_id(COMPONENT, "smoke", head),
        COMPONENT,
        "run",
        head,
        f"smoke-test the API: {checks} (startup.smoke: {deployment.startup.smoke}); a failing check fails the apply",
        "the group was (re)started",
        (after,),
    )


def _smoke_checks(deployment: Deployment) -> smoke.CheckSet:
    return "protocol" if deployment.startup.smoke == "protocol" else "all"


def _last(actions: list[Action]) -> tuple[str, ...]:
    return tuple(action.id for action in actions[-1:])


def _container_action(
    node: str, container: str, verb: Verb, summary: str, cause: str, depends: tuple[str, ...]
) -> Action:
    step = {"stop": "stop", "remove": "remove"}.get(verb, "start")
    return Action(
        action_id(COMPONENT, f"{step}-{container}", node),
        COMPONENT,
        verb,
        node,
        summary,
        cause,
        depends,
        container,
    )


def _desired(ctx: ApplyContext, name: str) -> RankContainer:
    contexts, blockers = node_contexts(ctx.deployment, ctx.facts)
    if blockers:
        raise ReconcilerError(f"{blockers[0].node}: {blockers[0].message}", blockers[0].hint)
    return next(rank for rank in render_group(ctx.deployment, contexts) if rank.name == name)


def _find(client: Any, name: str) -> Any:
    """The container of that exact name, or None (a listing, because docker-py leaves the
    connection of a 404 open)."""
    found = client.containers.list(all=True, filters={"name": f"^/{name}$"})
    return found[0] if found else None


INTENT_FILE = "restart-intent.json"


def _record_intent(ctx: ApplyContext, action: Action) -> None:
    """Written before the group's first stop, so a reconciler that dies mid-restart resumes it."""
    head = ctx.deployment.head.name
    cause = redact(action.cause)
    content = json.dumps({"since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cause": cause}) + "\n"
    path = ctx.state_path(head, INTENT_FILE)
    ctx.ops(head, "write_file", {"path": path, "content": content, "keep_existing": True})


def _clear_intent(ctx: ApplyContext) -> None:
    head = ctx.deployment.head.name
    ctx.ops(head, "remove_file", {"path": ctx.state_path(head, INTENT_FILE)})


def _stop_and_remove(ctx: ApplyContext, action: Action) -> str:
    if action.step == "stop":
        _record_intent(ctx, action)
    client = ctx.transport(action.node).docker()
    container = _find(client, action.target)
    if container is None:
        return "already gone"
    if container.labels.get(LABEL_OWNER) != OWNER:
        raise ReconcilerError(f"{action.node}: {action.target} is not ours; leaving it", "rename or remove it by hand")
    container.stop(timeout=ctx.deployment.serving.stop_timeout_s)
    container.remove(force=True)
    return "stopped and removed"


def _halt(ctx: ApplyContext, action: Action) -> str:
    container = _find(ctx.transport(action.node).docker(), action.target)
    if container is None:
        return "already gone"
    container.stop(timeout=ctx.deployment.serving.stop_timeout_s)
    return "stopped (kept for logs)"


def _start(ctx: ApplyContext, action: Action) -> str:
    _record_intent(ctx, action)
    desired = _desired(ctx, action.target)
    client = ctx.transport(action.node).docker()
    old = _find(client, desired.name)
    if old is not None:
        if old.labels.get(LABEL_OWNER) != OWNER:
            raise ReconcilerError(
                f"{action.node}: a container named {desired.name} exists and is not ours",
                "remove or rename it; the reconciler never touches containers it does not own",
            )
        old.remove(force=True)
    created = client.api.create_container(**create_container_args(client.api, desired))
    client.api.start(created["Id"])
    return f"started {desired.name} ({created['Id'][:12]})"


def create_container_args(api: Any, desired: RankContainer) -> dict[str, Any]:
    """Low-level Docker API arguments of a rendered rank (the reference `docker run`, plus labels
    and a stop timeout, which the high-level SDK call cannot set)."""
    host_config = api.create_host_config(
        binds={m.source: {"bind": m.target, "mode": "ro" if m.read_only else "rw"} for m in desired.mounts},
        network_mode=desired.network_mode,
        ipc_mode=desired.ipc_mode,
        privileged=desired.privileged,
        shm_size=desired.shm_size,
        ulimits=[docker.types.Ulimit(name=name, soft=soft, hard=hard) for name, soft, hard in desired.ulimits],
        restart_policy={"Name": desired.restart_policy},
        device_requests=[docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
        if desired.gpus == "all"
        else None,
    )
    return {
        "image": desired.image,
        "name": desired.name,
        "entrypoint": list(desired.entrypoint),
        "command": list(desired.command),
        "environment": dict(desired.env),
        "labels": desired.labels,
        "stop_timeout": desired.stop_timeout_s,
        "host_config": host_config,
    }


def _await_ready(ctx: ApplyContext, _action: Action) -> str:
    result = health.wait_ready(ctx)
    _clear_intent(ctx)
    return result


def _run_smoke(ctx: ApplyContext, _action: Action) -> str:
    deployment = ctx.deployment
    target = ApiTarget(health.api_base(deployment), read_key(ctx), deployment.serving.served_model_name)
    report = smoke.run_smoke(target, _smoke_checks(deployment), timeout_s=deployment.startup.smoke_timeout_s)
    if not report.ok:
        raise smoke.SmokeFailedError(
            f"smoke failed: {smoke.failure_text(report)}",
            "run `reconciler smoke` for every check; for a model that cannot answer the reference questions "
            "set startup.smoke: protocol (or off)",
        )
    return report.summary()


EXECUTORS: dict[str, Executor] = {
    "stop": _stop_and_remove,
    "remove": _stop_and_remove,
    "halt": _halt,
    "start": _start,
    "wait-ready": _await_ready,
    "smoke": _run_smoke,
}
