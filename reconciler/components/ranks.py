"""The rank containers, managed as one group.

Tensor-parallel ranks cannot be restarted one at a time: a new rank 0 cannot rejoin a
surviving headless rank, and rank 0 exits with code 0 when a peer dies. So any
rank that is missing, exited or stale restarts the whole group, in order: stop rank 0 first,
then the other ranks; start the highest rank first and rank 0 last; then wait for readiness.
A hold (`reconciler stop`), a memory-guard trip or the crash-loop breaker keeps the group
down. An unplanned restart (a rank exited, liveness failed) is counted; a missing container
(a first start, one removed by hand) and a spec, revision or image change are not.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from reconciler.actions import (
    Action,
    Blocker,
    Component,
    Drain,
    HaltRank,
    InSync,
    Outcome,
    RemoveContainer,
    Smoke,
    StartRank,
    StopContainer,
    StopRank,
    Verb,
    WaitReady,
    action,
    runs,
    shorten,
)
from reconciler.clock import utc_iso
from reconciler.components import breaker, headroom, hostcheck
from reconciler.components.checkpoint import Placement
from reconciler.components.fabric import node_contexts
from reconciler.components.image import local_image_name
from reconciler.components.memguard import trip_advice, trips
from reconciler.errors import ReconcilerError
from reconciler.facts.containers import ContainerFacts
from reconciler.facts.host import HostFacts
from reconciler.facts.node import Facts
from reconciler.front import drain_switch
from reconciler.record import Record, replace
from reconciler.redact import redact
from reconciler.serving import (
    LABEL_BOOT_ID,
    LABEL_COMMIT,
    LABEL_CONFIG_HASH,
    LABEL_DEPLOYMENT,
    LABEL_DRIVER,
    LABEL_ENV_NAMES,
    LABEL_INPUTS,
    LABEL_KERNEL,
    LABEL_OWNER,
    LABEL_RANK,
    LABEL_ROLE,
    OWNER,
    ROLE_FRONT,
    RankContainer,
    api_base,
    container_name,
    engine_base,
    flag_values,
    render_group,
)
from reconciler.spec import Deployment
from reconciler.spec.imageref import same_image

if TYPE_CHECKING:
    from reconciler.execution import ApplyContext

COMPONENT = Component.RANKS
# How a restart's cause names a node that rebooted under its rank (incidents file it as a reboot).
REBOOTED = "rebooted since it started"
CHANGED = "config changed: "
# The config changed while the spec and the node did not: the reconciler's rendering did.
UPGRADED = "config changed by a reconciler upgrade: "
RESUMING = "resuming the group restart"
# The grace of a rank stopped by a restart after a failure (see _stopping).
UNPLANNED_GRACE_S = 10
SECRET_NAME_RE = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


def owned_containers(deployment: Deployment, facts: Facts, node: str, role: str = "") -> list[ContainerFacts]:
    """Containers labelled as ours, of this deployment and in this role (none: a rank); anything
    else is never touched."""
    return [
        container
        for container in facts.nodes[node].containers
        if container.labels.get(LABEL_OWNER) == OWNER
        and container.labels.get(LABEL_DEPLOYMENT) == deployment.name
        and container.labels.get(LABEL_ROLE, "") == role
    ]


class RankState(Record):
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
        by_upgrade = observed.labels.get(LABEL_INPUTS) == desired.labels[LABEL_INPUTS]
        return RankState(desired, observed, (UPGRADED if by_upgrade else CHANGED) + describe_drift(desired, observed))
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
    served = observed.labels.get(LABEL_COMMIT, "")
    if served != desired.commit:
        changes.append(f"checkpoint revision {served[:8] or 'unrecorded'} -> {desired.commit[:8] or 'unrecorded'}")
    if not same_image(observed.image, desired.image):
        changes.append(f"image {observed.image} -> {desired.image}")
    changes += _flag_changes(flag_values(observed.command), flag_values([*desired.entrypoint, *desired.command]))
    ours = observed.labels.get(LABEL_ENV_NAMES)
    changes += _env_changes(observed.env, desired.env_dict, set(ours.split(",")) if ours is not None else set())
    return shorten(changes, limit=4) if changes else "mounts or runtime options"


def _flag_changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    changes = [
        f"{flag} {before[flag]} -> {after[flag]}".replace("  ", " ")
        for flag in after
        if flag in before and before[flag] != after[flag]
    ]
    changes += [f"+{flag} {after[flag]}".rstrip() for flag in after if flag not in before]
    changes += [f"-{flag}" for flag in before if flag not in after]
    return changes


def _env_changes(before: dict[str, str], after: dict[str, str], set_before: set[str]) -> list[str]:
    """Variables changed, added, and dropped (of those the reconciler set: the rest of a running
    container's environment is its image's)."""

    def shown(name: str, value: str) -> str:
        return "(redacted)" if SECRET_NAME_RE.search(name) else value

    changes = [
        f"{name} {shown(name, before[name])} -> {shown(name, after[name])}"
        for name in after
        if name in before and before[name] != after[name]
    ]
    changes += [f"+{name}" for name in after if name not in before]
    changes += [f"-{name}" for name in before if name not in after and name in set_before]
    return changes


def plan_ranks(
    deployment: Deployment,
    facts: Facts,
    prerequisites: dict[str, list[str]],
    placements: Mapping[str, Placement] | None = None,
    *,
    after: list[str] | None = None,
    restart: list[str] | None = None,
    accept_memory_risk: bool = False,
    take_upgrade: bool = True,
) -> Outcome:
    """Group actions. `prerequisites` maps a node to the actions its rank must wait for;
    `placements` says where each node's revision to serve is; the first stop waits for `after`
    (the checkpoint staged everywhere); `restart` holds reasons to restart a healthy group;
    `accept_memory_risk` restarts onto a config the memory record predicts too tight;
    `take_upgrade` False keeps a serving group whose config only a reconciler upgrade changed."""
    held = hold_reasons(deployment, facts)
    if held:
        return _held(deployment, facts, held)
    contexts, blockers = node_contexts(deployment, facts)
    blockers += _names_taken(deployment, facts)
    if blockers:
        return Outcome(blockers=blockers)
    for name, placed in (placements or {}).items():
        if name in contexts:
            contexts[name] = replace(
                contexts[name], model_path=placed.model_path, plans_path=placed.plans_path, commit=placed.commit
            )
    desired = render_group(deployment, contexts)
    states, strays = _match(deployment, facts, desired)
    states = _with_group_signals(deployment, facts, states, restart or [])
    removals = [_remove_stray(container, node, deployment) for node, container in strays]
    signals = _group_signal(deployment, facts, restart or [])
    pending_upgrade = [] if take_upgrade or signals is not None else _upgrade_only(states)
    if pending_upgrade:
        return Outcome(actions=removals, notes=pending_upgrade)
    if all(state.healthy for state in states):
        in_sync = [
            InSync(state.desired.node, COMPONENT, f"{state.desired.name} running, config current") for state in states
        ]
        return Outcome(actions=removals, in_sync=in_sync)
    broken = hostcheck.fabric_blocker(deployment, facts)
    if broken is not None:
        return Outcome(actions=removals, blockers=[broken])  # a start now would fail, and then again
    memory = _memory_outlook(deployment, facts, states, accept_memory_risk)
    if memory.blockers:
        return Outcome(actions=removals, blockers=memory.blockers, notes=memory.notes)
    earlier = [*(a.id for a in removals), *(after or [])[-1:]]
    failure = unplanned_failure(deployment, facts, states)
    counted = breaker.trips_now(deployment, facts) if failure is not None else None
    if failure is not None and counted is not None:
        trip = breaker.trip_action(deployment, counted, failure, tuple(earlier[-1:]))
        reason = breaker.breaker_advice(breaker.trip_record(deployment, counted, failure))
        return _held(deployment, facts, [reason], first=[trip])
    drain = _drain(deployment, facts, states, tuple(earlier[-1:])) if failure is None else []
    earlier += [item.id for item in drain]
    group = group_restart(deployment, states, prerequisites, earlier, unplanned=failure)
    return Outcome(actions=removals + drain + group, notes=memory.notes)


def _upgrade_only(states: list[RankState]) -> list[str]:
    """The note that holds a serving group whose only difference is the reconciler's rendering
    (the restart is the owner's to take: 11-13 minutes without the API); [] when anything else
    calls for a restart, which then brings the upgrade in too."""
    changed = [state for state in states if not state.healthy]
    if not changed or any(not state.problem.startswith(UPGRADED) for state in changed):
        return []
    first = changed[0]
    drift = first.problem.removeprefix(UPGRADED)
    return [
        f"{first.desired.name} on {first.desired.node}: this reconciler renders the ranks differently ({drift}); "
        "the loop keeps the group serving: `reconciler apply` restarts it onto this version "
        "(or set loop.take_upgrades: true)"
    ]


def _memory_outlook(
    deployment: Deployment, facts: Facts, states: list[RankState], accept_risk: bool
) -> headroom.Outlook:
    """A rank whose container runs (or ran, before it failed) another config than the spec's:
    what the memory record predicts of the spec's, before the group starts onto it."""
    changes = [
        (state.desired, state.observed)
        for state in states
        if state.observed is not None
        and state.observed.labels.get(LABEL_CONFIG_HASH) != state.desired.labels[LABEL_CONFIG_HASH]
    ]
    return headroom.outlook(deployment, facts.nodes, changes, accept_risk=accept_risk)


def _drain(deployment: Deployment, facts: Facts, states: list[RankState], after: tuple[str, ...]) -> list[Action]:
    """A planned restart of a serving group lets requests in flight finish first: the front
    answers new ones 503 with Retry-After, and the restart waits until rank 0 holds none or
    serving.drain_s passes. Nothing to drain without a running rank 0 and front."""
    drain_s = deployment.serving.drain_s
    fronts = owned_containers(deployment, facts, deployment.head.name, ROLE_FRONT)
    if drain_s == 0 or any(state.observed is None or state.observed.status != "running" for state in states):
        return []  # a group short of a rank serves nothing: there is nothing to wait for
    if not any(front.status == "running" for front in fronts):
        return []
    socket, switch = drain_switch(deployment)
    metrics = f"{engine_base(deployment)}/metrics"
    payload = Drain(socket=socket, switch=switch, metrics_url=metrics, drain_s=drain_s)
    summary = (
        f"drain: the front answers new requests 503 (Retry-After), then wait until rank 0 holds no "
        f"request (up to serving.drain_s {drain_s} s)"
    )
    cause = "a planned restart lets the requests in flight finish"
    return [action(payload, deployment.head.name, "run", summary, cause, after)]


def _held(deployment: Deployment, facts: Facts, reasons: list[str], first: list[Action] | None = None) -> Outcome:
    """The group held down: running ranks stopped and kept for `reconciler logs`."""
    stops = _stop_running(deployment, facts, "ranks are held: " + reasons[0].split(";")[0], first or [])
    return Outcome(actions=stops, notes=reasons, held=list(reasons))


def unplanned_failure(deployment: Deployment, facts: Facts, states: list[RankState]) -> str | None:
    """What failed when the group needs a restart nobody asked for: a rank that exited, was killed
    or is not running, a restart that did not finish, or failed liveness probes. None for a
    missing container (a first start, or one removed by hand) and a change of config."""
    stopped = [(state, seen) for state in states if (seen := state.observed) is not None and seen.status != "running"]
    # A node that rebooted explains every exit that follows (a rank 0 exits on its lost peer).
    rebooted = [(state, why) for state, seen in stopped if (why := _rebooted(facts, state.desired.node, seen))]
    explained = rebooted or [(state, state.problem) for state, _ in stopped]
    if explained:
        state, why = explained[0]
        return f"{state.desired.name} on {state.desired.node}: {why}"
    resumed = next((state.problem for state in states if state.problem.startswith(RESUMING)), None)
    if resumed is not None:
        # A restart that did not finish (a start that never became ready, a reconciler stopped
        # mid-way) is done again: counted, so a start that fails every time trips the breaker.
        return f"{resumed}: it did not finish"
    liveness, intent = facts.liveness, facts.nodes[deployment.head.name].restart_intent
    if intent is None and liveness is not None and liveness.failures >= deployment.loop.failure_threshold:
        return f"liveness: {liveness.failures} one-token completions failed in a row ({liveness.detail})"
    return None


def _rebooted(facts: Facts, node: str, observed: ContainerFacts) -> str | None:
    """A rank that stopped because its node rebooted: the reboot is the cause, not its exit code."""
    host = facts.nodes[node].host
    if not _booted_since(observed, host):
        return None
    booted = f"boot id {observed.labels[LABEL_BOOT_ID][:8]} -> {(host.boot_id or '?')[:8]}"
    return f"{node} {REBOOTED} ({booted})"


def _names_taken(deployment: Deployment, facts: Facts) -> list[Blocker]:
    """A rank's container name held by a container that is not ours: Docker would refuse our
    create, and the reconciler never touches what it does not own, so the owner must decide."""
    blockers = []
    for rank, node, observed in facts.answering(deployment.ranked_nodes):  # node_contexts blocks the rest
        name = container_name(deployment, rank)
        owned = {container.id for container in owned_containers(deployment, facts, node.name)}
        squatter = next((c for c in observed.containers if c.name == name and c.id not in owned), None)
        if squatter is not None:
            message = (
                f"a container named {name} is not the reconciler's ({squatter.status}, image "
                f"{squatter.image[:80]}): rank {rank} cannot be created beside it"
            )
            hint = (
                f"remove or rename it (`docker rm -f {name}` on {node.name}) if it is not needed, "
                "or give the deployment another `name:`; it is never touched by the reconciler"
            )
            blockers.append(Blocker(node.name, COMPONENT, message, hint))
    return blockers


def _with_group_signals(
    deployment: Deployment, facts: Facts, states: list[RankState], restart: list[str]
) -> list[RankState]:
    """Failures no container state shows, as rank 0's problem (see _group_signal)."""
    if not all(state.healthy for state in states):
        return states
    problem = _group_signal(deployment, facts, restart)
    if problem is None:
        return states
    return [replace(state, problem=problem) if state.desired.rank == 0 else state for state in states]


def _group_signal(deployment: Deployment, facts: Facts, restart: list[str]) -> str | None:
    """What calls for a group restart though every container runs as rendered: a restart cut
    short, a dead engine behind a live API, a corrupt file the engine may have read."""
    intent, liveness = facts.nodes[deployment.head.name].restart_intent, facts.liveness
    if intent is not None:
        return f"{RESUMING} recorded at {intent.since} ({intent.cause})"
    if liveness is not None and liveness.failures >= deployment.loop.failure_threshold:
        return f"liveness: {liveness.failures} one-token completions failed in a row ({liveness.detail})"
    return restart[0] if restart else None


def hold_reasons(deployment: Deployment, facts: Facts) -> list[str]:
    reasons = [trip_advice(node, trip) for node, trip in trips(deployment, facts)]
    head = facts.nodes[deployment.head.name]
    if head.breaker is not None:
        reasons.append(breaker.breaker_advice(head.breaker))
    hold = head.hold
    if hold is not None:
        reasons.append(f"{hold.reason} since {hold.since}; ranks stay down until `reconciler start`")
    return reasons


def _stop_running(deployment: Deployment, facts: Facts, cause: str, first: list[Action]) -> list[Action]:
    """Stop (not remove) running ranks: a held group keeps its containers for `logs`."""
    actions: list[Action] = list(first)
    for _, node, _ in facts.answering(deployment.ranked_nodes):
        for container in owned_containers(deployment, facts, node.name):
            if container.status == "running":
                summary = f"stop {container.name} (kept for `reconciler logs`)"
                payload = HaltRank(**_stopping(deployment, container))
                actions.append(action(payload, node.name, "stop", summary, cause, _last(actions), container.name))
    return actions


def _stopping(deployment: Deployment, container: ContainerFacts, *, unplanned: bool = False) -> dict[str, Any]:
    """What every stop of a container names: the container seen when planning and its grace.
    A restart after a failure gives a short grace: a rank whose peer died or that stopped
    answering has no request to finish, and a wedged one would use up the whole grace."""
    grace = deployment.serving.stop_timeout_s
    return {
        "name": container.name,
        "container_id": container.id,
        "grace_s": min(grace, UNPLANNED_GRACE_S) if unplanned else grace,
    }


def _match(
    deployment: Deployment, facts: Facts, desired: list[RankContainer]
) -> tuple[list[RankState], list[tuple[str, ContainerFacts]]]:
    """Pair each desired rank with its container; anything else we own is a stray."""
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
    return [assess_rank(rank, found.get(key)) for key, rank in wanted.items()], strays


def _remove_stray(container: ContainerFacts, node: str, deployment: Deployment) -> Action:
    cause = f"owned by deployment {deployment.name} but not a rank of this spec on {node}"
    payload = RemoveContainer(**_stopping(deployment, container))
    summary = f"stop and remove {container.name}"
    return action(payload, node, "remove", summary, cause, (), container.name)


def group_restart(
    deployment: Deployment,
    states: list[RankState],
    prerequisites: dict[str, list[str]],
    earlier: list[str],
    *,
    unplanned: str | None = None,
) -> list[Action]:
    """Stop rank 0 first, then the rest; start the highest rank first, rank 0 last; wait.
    `unplanned`: the failure this restart answers, counted by its first action."""
    ordered = sorted(states, key=lambda state: state.desired.rank)
    trigger = next(state for state in reversed(ordered) if not state.healthy)
    group_cause = f"group restart: {trigger.desired.name} on {trigger.desired.node}: {trigger.problem}"
    actions: list[Action] = []
    for state in ordered:
        if state.observed is not None and state.observed.status in _STOPPABLE:
            stopping = _stopping(deployment, state.observed, unplanned=unplanned is not None)
            summary = f"stop {state.desired.name} (grace {stopping['grace_s']} s)"
            after = _last(actions) or tuple(earlier[-1:])
            # The first stop records the restart, so a reconciler that dies in the middle resumes it.
            first = not actions
            payload = StopRank(
                **stopping,
                intent=group_cause if first else None,
                unplanned=unplanned if first else None,
            )
            node, name = state.desired.node, state.desired.name
            actions.append(action(payload, node, "stop", summary, state.problem or group_cause, after, name))
    stops = [item.id for item in actions]
    for state in reversed(ordered):  # each start after the stops and the start before it
        waits_for = [*stops, *prerequisites.get(state.desired.node, []), *_last(actions)]
        count = unplanned if not actions else None  # no stop came first: the first start counts it
        actions.append(_start_action(deployment, state, group_cause, waits_for, count))
    group = [(state.desired.node, state.desired.name) for state in ordered]
    return actions + _ready_checks(deployment, group, actions[-1].id)


_STOPPABLE = {"running", "restarting", "paused", "created"}


def _start_action(
    deployment: Deployment, state: RankState, group_cause: str, depends: list[str], unplanned: str | None
) -> Action:
    rank = state.desired.rank
    role = f"API on 127.0.0.1:{deployment.api.engine_port}, behind the front" if rank == 0 else "headless"
    verb: Verb = "create" if state.observed is None else "replace"
    summary = f"start {state.desired.name} (rank {rank}, {role})"
    payload = StartRank(container=state.desired, intent=group_cause, unplanned=unplanned)
    node, name = state.desired.node, state.desired.name
    return action(payload, node, verb, summary, state.problem or group_cause, tuple(dict.fromkeys(depends)), name)


SMOKE_SCOPES = {
    "all": "models, unauthorized, stream, text, reasoning, tools, vision",
    "protocol": "models, unauthorized, stream",
}


def _ready_checks(deployment: Deployment, group: list[tuple[str, str]], after: str) -> list[Action]:
    """Wait for the API, then smoke-test it unless startup.smoke is off: a started group that
    cannot answer is not done, the apply fails with the failing checks."""
    startup, head, cause = deployment.startup, deployment.head.name, "the group was (re)started"
    summary = (
        f"wait until GET /v1/models answers 200 with the key (up to {startup.timeout_s // 60} min); "
        "any rank exit fails the group"
    )
    payload = WaitReady(timeout_s=startup.timeout_s, poll_s=startup.poll_s, url=api_base(deployment), ranks=group)
    checks = [action(payload, head, "run", summary, cause, (after,))]
    if startup.smoke == "off":
        return checks
    scope: Literal["all", "protocol"] = "protocol" if startup.smoke == "protocol" else "all"
    summary = (
        f"smoke-test the API: {SMOKE_SCOPES[scope]} (startup.smoke: {startup.smoke}); a failing check fails the apply"
    )
    smoke = Smoke(checks=scope, timeout_s=startup.smoke_timeout_s)
    return [*checks, action(smoke, head, "run", summary, cause, (checks[0].id,))]


def _last(actions: list[Action]) -> tuple[str, ...]:
    return tuple(item.id for item in actions[-1:])


def record_intent(ctx: ApplyContext, cause: str) -> None:
    """The one writer of the head's restart intent: written before the group's first stop or
    start, so a reconciler that dies mid-restart resumes it; an intent already there (the
    restart being resumed) is kept.
    The cause is redacted: it may quote a node's words."""
    head = ctx.deployment.head.name
    content = json.dumps({"since": utc_iso(), "cause": redact(cause)}) + "\n"
    path = ctx.state_dir(head).restart_intent
    ctx.ops(head).write_file(path, content, keep_existing=True)


def stop_container(ctx: ApplyContext, action: Action, stop: StopContainer) -> str:
    """Stop the container the plan saw (and remove it unless kept for logs): if it is gone or
    already stopped, there is nothing to do; if it is not ours, never touch it. The stop that
    begins a group restart records it first."""
    from reconciler.transport.base import find_container  # executors only: planning loads no transport

    if isinstance(stop, StopRank) and stop.intent is not None:
        record_intent(ctx, stop.intent)
    if isinstance(stop, StopRank) and stop.unplanned is not None:
        breaker.record_restart(ctx, stop.unplanned)
    elif isinstance(stop, StopRank) and stop.intent is not None:
        ctx.events.emit("restart", cause=stop.intent, planned=True)
    container = find_container(ctx.transport(action.node).docker(), stop.name)
    if container is None:
        return "already gone"
    if container.labels.get(LABEL_OWNER) != OWNER:
        raise ReconcilerError(f"{action.node}: {stop.name} is not ours; leaving it", "rename or remove it by hand")
    container.stop(timeout=stop.grace_s)
    if stop.KEEPS:
        return "stopped (kept for logs)"
    container.remove(force=True)
    return "stopped and removed"


def _start(ctx: ApplyContext, action: Action, start: StartRank) -> str:
    """Create and start exactly the rendered container of the plan (replacing our old one)."""
    desired = start.container
    record_intent(ctx, start.intent)
    if start.unplanned is not None:
        breaker.record_restart(ctx, start.unplanned)
    client = ctx.transport(action.node).docker()
    remove_our_old(client, action.node, desired.name)
    started_on = host_labels(ctx.facts.nodes[action.node].host) if action.node in ctx.facts.nodes else {}
    # A node that took the image from a peer knows it by the relay's name: the same digest.
    desired = replace(desired, image=local_image_name(client, desired.image))
    created = client.api.create_container(**create_container_args(client.api, desired, started_on))
    client.api.start(created["Id"])
    return f"started {desired.name} ({created['Id'][:12]})"


def remove_stopped_ranks(ctx: ApplyContext) -> None:
    """The rank containers of this deployment that do not run, removed on every node that answers
    (a released group starts afresh); containers of others are never touched."""
    import docker
    import requests

    from reconciler.errors import NodeCommandError, NodeUnreachableError

    deployment = ctx.deployment
    labels = [f"{LABEL_OWNER}={OWNER}", f"{LABEL_DEPLOYMENT}={deployment.name}"]
    for node in deployment.nodes:
        try:
            client = ctx.transport(node.name).docker()
            for container in client.containers.list(all=True, filters={"label": labels}):
                if container.labels.get(LABEL_ROLE, "") == "" and container.status != "running":
                    container.remove(force=True)
        except (NodeUnreachableError, NodeCommandError, docker.errors.DockerException, requests.RequestException):
            continue  # a node that does not answer keeps its containers; the next plan sees them


def remove_our_old(client: Any, node: str, name: str) -> None:
    """Remove the container of this name before its replacement is created, if it is ours; one
    that is not ours is never touched."""
    from reconciler.transport.base import find_container

    old = find_container(client, name)
    if old is None:
        return
    if old.labels.get(LABEL_OWNER) != OWNER:
        raise ReconcilerError(
            f"{node}: a container named {name} exists and is not ours",
            "remove or rename it; the reconciler never touches containers it does not own",
        )
    old.remove(force=True)


def host_labels(host: HostFacts) -> dict[str, str]:
    """The host a rank starts on, as labels of its container (what is known of it)."""
    known = {LABEL_BOOT_ID: host.boot_id, LABEL_KERNEL: host.kernel, LABEL_DRIVER: host.driver}
    return {label: value for label, value in known.items() if value is not None}


def host_changes(observed: ContainerFacts, host: HostFacts) -> list[str]:
    """What changed under a rank since it started: its node's boot, kernel or NVIDIA driver."""
    started = observed.labels
    changes = ["the node rebooted (boot id changed)"] if _booted_since(observed, host) else []
    for label, what, now in ((LABEL_KERNEL, "kernel", host.kernel), (LABEL_DRIVER, "NVIDIA driver", host.driver)):
        before = started.get(label)
        if now is not None and before is not None and before != now:
            changes.append(f"{what} {before} -> {now}")
    return changes


def _booted_since(observed: ContainerFacts, host: HostFacts) -> bool:
    """The node's boot id is not the one the rank was started on (both known)."""
    started = observed.labels.get(LABEL_BOOT_ID)
    return host.boot_id is not None and started is not None and started != host.boot_id


def create_container_args(api: Any, desired: RankContainer, started_on: dict[str, str] | None = None) -> dict[str, Any]:
    """Low-level Docker API arguments of a rendered rank (its `docker run` options, plus labels
    and a stop timeout, which the high-level SDK call cannot set); `started_on`: the host's
    labels, kept apart from the rendered ones so they never count as drift."""
    import docker  # here, not at the top: planning imports this module and needs no Docker SDK

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
        "labels": {**desired.labels, **(started_on or {})},
        "stop_timeout": desired.stop_timeout_s,
        "host_config": host_config,
    }


def _await_ready(ctx: ApplyContext, action: Action, wait: WaitReady) -> str:
    from reconciler import health  # the HTTP client, only when a rank is actually awaited

    del action
    result = health.wait_ready(ctx, wait)
    head = ctx.deployment.head.name  # ready: the restart the intent recorded is done
    ctx.ops(head).remove_file(ctx.state_dir(head).restart_intent)
    return result


def _run_smoke(ctx: ApplyContext, action: Action, smoke: Smoke) -> str:
    del action
    if ctx.smoke is None:
        return "skipped: nothing to run the smoke with here"
    return ctx.smoke(ctx, smoke)


EXECUTORS = (
    runs(StopRank, stop_container),
    runs(RemoveContainer, stop_container),
    runs(HaltRank, stop_container),
    runs(StartRank, _start),
    runs(WaitReady, _await_ready),
    runs(Smoke, _run_smoke),
)
