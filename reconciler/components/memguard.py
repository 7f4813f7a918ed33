"""The memory guard on every node.

A Spark shares one memory pool between CPU and GPU and wedges instead of OOM-killing when it
runs dry, so a small guard stops our ranks first. A trip holds the rank group (see ranks.py)
instead of letting a restart loop hit the same wall again.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

from reconciler import nodeside
from reconciler.actions import (
    Action,
    Component,
    GuardConfig,
    GuardStart,
    InSync,
    Outcome,
    RestartGuard,
    StartGuard,
    StopGuard,
    action,
    payload_data,
    runs,
)
from reconciler.facts.memory import GuardTrip
from reconciler.facts.node import Facts
from reconciler.nodeside.ops import GuardStartArgs
from reconciler.serving import LABEL_DEPLOYMENT, LABEL_OWNER, OWNER
from reconciler.spec import Deployment, expand_home

if TYPE_CHECKING:
    from reconciler.execution import ApplyContext

COMPONENT = Component.MEMGUARD
# Part of the guard's config hash: a new guard program replaces the running one.
GUARD_VERSION = 1


def guard_config_hash(deployment: Deployment) -> str:
    guard = deployment.memguard
    canonical = {
        "version": GUARD_VERSION,
        "floor_gib": guard.floor_gib,
        "interval_s": guard.interval_s,
        "deployment": deployment.name,
    }
    return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()[:16]


def plan_memguard(deployment: Deployment, facts: Facts) -> Outcome:
    outcome = Outcome()
    guard = deployment.memguard
    wanted = guard_config_hash(deployment)
    # Workers' guards start first and the head's last, the order the ranks start in.
    for _, node, observed in facts.answering([*deployment.ranked_nodes[1:], deployment.ranked_nodes[0]]):
        if observed.home is None:
            continue
        state_dir = expand_home(deployment.state_dir, observed.home)
        running = observed.guard.running
        if not guard.enabled:
            if running:
                payload = StopGuard(state_dir=state_dir)
                stop = action(payload, node.name, "remove", "stop the memory guard", "memguard.enabled is false")
                outcome.actions.append(stop)
            continue
        floor = f"floor {guard.floor_gib:g} GiB, every {guard.interval_s:g} s"
        config = guard_config(deployment)
        if not running:
            summary = f"start the memory guard ({floor})"
            start = StartGuard(state_dir=state_dir, config=config)
            outcome.actions.append(action(start, node.name, "create", summary, "guard not running"))
        elif observed.guard.config_hash != wanted:
            summary, cause = f"restart the memory guard ({floor})", "guard settings or program changed"
            restart = RestartGuard(state_dir=state_dir, config=config)
            outcome.actions.append(action(restart, node.name, "update", summary, cause))
        else:
            outcome.in_sync.append(InSync(node.name, COMPONENT, f"running ({floor})"))
    return outcome


def trips(deployment: Deployment, facts: Facts) -> list[tuple[str, GuardTrip]]:
    """Recorded guard trips, by node, in rank order."""
    return [
        (node.name, trip)
        for _, node in deployment.ranked_nodes
        if (trip := facts.nodes[node.name].guard.trip) is not None
    ]


def trip_advice(node: str, trip: GuardTrip) -> str:
    return (
        f"memory guard tripped on {node} at {trip.at} (MemAvailable {trip.mem_available_gib:.2f} GiB < "
        f"floor {trip.floor_gib:g} GiB); ranks are held. Lower serving.kv_bytes or serving.gpu_util before "
        "raising memguard.floor_gib, then change the spec or run `reconciler start`"
    )


def guard_config(deployment: Deployment) -> GuardConfig:
    guard = deployment.memguard
    return GuardConfig(
        floor_gib=guard.floor_gib,
        interval_s=guard.interval_s,
        labels=[f"{LABEL_OWNER}={OWNER}", f"{LABEL_DEPLOYMENT}={deployment.name}"],
        config_hash=guard_config_hash(deployment),
    )


def _start(ctx: ApplyContext, action: Action, guard: GuardStart) -> str:
    """Start the guard with the planned settings; the node side stops a running one first."""
    program = nodeside.source("memguard")
    args = GuardStartArgs(state_dir=guard.state_dir, program=program, config=payload_data(guard.config))
    return f"running as pid {ctx.ops(action.node).guard_start(args)}"


def _stop(ctx: ApplyContext, action: Action, guard: StopGuard) -> str:
    stopped = ctx.ops(action.node).guard_stop(guard.state_dir)
    return "stopped" if stopped else "was not running"


EXECUTORS = (runs(StartGuard, _start), runs(RestartGuard, _start), runs(StopGuard, _stop))
