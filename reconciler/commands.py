"""The flows behind each command: gather, plan, apply, hold. Returns data; cli.py renders it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import docker

from reconciler.apply import ApplyResult, apply_plan
from reconciler.components import memguard
from reconciler.errors import ReconcilerError
from reconciler.execution import ApplyContext, Progress
from reconciler.facts.gather import gather
from reconciler.facts.node import Facts
from reconciler.health import health_code, probe_liveness
from reconciler.loop import read_status
from reconciler.plan import Plan, plan
from reconciler.serving import container_name
from reconciler.spec import Deployment
from reconciler.transport import Transport, close_all, connect_all
from reconciler.transport.base import run_program


@contextlib.contextmanager
def session(deployment: Deployment) -> Iterator[dict[str, Transport]]:
    """One transport per node for the whole command, closed at the end."""
    transports = connect_all(deployment)
    try:
        yield transports
    finally:
        close_all(transports)


def live_plan(
    deployment: Deployment, transports: dict[str, Transport], *, deep_verify: bool = False
) -> tuple[Facts, Plan]:
    facts = gather(deployment, transports)
    return facts, plan(deployment, facts, deep_verify=deep_verify)


@dataclass
class ApplyOutcome:
    before: Plan
    result: ApplyResult
    after: Plan


def converge(
    deployment: Deployment,
    transports: dict[str, Transport],
    progress: Progress,
    *,
    deep_verify: bool = False,
    show: Callable[[Plan], None] | None = None,
) -> ApplyOutcome:
    """Plan, show it, apply it, then plan again: the second plan shows whether it converged."""
    facts, before = live_plan(deployment, transports, deep_verify=deep_verify)
    if show is not None:
        show(before)
    if before.blockers and not before.actions:
        blocker = before.blockers[0]
        raise ReconcilerError(f"{blocker.node}: {blocker.message}", blocker.hint)
    context = ApplyContext(deployment, facts, transports, progress, deep_verify=deep_verify)
    result = apply_plan(context, before)
    _, after = live_plan(deployment, transports)
    return ApplyOutcome(before, result, after)


def hold(deployment: Deployment, transports: dict[str, Transport]) -> None:
    """Persist `stop` on the head; apply and the loop keep the group down while it exists."""
    head = deployment.head.name
    facts = gather(deployment, transports)
    context = ApplyContext(deployment, facts, transports)
    content = f'{{"since": "{time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}", "reason": "reconciler stop"}}\n'
    context.ops(head, "write_file", {"path": context.state_path(head, "hold.json"), "content": content})


def release(deployment: Deployment, transports: dict[str, Transport]) -> None:
    """`start`: clear the hold and every recorded guard trip."""
    facts = gather(deployment, transports)
    context = ApplyContext(deployment, facts, transports)
    head = deployment.head.name
    context.ops(head, "remove_file", {"path": context.state_path(head, "hold.json")})
    for node in deployment.nodes:
        if facts.nodes[node.name].reachable:
            memguard.clear_trip(context, node.name)


def status(deployment: Deployment, transports: dict[str, Transport], *, probe: bool = False) -> dict[str, Any]:
    """Observed state per node, the keyless /health, and with `probe` the liveness probe too."""
    facts, current = live_plan(deployment, transports)
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
            "components": _components(current, node.name),
        }
    pending = [{"id": a.id, "cause": a.cause} for a in current.actions]
    conditions = [*current.notes, *(f"{b.node}: {b.message}" for b in current.blockers)]
    return {
        "deployment": deployment.name,
        "loop": read_status(deployment),
        "health": health_code(deployment),
        "liveness": _liveness(deployment, facts, transports) if probe else None,
        "converged": not current.has_changes and not current.blockers,
        "nodes": nodes,
        "pending": pending,
        "conditions": conditions,
        "summary": current.summary(),
    }


def _liveness(deployment: Deployment, facts: Facts, transports: dict[str, Transport]) -> dict[str, Any]:
    problem = probe_liveness(ApplyContext(deployment, facts, transports))
    return {"ok": problem is None, "detail": problem or "keyed one-token completion answered"}


def _components(current: Plan, node: str) -> dict[str, str]:
    """Per component on a node: desired vs observed in one phrase (in sync, or what is pending)."""
    states = {item.component: f"in sync: {item.reason}" for item in current.in_sync if item.node == node}
    for action in current.actions:
        if action.node == node:
            states[action.component] = f"pending: {action.summary} (because {action.cause})"
    return states


def container_logs(
    deployment: Deployment, transports: dict[str, Transport], rank: int, *, tail: int, follow: bool
) -> Iterator[bytes]:
    node = dict(deployment.ranked_nodes)[rank]
    name = container_name(deployment, rank)
    try:
        container = transports[node.name].docker().containers.get(name)
    except docker.errors.NotFound:
        raise ReconcilerError(f"{node.name}: no container {name}", "run `reconciler status`") from None
    if follow:
        yield from container.logs(stream=True, follow=True, tail=tail)
    else:
        yield container.logs(tail=tail)


def guard_log(
    deployment: Deployment, transports: dict[str, Transport], node: str, *, tail: int, follow: bool
) -> Iterator[str]:
    """The guard's log on a node; with `follow`, new lines as they are written (polled)."""
    facts = gather(deployment, transports)
    path = ApplyContext(deployment, facts, transports).state_path(node, "memguard.log")
    seen = 0
    while True:
        text = run_program(transports[node], "ops", "read_text", {"path": path})
        lines = str(text.get("text") or "").splitlines()
        fresh = lines[-tail:] if seen == 0 else lines[seen:]
        seen = len(lines)
        yield "".join(f"{line}\n" for line in fresh)
        if not follow:
            return
        time.sleep(2)
