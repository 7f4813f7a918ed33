"""What `reconciler run` exports to Prometheus: its passes, the deployment's drift, the nodes.

Names follow Prometheus's rules (one `spark_reconciler_` prefix, base units, `_total` on
counters, `_seconds` and `_bytes` on units) and controller-runtime's vocabulary for what a
controller does (`reconcile_total` by result, `reconcile_errors_total`, `reconcile_time_seconds`).
Every label takes values from a fixed set or from the spec's node names, so the number of series
is bounded whatever a node answers: free text (a cause, a trigger) is reduced to a kind first.

The values come from three feeds: each pass's end (the plan and facts it ended on), the event
history's lines as they are written (restarts, breaker trips, incidents, group starts, byte
progress), and each liveness probe. A fresh registry per loop keeps tests independent.
"""

from __future__ import annotations

import contextlib
import platform
import threading
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from reconciler import __version__
from reconciler.actions import Component
from reconciler.facts.node import Facts, hold_reasons
from reconciler.plan import Plan, ending
from reconciler.spec import Deployment
from reconciler.starts import restart_cause

PREFIX = "spark_reconciler"
# A pass takes a second when nothing changed and hours when a checkpoint downloads.
PASS_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, float("inf"))
# A one-token completion: milliseconds when warm, up to loop.liveness_timeout_s when not.
PROBE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, float("inf"))

TRIGGERS = ("spec", "liveness", "container_event", "start", "resync", "other")
RESULTS = ("converged", "not_converged", "held", "blocked", "failed")
# Why a group restarted: the owner's change, or the failure an unplanned restart answers.
RESTART_CAUSES = ("planned", "rank_exit", "liveness", "reboot", "unfinished_start")
HOLD_REASONS = ("stopped", "crash_loop", "guard_trip")
CHECKPOINT_PHASES = ("download", "copy", "verify")
INCIDENT_KINDS = ("guard_trip", "rank_exit", "liveness", "reboot", "failed_start", "other")


def trigger_kind(reasons: Iterable[str]) -> str:
    """One bounded label for the reasons a pass ran, the most telling first: a spec edit, failed
    probes, a container's event (`node: name die`), the loop's start, the resync timer."""
    kinds = {_one_trigger(reason) for reason in reasons}
    return next((kind for kind in TRIGGERS if kind in kinds), "other")


def _one_trigger(reason: str) -> str:
    fixed = {"spec file changed": "spec", "liveness probe failed": "liveness", "start": "start", "resync": "resync"}
    if reason in fixed:
        return fixed[reason]
    return "container_event" if reason.endswith((" die", " oom")) else "other"


def incident_kind(kind: str) -> str:
    label = kind.replace(" ", "_")
    return label if label in INCIDENT_KINDS else "other"


class LoopMetrics:
    """The loop's metrics in a registry of their own; every update is thread-safe (prometheus_client
    locks each value), and the per-pass gauges are replaced whole under one lock."""

    def __init__(self, deployment: Deployment, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.deployment = deployment
        self._lock = threading.Lock()
        self._trips_seen: dict[str, str] = {}
        # The label sets each per-pass gauge was given last (see _replace).
        self._series: dict[int, set[tuple[str, ...]]] = {}
        self._define()
        self._zero_counters()

    def _gauge(self, name: str, text: str, *labels: str) -> Gauge:
        return Gauge(f"{PREFIX}_{name}", text, list(labels), registry=self.registry)

    def _counter(self, name: str, text: str, *labels: str) -> Counter:
        return Counter(f"{PREFIX}_{name}", text, list(labels), registry=self.registry)

    def _histogram(self, name: str, text: str, buckets: tuple[float, ...], *labels: str) -> Histogram:
        return Histogram(f"{PREFIX}_{name}", text, list(labels), buckets=buckets, registry=self.registry)

    def _define(self) -> None:
        self.build = Info(f"{PREFIX}_build", "The reconciler's version and Python.", registry=self.registry)
        self.passes = self._counter("reconcile", "Passes by what set them off and how they ended.", "trigger", "result")
        self.errors = self._counter("reconcile_errors", "Passes that failed (backed off, retried).")
        self.pass_time = self._histogram("reconcile_time_seconds", "How long a pass took.", PASS_BUCKETS, "result")
        self.last_converged = self._gauge(
            "last_converged_timestamp_seconds", "When a pass last ended converged (Unix time)."
        )
        self.last_pass = self._gauge("last_pass_timestamp_seconds", "When a pass last ended (Unix time).")
        self.converged = self._gauge("converged", "1 when the last pass ended converged.")
        where = ("component", "node")
        self.pending = self._gauge("pending_actions", "Steps the last plan still had.", *where)
        self.drift = self._gauge("drift", "1 where a component differs from the spec (pending or blocked).", *where)
        self.blocked = self._gauge("blocked", "1 where a blocker keeps a component from being planned.", *where)
        self._define_group()
        self._define_nodes()

    def _define_group(self) -> None:
        self.restarts = self._counter("group_restarts", "Group restarts begun, by cause.", "cause")
        self.held = self._gauge("group_held", "1 while the group is held down, by reason.", "reason")
        self.breaker_trips = self._counter("breaker_trips", "Crash-loop breaker trips (the group held).")
        self.incidents = self._counter("incidents", "Incident records written, by kind.", "kind")
        self.probes = self._counter("probe", "Liveness probes by result.", "probe", "result")
        self.probe_ok = self._gauge("probe_success", "1 when the last probe answered.", "probe")
        self.probe_time = self._histogram("probe_duration_seconds", "How long a probe took.", PROBE_BUCKETS, "probe")
        self.probe_failures = self._gauge("liveness_consecutive_failures", "Liveness probes failed in a row.")
        self.starts = self._counter("group_starts", "Group starts that became ready, by cause.", "cause")
        self.start_phase = self._gauge("start_phase_seconds", "Each phase of the last group start.", "phase")
        self.start_ready = self._gauge("start_ready_seconds", "The last start's first rank start to ready.")

    def _define_nodes(self) -> None:
        self.node_up = self._gauge("node_up", "1 when the node answered the last pass.", "node")
        self.mem_available = self._gauge("node_memory_available_bytes", "MemAvailable at the last pass.", "node")
        self.guard_trips = self._counter("guard_trips", "Memory-guard trips seen, per node.", "node")
        self.guard_tripped = self._gauge("guard_tripped", "1 while a guard trip holds the group.", "node")
        self.guard_running = self._gauge("guard_running", "1 when the node's memory guard runs.", "node")
        self.checkpoint_done = self._gauge(
            "checkpoint_done_bytes", "Checkpoint bytes the step under way has done.", "node", "phase"
        )
        self.checkpoint_size = self._gauge(
            "checkpoint_size_bytes", "Checkpoint bytes the step under way handles in all.", "node", "phase"
        )

    def _zero_counters(self) -> None:
        """Every bounded label's series exists from the start, so `increase()` sees the first one."""
        self.build.info({"version": __version__, "python": platform.python_version()})
        for trigger in TRIGGERS:
            for result in RESULTS:
                self.passes.labels(trigger=trigger, result=result)
        for cause in RESTART_CAUSES:
            self.restarts.labels(cause=cause)
        self.starts.labels(cause="start")
        for kind in INCIDENT_KINDS:
            self.incidents.labels(kind=kind)
        for result in ("success", "failure"):
            self.probes.labels(probe="liveness", result=result)
        for reason in HOLD_REASONS:
            self.held.labels(reason=reason).set(0)

    # ---- a pass's end ------------------------------------------------------------------------

    def pass_ended(self, reasons: list[str], seconds: float, after: Plan, facts: Facts, now: float) -> None:
        result = ending(after)
        self.passes.labels(trigger=trigger_kind(reasons), result=result).inc()
        self.pass_time.labels(result=result).observe(seconds)
        self.last_pass.set(now)
        # As `status` says it: nothing left to do and nothing blocked (a held group is converged
        # to its hold; the hold has its own series).
        converged = not after.has_changes and not after.blockers
        self.converged.set(1 if converged else 0)
        if converged:
            self.last_converged.set(now)
        with self._lock:
            self._drift(after)
            self._nodes(facts)
            self._holds(facts)
            self._step_done()

    def pass_failed(self, reasons: list[str], seconds: float, now: float) -> None:
        self.passes.labels(trigger=trigger_kind(reasons), result="failed").inc()
        self.pass_time.labels(result="failed").observe(seconds)
        self.errors.inc()
        self.last_pass.set(now)
        self.converged.set(0)
        with self._lock:
            self._step_done()

    def liveness_now(self, failures: int) -> None:
        """The loop's count of probes failed in a row, as a pass left it (a pass that acted on
        them, or restarted the group, starts the count afresh; a held group is not probed)."""
        self.probe_failures.set(failures)

    def deployment_changed(self, deployment: Deployment) -> None:
        """A new spec: per-node series of nodes it no longer has go at the next pass."""
        self.deployment = deployment

    def _node_names(self) -> list[str]:
        return [node.name for node in self.deployment.nodes]

    def _replace(self, gauge: Gauge, values: dict[tuple[str, ...], float]) -> None:
        """The gauge's series become exactly `values`: each set first, then the ones the last
        pass had and this one has not removed, so a scrape in between never misses a series."""
        for labels, value in values.items():
            gauge.labels(*labels).set(value)
        for stale in self._series.get(id(gauge), set()) - set(values):
            with contextlib.suppress(KeyError):
                gauge.remove(*stale)
        self._series[id(gauge)] = set(values)

    def _drift(self, after: Plan) -> None:
        pending: dict[tuple[str, str], int] = {}
        for action in after.actions:
            pending[(action.component, action.node)] = pending.get((action.component, action.node), 0) + 1
        blocked = {(str(blocker.component), blocker.node) for blocker in after.blockers}
        keys = [(component.value, node) for node in self._node_names() for component in Component]
        self._replace(self.pending, {key: pending.get(key, 0) for key in keys})
        self._replace(self.blocked, {key: 1 if key in blocked else 0 for key in keys})
        self._replace(self.drift, {key: 1 if key in pending or key in blocked else 0 for key in keys})

    def _nodes(self, facts: Facts) -> None:
        up: dict[tuple[str, ...], float] = {}
        memory: dict[tuple[str, ...], float] = {}
        tripped: dict[tuple[str, ...], float] = {}
        running: dict[tuple[str, ...], float] = {}
        for node in self._node_names():
            self.guard_trips.labels(node=node)  # from 0, so the first trip is an increase
            observed = facts.nodes.get(node)
            up[(node,)] = 1 if observed is not None and observed.reachable else 0
            if observed is None or not observed.reachable:
                continue
            if observed.memory is not None:
                memory[(node,)] = observed.memory.available_kib * 1024
            running[(node,)] = 1 if observed.guard.running else 0
            trip = observed.guard.trip
            tripped[(node,)] = 1 if trip is not None else 0
            if trip is not None and self._trips_seen.get(node) != trip.at:
                self._trips_seen[node] = trip.at
                self.guard_trips.labels(node=node).inc()
        for gauge, values in ((self.node_up, up), (self.mem_available, memory)):
            self._replace(gauge, values)
        for gauge, values in ((self.guard_tripped, tripped), (self.guard_running, running)):
            self._replace(gauge, values)

    def _step_done(self) -> None:
        """The checkpoint's byte gauges describe the step under way: none is, once a pass ended."""
        for gauge in (self.checkpoint_done, self.checkpoint_size):
            self._replace(gauge, {})

    def _holds(self, facts: Facts) -> None:
        held = hold_reasons(facts, self.deployment.head.name)
        for reason in HOLD_REASONS:
            self.held.labels(reason=reason).set(1 if reason in held else 0)

    # ---- the event history's lines -------------------------------------------------------------

    def on_event(self, event: dict[str, Any]) -> None:
        """One line of the event history, as it is written."""
        kind = event.get("kind")
        if kind == "restart":
            planned = bool(event.get("planned"))
            self.restarts.labels(cause=restart_cause(str(event.get("cause", "")), planned=planned)).inc()
        elif kind == "step" and event.get("step") == "ranks.hold-crash-loop" and event.get("outcome") == "done":
            self.breaker_trips.inc()
        elif kind == "incident":
            self.incidents.labels(kind=incident_kind(str(event.get("incident", "")))).inc()
        elif kind == "start":
            self._group_start(event)
        elif kind == "progress":
            self._progress(event)

    def _group_start(self, event: dict[str, Any]) -> None:
        self.starts.labels(cause=str(event.get("cause_kind", "start"))).inc()
        phases = event.get("phases")
        if isinstance(phases, dict):
            self.start_phase.clear()
            for phase, seconds in phases.items():
                if isinstance(seconds, int | float):
                    self.start_phase.labels(phase=str(phase)).set(seconds)
        ready = event.get("ready_s")
        if isinstance(ready, int | float):
            self.start_ready.set(ready)

    def _progress(self, event: dict[str, Any]) -> None:
        step, node = str(event.get("step", "")), str(event.get("node", ""))
        phase = next((name for name in CHECKPOINT_PHASES if step.startswith(f"checkpoint.{name}")), None)
        done, total = event.get("done"), event.get("total")
        if phase is None or node not in self._node_names() or not isinstance(done, int):
            return
        with self._lock:
            self._add(self.checkpoint_done, (node, phase), done)
            if isinstance(total, int):
                self._add(self.checkpoint_size, (node, phase), total)

    def _add(self, gauge: Gauge, labels: tuple[str, ...], value: float) -> None:
        """One series of a gauge `_replace` keeps, set between passes."""
        gauge.labels(*labels).set(value)
        self._series.setdefault(id(gauge), set()).add(labels)

    # ---- probes --------------------------------------------------------------------------------

    def probed(self, ok: bool, seconds: float, consecutive_failures: int) -> None:
        self.probes.labels(probe="liveness", result="success" if ok else "failure").inc()
        self.probe_ok.labels(probe="liveness").set(1 if ok else 0)
        self.probe_time.labels(probe="liveness").observe(seconds)
        self.probe_failures.set(consecutive_failures)
