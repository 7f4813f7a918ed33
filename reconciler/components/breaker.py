"""The crash-loop breaker: a group that keeps failing is held, not restarted forever.

Every unplanned group restart (a rank exited or was killed, the liveness probe failed) is
recorded on the head as it begins. When the group needs one more while `loop.max_restarts`
of them already began within `loop.restart_window_s`, the plan holds the group instead,
like a memory-guard trip: the running ranks are stopped (kept for `reconciler logs`) and the
trip is recorded with the restarts' times and the cause, until the spec changes or
`reconciler start`. Planned restarts (a spec, revision or image change) are never counted:
they are the owner's decisions, not failures.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from reconciler.actions import Action, TripBreaker, runs
from reconciler.clock import parse_utc_iso, utc_iso
from reconciler.facts.node import BreakerTrip, Facts, GroupRestart
from reconciler.nodeside.statedir import StateDir
from reconciler.redact import redact
from reconciler.spec import Deployment

if TYPE_CHECKING:
    from reconciler.execution import ApplyContext

# The record keeps the latest restarts only: more than any window can count.
KEPT_RESTARTS = 100


def recent_restarts(deployment: Deployment, facts: Facts) -> list[GroupRestart]:
    """The recorded unplanned restarts within the window before the facts were taken (all of
    them when the facts carry no time, as a fixture may not)."""
    restarts = facts.nodes[deployment.head.name].restarts
    now = parse_utc_iso(facts.taken_at)
    if now is None:
        return list(restarts)
    since = now - deployment.loop.restart_window_s
    return [item for item in restarts if (at := parse_utc_iso(item.at)) is None or at >= since]


def trips_now(deployment: Deployment, facts: Facts) -> list[GroupRestart] | None:
    """The restarts that make one more a crash loop, or None while one more is allowed."""
    recent = recent_restarts(deployment, facts)
    return recent if len(recent) >= deployment.loop.max_restarts else None


def window_text(seconds: int) -> str:
    return f"{seconds / 3600:g} h" if seconds >= 3600 and seconds % 360 == 0 else f"{seconds} s"


def trip_record(
    deployment: Deployment, restarts: list[GroupRestart], cause: str, since: str | None = None
) -> BreakerTrip:
    """The trip as the plan foresees it (its executor records the same, timed when it runs)."""
    loop = deployment.loop
    return BreakerTrip(
        since=since or "now",
        cause=cause,
        restarts=restarts,
        max_restarts=loop.max_restarts,
        window_s=loop.restart_window_s,
    )


def breaker_advice(trip: BreakerTrip) -> str:
    times = ", ".join(item.at for item in trip.restarts[-5:]) or "unknown"
    count = len(trip.restarts)
    counted = (
        f"{count} unplanned group restart{'' if count == 1 else 's'} within {window_text(trip.window_s)} ({times})"
    )
    return (
        f"crash loop since {trip.since}: {counted}, then {trip.cause}; ranks are held. Read the failures' "
        "records (`reconciler incidents`), fix the cause, then change the spec or run `reconciler start`"
    )


def trip_action(deployment: Deployment, restarts: list[GroupRestart], cause: str, after: tuple[str, ...]) -> Action:
    from reconciler.actions import action

    loop = deployment.loop
    payload = TripBreaker(
        cause=cause,
        restarts=[(item.at, item.cause) for item in restarts],
        max_restarts=loop.max_restarts,
        window_s=loop.restart_window_s,
    )
    summary = (
        f"hold the group: crash loop ({len(restarts)} unplanned restarts within {window_text(loop.restart_window_s)}, "
        f"max {loop.max_restarts})"
    )
    return action(payload, deployment.head.name, "run", summary, cause, after)


def record_restart(ctx: ApplyContext, cause: str) -> None:
    """Add an unplanned restart to the head's record, as it begins (the newest KEPT_RESTARTS stay)."""
    head = ctx.deployment.head.name
    path = ctx.state_dir(head).restarts
    earlier = (
        [{"at": item.at, "cause": item.cause} for item in ctx.facts.nodes[head].restarts]
        if head in ctx.facts.nodes
        else []
    )
    entries = [*earlier, {"at": utc_iso(), "cause": redact(cause)[:500]}][-KEPT_RESTARTS:]
    ctx.ops(head).write_file(path, json.dumps({"restarts": entries}, indent=1) + "\n")
    ctx.events.emit("restart", cause=cause, counted=len(entries), max_restarts=ctx.deployment.loop.max_restarts)


def _trip(ctx: ApplyContext, action: Action, trip: TripBreaker) -> str:
    del action
    head = ctx.deployment.head.name
    record = {
        "since": utc_iso(),
        "cause": redact(trip.cause)[:500],
        "restarts": [{"at": at, "cause": cause} for at, cause in trip.restarts],
        "max_restarts": trip.max_restarts,
        "window_s": trip.window_s,
    }
    ctx.ops(head).write_file(ctx.state_dir(head).breaker, json.dumps(record, indent=1) + "\n")
    return f"held: {len(trip.restarts)} unplanned restarts within {window_text(trip.window_s)}"


def clear(ctx: ApplyContext) -> None:
    """`start` or a changed spec: the trip goes, and the count starts again from nothing."""
    # `start` may come with no facts gathered: the node expands `~` itself.
    head = ctx.deployment.head.name
    layout = StateDir(ctx.deployment.state_dir)
    ctx.ops(head).remove_file(layout.breaker)
    ctx.ops(head).remove_file(layout.restarts)


EXECUTORS = (runs(TripBreaker, _trip),)
