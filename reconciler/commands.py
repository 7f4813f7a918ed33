"""The flows behind each command, as data; cli.py renders them.

`converge` is the one path that changes a deployment: `apply`, `apply FILE`, `stop`, `start` and
the loop all go through it, and it takes the deployment lock itself, so two of them never act
at once. Inside the lock: an optional first step (`stop` writes the hold, `start` clears it),
then gather, plan (or check a saved plan against the facts), show, ask, apply, and plan again
to say whether it converged.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler import incidents, notify, savedplan, starts
from reconciler.actions import Action, Component, Smoke, Step
from reconciler.apply import ApplyResult, apply_plan
from reconciler.clock import utc_iso
from reconciler.components import breaker, ranks
from reconciler.errors import (
    ApplyError,
    FactsChangedError,
    NodeCommandError,
    NodeUnreachableError,
    ReconcilerError,
    SmokeFailedError,
)
from reconciler.events import EventLog, history_path
from reconciler.execution import ApplyContext, Progress, Publisher
from reconciler.facts.gather import gather
from reconciler.facts.node import Facts, Liveness
from reconciler.health import health_code, probe_liveness, read_ca, read_key
from reconciler.lock import deployment_lock
from reconciler.loopstatus import read_status, write_pass
from reconciler.nodeops import NodeOps
from reconciler.nodeside.statedir import StateDir
from reconciler.plan import Plan, condition, plan
from reconciler.progress import PassState
from reconciler.record import Record, replace
from reconciler.serving import api_base, container_name
from reconciler.spec import Deployment
from reconciler.transport.base import Transport, find_container
from reconciler.transport.connect import close_all, connect_all
from reconciler.verify import smoke
from reconciler.verify.apiclient import ApiTarget


@contextlib.contextmanager
def session(deployment: Deployment) -> Iterator[dict[str, Transport]]:
    """One transport per node for the whole command, closed at the end."""
    transports = connect_all(deployment)
    try:
        yield transports
    finally:
        close_all(transports)


def live_plan(
    deployment: Deployment,
    transports: dict[str, Transport],
    *,
    update_revision: bool = False,
    accept_memory_risk: bool = False,
    take_upgrade: bool = True,
) -> tuple[Facts, Plan]:
    facts = gather(deployment, transports, update_revision=update_revision)
    return facts, plan(
        deployment,
        facts,
        update_revision=update_revision,
        accept_memory_risk=accept_memory_risk,
        take_upgrade=take_upgrade,
    )


@dataclass
class Converge:
    """How one converge runs: who does it (the lock says), and what it may do."""

    doing: str
    wait_s: float = 600.0
    deep_verify: bool = False
    # Move a branch or tag of the spec to where it points on the Hub now.
    update_revision: bool = False
    # Restart onto a serving edit the memory record predicts too tight.
    accept_memory_risk: bool = False
    # Restart a serving group whose config only a reconciler upgrade changed (the loop: only
    # when the spec opts in, loop.take_upgrades).
    take_upgrade: bool = True
    # A saved plan to run instead of planning now (refused when the facts changed since).
    saved: tuple[savedplan.SavedPlan, Path] | None = None
    # Runs under the lock before anything is observed: `stop` holds, `start` releases.
    first: Callable[[ApplyContext], None] | None = None
    # What set it off (the loop's triggers; "" for a command).
    trigger: str = ""
    # `apply --events FILE`: the history's lines, and the steps' progress, for a script.
    events_file: Path | None = None
    # Sees the facts as first gathered (the loop compares them with its last pass's).
    observed: Callable[[Facts], None] = lambda _facts: None
    show: Callable[[Plan], None] = lambda _plan: None
    # False declines: nothing is applied.
    confirm: Callable[[Plan], bool] = lambda _plan: True
    liveness: Liveness | None = None
    # `apply` fails when nothing can be planned; the loop reports it as its condition instead.
    blocked_is_error: bool = True
    on_wait: Callable[[str], None] | None = None
    # Sees every line of the event history as it is written (the loop's metrics).
    on_event: Callable[[dict[str, Any]], None] | None = None
    # Run only these components' steps (`rotate-key`: the front, never the ranks); None: all.
    only: frozenset[Component] | None = None


@dataclass
class ApplyOutcome:
    before: Plan
    result: ApplyResult
    after: Plan
    facts: Facts
    declined: bool = False
    # The plan made when an executor found the world other than the first plan's facts.
    replanned: Plan | None = None


def converge(
    deployment: Deployment, transports: dict[str, Transport], progress: Progress, request: Converge
) -> ApplyOutcome:
    """The one way the deployment is changed; see the module's docstring."""
    lock = deployment_lock(deployment, request.doing, wait_s=request.wait_s, on_wait=request.on_wait or progress.line)
    history = EventLog(history_path(deployment.state_dir), also=request.events_file, listener=request.on_event)
    publisher = _with_progress_events(pass_publisher(deployment), history)
    with lock, progress.publishing(request.doing, publisher):
        started = time.monotonic()

        def record(outcome: str, **more: str) -> None:
            seconds = round(time.monotonic() - started, 2)
            history.emit("pass", doing=request.doing, trigger=request.trigger, seconds=seconds, outcome=outcome, **more)

        try:
            outcome = _converge_locked(deployment, transports, progress, request, history)
        except ReconcilerError as exc:
            record("failed", error=exc.message)
            raise
        record("declined" if outcome.declined else condition(outcome.after))
        return outcome


def _with_progress_events(publish: Publisher, history: EventLog) -> Publisher:
    """The pass's state published as before, and each step's byte work as a progress event (in
    `apply --events FILE` only)."""

    def both(state: PassState | None) -> None:
        publish(state)
        for step in state.active if state is not None else []:
            shown = step.to_dict()
            if shown["bytes"] is not None or shown["detail"] is not None:
                said = {"quiet_s": shown["quiet_s"], "detail": shown["detail"]}
                history.progress(step=shown["action"], node=shown["node"], **(shown["bytes"] or {}), **said)

    return both


def _converge_locked(
    deployment: Deployment, transports: dict[str, Transport], progress: Progress, request: Converge, history: EventLog
) -> ApplyOutcome:
    context = ApplyContext(deployment, Facts(nodes={}), transports, progress, smoke=smoke_after_start, events=history)
    if request.first is not None:
        request.first(context)
    progress.phase("gathering facts")
    facts = observe(deployment, transports, request.liveness, update_revision=request.update_revision)
    request.observed(facts)
    before = _plan_to_run(deployment, facts, request)
    _record_incidents(context, facts, before)
    if before.held and before.actions:  # the pass that begins a hold stops the ranks: one event
        context.events.emit("hold", reason=before.held[0], steps=len(before.actions))
    request.show(before)
    if before.blockers and not before.actions and request.blocked_is_error:
        blocker = before.blockers[0]
        raise ReconcilerError(f"{blocker.node}: {blocker.message}", blocker.hint)
    if not before.actions:
        return ApplyOutcome(before, ApplyResult(), before, facts)
    if not request.confirm(before):
        return ApplyOutcome(before, ApplyResult(), before, facts, declined=True)
    result = ApplyResult()
    failed = _apply_round(context, before, facts, result)
    if failed is not None and request.saved is not None:
        raise ApplyError(failed.message, _SAVED_PLAN_HINT, cause=failed.cause)
    progress.phase("gathering facts again")
    after_facts = observe(deployment, transports, None)
    # After a finding, a deep verify the first round did not reach is still deep in the next plan.
    deep = _deep_left(request, before, result, failed) if failed is not None else False
    after = _only(request, plan(deployment, after_facts, deep_verify=deep, take_upgrade=request.take_upgrade))
    replanned = None
    if failed is not None and after.has_changes:
        # An executor found the world other than the facts (a file whose bytes differ): a plan
        # made from the world as it is now decides what follows, shown and asked for like the first.
        replanned = after
        progress.line(f"{failed.cause.message}: planned again from the facts as they are now")
        request.show(after)
        if request.confirm(after):
            again = _apply_round(context, after, after_facts, result)
            if again is not None:
                raise ApplyError(again.message, _hint_again(failed, again), cause=again.cause)
            after_facts = observe(deployment, transports, None)
            after = _only(request, plan(deployment, after_facts, take_upgrade=request.take_upgrade))
    _record_start(context)
    return ApplyOutcome(before, result, after, after_facts, replanned=replanned)


def _record_start(context: ApplyContext) -> None:
    """A group start that became ready in this converge: its phases, kept and in the history."""
    record = starts.start_record(context.spans)
    if record is not None:
        starts.keep_start(starts.starts_path(context.deployment.state_dir), record)
        context.events.emit("start", **record)


class _Finding(Record):
    """How an executor ended an apply round on finding the world other than the facts: the
    failed action's line and what it found."""

    message: str
    cause: FactsChangedError


def _apply_round(context: ApplyContext, current: Plan, facts: Facts, result: ApplyResult) -> _Finding | None:
    """Apply one plan; an executor's finding that the world differs from the facts ends the
    round and is returned, for a new plan (any other failure is raised)."""
    context.facts = facts
    context.progress.phase(f"applying {len(current.actions)} actions")
    try:
        apply_plan(context, current, result)
    except ApplyError as exc:
        if exc.step in _START_STEPS:
            _record_failed_start(context, current, exc)
        if not isinstance(exc.cause, FactsChangedError):
            raise
        return _Finding(exc.message, exc.cause)
    return None


# A group start that fails in one of these steps is an incident: the group did not come up.
_START_STEPS = {Step.START_RANK.value, Step.WAIT_READY.value, Step.SMOKE.value}


def _record_incidents(context: ApplyContext, facts: Facts, before: Plan) -> None:
    """The unplanned failures this pass met, each recorded once with the plan that follows it."""
    found = incidents.detect(context.deployment, facts, before)
    if found:
        _register_key(context, facts)
    for item in found:
        written = incidents.record(
            context.deployment, context.transports, facts, before, item, log=context.progress.line
        )
        _incident_event(context, written)


def _incident_event(context: ApplyContext, written: incidents.Incident | None) -> None:
    if written is not None:
        context.events.emit("incident", id=written.id, incident=written.kind, cause=written.cause)


def _record_failed_start(context: ApplyContext, current: Plan, error: ApplyError) -> None:
    """A start that did not become ready: recorded with the facts as they are now."""
    try:
        facts = observe(context.deployment, context.transports, None)
    except ReconcilerError:
        facts = context.facts
    _register_key(context, facts)
    found = incidents.failed_start(error.message, facts)
    written = incidents.record(context.deployment, context.transports, facts, current, found, log=context.progress.line)
    _incident_event(context, written)


def _register_key(context: ApplyContext, facts: Facts) -> None:
    """Read the key once, so that the records redact it wherever a node's words quote it."""
    with contextlib.suppress(ReconcilerError):
        read_key(ApplyContext(context.deployment, facts, context.transports))


def _deep_left(request: Converge, before: Plan, result: ApplyResult, failed: _Finding) -> frozenset[str]:
    """The nodes a requested deep verify has not read yet: their verify had not run when the
    round ended (the node that reported was read whole)."""
    if not request.deep_verify:
        return frozenset()
    verified = {action.node for action, _, _ in result.done if action.step is Step.VERIFY}
    planned = {action.node for action in before.actions if action.step is Step.VERIFY}
    return frozenset(planned - verified - {failed.cause.node})


def _hint_again(first: _Finding, again: _Finding) -> str:
    """Bytes still wrong after the new plan fetched them again, or something found only now."""
    if again.cause.node == first.cause.node and set(again.cause.files) & set(first.cause.files):
        return (
            "the new plan fetched them again and they still differ: check the node's disk and the source "
            "(the Hub, or the head's copy); run `reconciler apply` again to retry"
        )
    return "found only now, by the new plan: run `reconciler apply` again, which plans for it"


_SAVED_PLAN_HINT = (
    "a saved plan runs as it was made: make a new one (`reconciler plan --out FILE`), which fetches "
    "these files again, or run `reconciler apply`, which plans again by itself"
)


def pass_publisher(deployment: Deployment) -> Publisher:
    """A pass's state to systemd (STATUS=) and to loop-status.json, for `systemctl status` and
    `reconciler status`; a full disk or a gone notify socket must not fail the pass."""

    def publish(state: PassState | None) -> None:
        if state is not None:
            with contextlib.suppress(OSError):
                notify.status(state.line())
        with contextlib.suppress(OSError):
            write_pass(deployment, None if state is None else state.to_dict(utc_iso()))

    return publish


def observe(
    deployment: Deployment,
    transports: dict[str, Transport],
    liveness: Liveness | None,
    *,
    update_revision: bool = False,
) -> Facts:
    facts = gather(deployment, transports, update_revision=update_revision)
    return facts if liveness is None else facts.model_copy(update={"liveness": liveness})


def _plan_to_run(deployment: Deployment, facts: Facts, request: Converge) -> Plan:
    if request.saved is None:
        made = plan(
            deployment,
            facts,
            deep_verify=request.deep_verify,
            update_revision=request.update_revision,
            accept_memory_risk=request.accept_memory_risk,
            take_upgrade=request.take_upgrade,
        )
        return _only(request, made)
    saved, path = request.saved
    fresh = plan(deployment, facts, update_revision=saved.update_revision, accept_memory_risk=saved.accept_memory_risk)
    savedplan.check_current(saved, deployment, facts, path, fresh)
    return saved.plan


def _only(request: Converge, made: Plan) -> Plan:
    """Every plan of a converge limited to `request.only` (the first, and every one after it)."""
    return made if request.only is None else only_components(made, request.only)


def only_components(made: Plan, components: frozenset[Component]) -> Plan:
    """The plan's steps of these components alone; an order on a step left out is dropped with it."""
    kept = [action for action in made.actions if action.component in components]
    ids = {action.id for action in kept}
    made.actions = [replace(action, depends_on=tuple(d for d in action.depends_on if d in ids)) for action in kept]
    made.blockers = [blocker for blocker in made.blockers if blocker.component in components]
    return made


def smoke_after_start(ctx: ApplyContext, payload: Smoke) -> str:
    """The smoke step after a group start: a started group that cannot answer is not done."""
    deployment = ctx.deployment
    target = ApiTarget(api_base(deployment), read_key(ctx), deployment.serving.served_model_name, read_ca(ctx))
    report = smoke.run_smoke(target, payload.checks, timeout_s=payload.timeout_s)
    if not report.ok:
        raise SmokeFailedError(
            f"smoke failed: {smoke.failure_text(report)}",
            "run `reconciler smoke` for every check; for a model that cannot answer the smoke's questions "
            "set startup.smoke: protocol (or off)",
        )
    return report.summary()


def ranks_still_running(deployment: Deployment, facts: Facts) -> list[str]:
    """Our rank containers that run, or may (on a node that does not answer), as 'name on node'."""
    found: list[str] = []
    for rank, node in deployment.ranked_nodes:
        observed = facts.nodes.get(node.name)
        name = container_name(deployment, rank)
        if observed is None or not observed.reachable:
            found.append(f"{name} on {node.name} (not answering)")
        elif any(c.name == name and c.status == "running" for c in observed.containers):
            found.append(f"{name} on {node.name}")
    return found


def hold(ctx: ApplyContext) -> None:
    """`stop`: persist the hold on the head (one small write); every converge then keeps the
    group down until `start`."""
    content = f'{{"since": "{utc_iso()}", "reason": "reconciler stop"}}\n'
    ctx.ops(ctx.deployment.head.name).write_file(StateDir(ctx.deployment.state_dir).hold, content)


def release(ctx: ApplyContext) -> None:
    """`start`: clear the hold, the crash-loop breaker and every recorded guard trip on the nodes
    that answer, and remove the held group's stopped ranks: what follows is a fresh start, not a
    restart after a failure (the failures' logs are in their incident records)."""
    ctx.ops(ctx.deployment.head.name).remove_file(StateDir(ctx.deployment.state_dir).hold)
    clear_trips(ctx, always=True)


def clear_trips(ctx: ApplyContext, *, always: bool = False) -> None:
    """A guard trip or the crash-loop breaker holds the group until the spec changes or `start`;
    an unreachable node keeps its trip (and holds the group) until it answers again. Something
    released (or `always`): the held group's stopped ranks go too."""
    layout = StateDir(ctx.deployment.state_dir)
    released = always
    for node in ctx.deployment.nodes:
        with contextlib.suppress(NodeUnreachableError, NodeCommandError):
            ops = ctx.ops(node.name)
            released = _remove_if_present(ops, layout.guard_trip) or released
    with contextlib.suppress(NodeUnreachableError, NodeCommandError):
        released = _remove_if_present(ctx.ops(ctx.deployment.head.name), layout.breaker) or released
        breaker.clear(ctx)
    if released:
        ranks.remove_stopped_ranks(ctx)


def _remove_if_present(ops: NodeOps, path: str) -> bool:
    present = ops.read_text(path)["text"] is not None
    if present:
        ops.remove_file(path)
    return present


def status(deployment: Deployment, transports: dict[str, Transport], *, probe: bool = False) -> dict[str, Any]:
    """Observed state per node, the keyless /health, and with `probe` the liveness probe too.
    Converged as the loop judges it: a restart only a reconciler upgrade asks for, which the loop
    holds for the owner, is a condition, not a pending step (`plan` shows what apply would do)."""
    facts, current = live_plan(deployment, transports, take_upgrade=deployment.loop.take_upgrades)
    nodes: dict[str, Any] = {}
    for rank, node in deployment.ranked_nodes:
        observed = facts.nodes[node.name]
        nodes[node.name] = {
            "rank": rank,
            "role": node.role,
            "reachable": observed.reachable,
            "error": observed.error,
            "mem_available_gib": round(observed.memory.available_gib, 2) if observed.memory else None,
            "containers": [{"name": c.name, "status": c.status, "exit_code": c.exit_code} for c in observed.containers],
            "guard": {
                "running": observed.guard.running,
                "trip": observed.guard.trip.model_dump() if observed.guard.trip else None,
            },
            "hold": observed.hold.model_dump() if observed.hold else None,
            "host": observed.host.model_dump(),
            "host_changes": _host_changes(deployment, facts, node.name),
            "components": _components(current, node.name),
            "pending_steps": {name: len(steps) for name, steps in _pending_steps(current, node.name).items()},
        }
    pending = [{"id": a.id, "cause": a.cause} for a in current.actions]
    conditions = [*current.notes, *(f"{b.node}: {b.message}" for b in current.blockers)]
    return {
        "deployment": deployment.name,
        "loop": read_status(deployment),
        "api": api_base(deployment),
        "tls_fingerprint": _tls_fingerprint(deployment, facts),
        "health": health_code(deployment, ca=_status_ca(deployment, facts, transports)),
        "liveness": _liveness(deployment, facts, transports) if probe else None,
        "converged": not current.has_changes and not current.blockers,
        "nodes": nodes,
        "pending": pending,
        "conditions": conditions,
        "summary": current.summary(),
        "last_incident": incidents.last_incident(deployment),
        # The last two group starts that became ready, phase by phase (oldest first).
        "starts": starts.read_starts(starts.starts_path(deployment.state_dir))[-2:],
    }


def _host_changes(deployment: Deployment, facts: Facts, node: str) -> list[str]:
    """What changed under the node's running rank since it started (a kernel or driver update
    that a restart of the group would bring in)."""
    running = [c for c in ranks.owned_containers(deployment, facts, node) if c.status == "running"]
    host = facts.nodes[node].host
    return [f"{change} since {c.name} started" for c in running for change in ranks.host_changes(c, host)]


def _tls_fingerprint(deployment: Deployment, facts: Facts) -> str | None:
    """The SHA-256 fingerprint of the front's certificate, for clients that pin it."""
    tls = facts.nodes[deployment.head.name].tls
    return tls.fingerprint if deployment.api.tls is not None and tls is not None else None


def _status_ca(deployment: Deployment, facts: Facts, transports: dict[str, Transport]) -> str | None:
    try:
        return read_ca(ApplyContext(deployment, facts, transports))
    except ReconcilerError:
        return None  # no certificate yet: /health then has no answer over https, which status shows


def _liveness(deployment: Deployment, facts: Facts, transports: dict[str, Transport]) -> dict[str, Any]:
    problem = probe_liveness(ApplyContext(deployment, facts, transports))
    return {"ok": problem is None, "detail": problem or "keyed one-token completion answered"}


def _components(current: Plan, node: str) -> dict[str, str]:
    """Per component on a node, in one phrase: in sync, blocked, or the FIRST step still to run
    (the one the deployment waits on) and how many follow."""
    states: dict[str, str] = {ok.component: f"in sync: {ok.reason}" for ok in current.in_sync if ok.node == node}
    states |= {blocker.component: f"blocked: {blocker.message}" for blocker in current.blockers if blocker.node == node}
    for component, steps in _pending_steps(current, node).items():
        first = steps[0]
        more = f" (+{len(steps) - 1} more step{'s' if len(steps) > 2 else ''})" if len(steps) > 1 else ""
        states[component] = f"pending: {first.summary} (because {first.cause}){more}"
    return states


def _pending_steps(current: Plan, node: str) -> dict[str, list[Action]]:
    steps: dict[str, list[Action]] = {}
    for action in current.actions:
        if action.node == node:
            steps.setdefault(action.component, []).append(action)
    return steps


def container_logs(
    deployment: Deployment, transports: dict[str, Transport], rank: int, *, tail: int, follow: bool
) -> Iterator[bytes]:
    node = dict(deployment.ranked_nodes)[rank]
    name = container_name(deployment, rank)
    container = find_container(transports[node.name].docker(), name)
    if container is None:
        raise ReconcilerError(f"{node.name}: no container {name}", "run `reconciler status`")
    if follow:
        yield from container.logs(stream=True, follow=True, tail=tail)
    else:
        yield container.logs(tail=tail)


def guard_log(
    deployment: Deployment, transports: dict[str, Transport], node: str, *, tail: int, follow: bool
) -> Iterator[str]:
    """The guard's log on a node; with `follow`, new lines as they are written (polled)."""
    path = StateDir(deployment.state_dir).guard_log  # the node expands `~` itself
    seen = 0
    while True:
        text = NodeOps(transports[node], None).read_text(path)["text"]
        lines = (text or "").splitlines()
        fresh = lines[-tail:] if seen == 0 else lines[seen:]
        seen = len(lines)
        yield "".join(f"{line}\n" for line in fresh)
        if not follow:
            return
        time.sleep(2)
