"""The loop's Prometheus metrics: each value after scripted passes, events and probes, the
exposition Prometheus reads, bounded label sets, and the endpoint's key beyond loopback."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from reconciler import __version__
from reconciler.facts.memory import GuardTrip
from reconciler.facts.node import Facts, Hold, NodeFacts
from reconciler.metrics import LoopMetrics, trigger_kind
from reconciler.metricsserver import MetricsServer, is_loopback
from reconciler.plan import Plan, plan
from reconciler.spec import Deployment
from tests.scenarios import converged_facts, empty_facts, reference_deployment, with_node

HEAD, WORKER = "spark-head", "spark-worker"
NOW = 1_800_000_000.0


@pytest.fixture
def deployment() -> Deployment:
    return reference_deployment()


@pytest.fixture
def metrics(deployment: Deployment) -> LoopMetrics:
    return LoopMetrics(deployment)


def value(metrics: LoopMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def converged_pass(
    metrics: LoopMetrics, deployment: Deployment, reasons: list[str], facts: Facts | None = None
) -> Plan:
    facts = facts or converged_facts(deployment)
    after = plan(deployment, facts)
    metrics.pass_ended(reasons, 1.5, after, facts, NOW)
    return after


def test_a_converged_pass_is_counted_by_trigger_and_result_and_timed(
    metrics: LoopMetrics, deployment: Deployment
) -> None:
    after = converged_pass(metrics, deployment, ["resync"])
    assert not after.has_changes
    assert not after.blockers
    assert value(metrics, "spark_reconciler_reconcile_total", trigger="resync", result="converged") == 1
    assert value(metrics, "spark_reconciler_reconcile_time_seconds_count", result="converged") == 1
    assert value(metrics, "spark_reconciler_reconcile_time_seconds_sum", result="converged") == 1.5
    assert value(metrics, "spark_reconciler_last_converged_timestamp_seconds") == NOW
    assert value(metrics, "spark_reconciler_converged") == 1
    assert value(metrics, "spark_reconciler_reconcile_errors_total") == 0
    for node in (HEAD, WORKER):
        assert value(metrics, "spark_reconciler_node_up", node=node) == 1
        assert value(metrics, "spark_reconciler_drift", component="ranks", node=node) == 0
        assert value(metrics, "spark_reconciler_pending_actions", component="checkpoint", node=node) == 0


def test_a_pass_that_leaves_work_shows_drift_and_pending_steps_per_component_and_node(
    metrics: LoopMetrics, deployment: Deployment
) -> None:
    facts = empty_facts()
    after = plan(deployment, facts)
    metrics.pass_ended(["start"], 30.0, after, facts, NOW)
    assert value(metrics, "spark_reconciler_reconcile_total", trigger="start", result="not_converged") == 1
    assert value(metrics, "spark_reconciler_converged") == 0
    assert value(metrics, "spark_reconciler_last_converged_timestamp_seconds") == 0
    downloads = sum(1 for a in after.actions if a.component == "checkpoint" and a.node == HEAD)
    assert value(metrics, "spark_reconciler_pending_actions", component="checkpoint", node=HEAD) == downloads > 0
    assert value(metrics, "spark_reconciler_drift", component="ranks", node=WORKER) == 1
    assert value(metrics, "spark_reconciler_drift", component="pi", node=WORKER) == 0
    # A later converged pass clears what the earlier one left.
    converged_pass(metrics, deployment, ["resync"])
    assert value(metrics, "spark_reconciler_pending_actions", component="checkpoint", node=HEAD) == 0
    assert value(metrics, "spark_reconciler_drift", component="ranks", node=WORKER) == 0


def test_a_failed_pass_counts_an_error_and_keeps_the_last_converged_time(
    metrics: LoopMetrics, deployment: Deployment
) -> None:
    converged_pass(metrics, deployment, ["start"])
    metrics.pass_failed(["spark-worker: dsv41-r1 die"], 4.0, NOW + 60)
    assert value(metrics, "spark_reconciler_reconcile_errors_total") == 1
    assert value(metrics, "spark_reconciler_reconcile_total", trigger="container_event", result="failed") == 1
    assert value(metrics, "spark_reconciler_last_converged_timestamp_seconds") == NOW
    assert value(metrics, "spark_reconciler_last_pass_timestamp_seconds") == NOW + 60
    assert value(metrics, "spark_reconciler_converged") == 0


def test_an_unreachable_node_is_down_and_reports_no_memory(metrics: LoopMetrics, deployment: Deployment) -> None:
    facts = converged_facts(deployment)
    facts = facts.model_copy(update={"nodes": {**facts.nodes, WORKER: NodeFacts(reachable=False, error="timed out")}})
    converged_pass(metrics, deployment, ["resync"], facts)
    assert value(metrics, "spark_reconciler_node_up", node=WORKER) == 0
    assert value(metrics, "spark_reconciler_node_memory_available_bytes", node=WORKER) is None
    head_memory = facts.nodes[HEAD].memory
    assert head_memory is not None
    expected = head_memory.available_kib * 1024
    assert value(metrics, "spark_reconciler_node_memory_available_bytes", node=HEAD) == expected


def test_a_guard_trip_is_counted_once_however_many_passes_see_it(metrics: LoopMetrics, deployment: Deployment) -> None:
    base = converged_facts(deployment)
    trip = GuardTrip(at="2026-12-04T10:00:00Z", mem_available_gib=0.4, floor_gib=0.5)
    guard = base.nodes[WORKER].guard.model_copy(update={"trip": trip})
    tripped = with_node(base, WORKER, guard=guard)
    for _ in range(3):
        converged_pass(metrics, deployment, ["resync"], tripped)
    assert value(metrics, "spark_reconciler_guard_trips_total", node=WORKER) == 1
    assert value(metrics, "spark_reconciler_guard_tripped", node=WORKER) == 1
    assert value(metrics, "spark_reconciler_group_held", reason="guard_trip") == 1
    again = guard.model_copy(update={"trip": trip.model_copy(update={"at": "2026-12-04T11:00:00Z"})})
    converged_pass(metrics, deployment, ["resync"], with_node(base, WORKER, guard=again))
    assert value(metrics, "spark_reconciler_guard_trips_total", node=WORKER) == 2
    converged_pass(metrics, deployment, ["resync"], base)
    assert value(metrics, "spark_reconciler_guard_tripped", node=WORKER) == 0
    assert value(metrics, "spark_reconciler_group_held", reason="guard_trip") == 0


def test_a_stop_holds_the_group_as_stopped(metrics: LoopMetrics, deployment: Deployment) -> None:
    held = with_node(converged_facts(deployment), HEAD, hold=Hold(since="2026-12-04T10:00:00Z", reason="stop"))
    after = converged_pass(metrics, deployment, ["resync"], held)
    assert value(metrics, "spark_reconciler_group_held", reason="stopped") == 1
    assert value(metrics, "spark_reconciler_group_held", reason="crash_loop") == 0
    result = "held" if after.held else "not_converged" if after.has_changes else "converged"
    assert value(metrics, "spark_reconciler_reconcile_total", trigger="resync", result=result) == 1


@pytest.mark.parametrize(
    ("reasons", "kind"),
    [
        (["resync"], "resync"),
        (["start"], "start"),
        (["spec file changed", "resync"], "spec"),
        (["spark-head: dsv41-r0 die", "liveness probe failed"], "liveness"),
        (["spark-worker: dsv41-r1 oom"], "container_event"),
        (["stopping"], "other"),
        ([], "other"),
    ],
)
def test_a_pass_s_reasons_become_one_bounded_trigger(reasons: list[str], kind: str) -> None:
    assert trigger_kind(reasons) == kind


@pytest.mark.parametrize(
    ("event", "cause"),
    [
        ({"cause": "dsv41-r1 on spark-worker: exited with code 137"}, "rank_exit"),
        ({"cause": "liveness: 3 one-token completions failed in a row (timeout)"}, "liveness"),
        ({"cause": "dsv41-r1 on spark-worker: spark-worker rebooted since it started (boot id a -> b)"}, "reboot"),
        ({"cause": "resuming the group restart: it did not finish"}, "unfinished_start"),
        ({"cause": "group restart: dsv41-r0 on spark-head: config changed", "planned": True}, "planned"),
    ],
)
def test_group_restarts_are_counted_by_a_bounded_cause(
    metrics: LoopMetrics, event: dict[str, object], cause: str
) -> None:
    metrics.on_event({"kind": "restart", **event})
    assert value(metrics, "spark_reconciler_group_restarts_total", cause=cause) == 1
    others = {"planned", "rank_exit", "liveness", "reboot", "unfinished_start"} - {cause}
    assert all(value(metrics, "spark_reconciler_group_restarts_total", cause=other) == 0 for other in others)


def test_trips_incidents_starts_and_checkpoint_bytes_come_from_the_event_lines(metrics: LoopMetrics) -> None:
    metrics.on_event({"kind": "step", "step": "ranks.hold-crash-loop", "outcome": "failed"})
    metrics.on_event({"kind": "step", "step": "ranks.hold-crash-loop", "outcome": "done"})
    metrics.on_event({"kind": "incident", "incident": "rank exit"})
    metrics.on_event({"kind": "incident", "incident": "something new"})
    start = {"kind": "start", "cause_kind": "planned", "ready_s": 662.0, "phases": {"engine_load": 640.5, "smoke": 12}}
    metrics.on_event(start)
    metrics.on_event(
        {"kind": "progress", "step": "checkpoint.copy@spark-worker", "node": WORKER, "done": 5, "total": 9}
    )
    metrics.on_event({"kind": "progress", "step": "checkpoint.copy@elsewhere", "node": "elsewhere", "done": 1})
    metrics.on_event({"kind": "progress", "step": "image.pull@spark-head", "node": HEAD, "done": 1, "total": 2})
    assert value(metrics, "spark_reconciler_breaker_trips_total") == 1
    assert value(metrics, "spark_reconciler_incidents_total", kind="rank_exit") == 1
    assert value(metrics, "spark_reconciler_incidents_total", kind="other") == 1
    assert value(metrics, "spark_reconciler_group_starts_total", cause="planned") == 1
    assert value(metrics, "spark_reconciler_start_ready_seconds") == 662.0
    assert value(metrics, "spark_reconciler_start_phase_seconds", phase="engine_load") == 640.5
    assert value(metrics, "spark_reconciler_checkpoint_done_bytes", node=WORKER, phase="copy") == 5
    assert value(metrics, "spark_reconciler_checkpoint_size_bytes", node=WORKER, phase="copy") == 9
    assert value(metrics, "spark_reconciler_checkpoint_done_bytes", node="elsewhere", phase="copy") is None
    # The next start replaces the phases of the last one.
    metrics.on_event({"kind": "start", "cause_kind": "start", "ready_s": 30, "phases": {"smoke": 3}})
    assert value(metrics, "spark_reconciler_start_phase_seconds", phase="engine_load") is None


def test_probes_count_by_result_and_time_their_answer(metrics: LoopMetrics) -> None:
    metrics.probed(True, 0.2, 0)
    metrics.probed(False, 3.0, 1)
    assert value(metrics, "spark_reconciler_probe_total", probe="liveness", result="success") == 1
    assert value(metrics, "spark_reconciler_probe_total", probe="liveness", result="failure") == 1
    assert value(metrics, "spark_reconciler_probe_success", probe="liveness") == 0
    assert value(metrics, "spark_reconciler_probe_duration_seconds_count", probe="liveness") == 2
    assert value(metrics, "spark_reconciler_liveness_consecutive_failures") == 1


def exposition(metrics: LoopMetrics) -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.registry).decode()


def test_names_follow_prometheus_rules_and_label_sets_stay_bounded(
    metrics: LoopMetrics, deployment: Deployment
) -> None:
    facts = converged_facts(deployment)
    after = converged_pass(metrics, deployment, ["resync"], facts)
    before = exposition(metrics).count("\n")
    # Free text never becomes a label: a thousand distinct causes and triggers add no series.
    for number in range(1000):
        metrics.on_event({"kind": "restart", "cause": f"dsv41-r1 on spark-worker: exit {number}"})
        metrics.on_event({"kind": "incident", "incident": f"kind {number}"})
        metrics.pass_ended([f"spark-worker: container-{number} die", f"reason {number}"], 1.0, after, facts, NOW)
    assert exposition(metrics).count("\n") == before
    families = list(text_string_to_metric_families(exposition(metrics)))
    assert families
    build = next(family for family in families if family.name == "spark_reconciler_build_info")
    assert build.samples[0].labels["version"] == __version__
    for family in families:
        assert family.name.startswith("spark_reconciler_"), family.name
        if family.type == "counter":
            assert all(sample.name.endswith(("_total", "_created")) for sample in family.samples), family.name
        if family.type == "histogram":
            assert family.name.endswith("_seconds"), family.name


# ---- the endpoint ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def served(metrics: LoopMetrics, request: pytest.FixtureRequest) -> Iterator[tuple[MetricsServer, int]]:
    port = free_port()
    server = MetricsServer(f"{request.param}:{port}", metrics.registry, lambda: "sk-the-key")
    try:
        yield server, port
    finally:
        server.close()


def fetch(port: int, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode()


@pytest.mark.parametrize("served", ["127.0.0.1"], indirect=True)
def test_on_loopback_the_metrics_answer_anyone_on_the_machine(served: tuple[MetricsServer, int]) -> None:
    server, port = served
    assert not server.keyed
    code, body = fetch(port)
    assert code == 200
    assert "spark_reconciler_build_info" in body


@pytest.mark.parametrize("served", ["0.0.0.0"], indirect=True)
def test_beyond_loopback_the_metrics_answer_only_the_api_key(served: tuple[MetricsServer, int]) -> None:
    server, port = served
    assert server.keyed
    assert fetch(port)[0] == 401
    assert fetch(port, {"Authorization": "Bearer sk-wrong"})[0] == 401
    assert fetch(port, {"Authorization": "Basic sk-the-key"})[0] == 401
    code, body = fetch(port, {"Authorization": "Bearer sk-the-key"})
    assert code == 200
    assert "spark_reconciler_reconcile_errors_total" in body
    assert "sk-the-key" not in body


def test_no_key_readable_yet_lets_nobody_in(metrics: LoopMetrics) -> None:
    port = free_port()
    server = MetricsServer(f"0.0.0.0:{port}", metrics.registry, lambda: None)
    try:
        assert fetch(port, {"Authorization": "Bearer "})[0] == 401
        assert fetch(port, {"Authorization": "Bearer None"})[0] == 401
    finally:
        server.close()


def test_a_taken_port_is_an_os_error_the_loop_reports(metrics: LoopMetrics) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match="in use"):
            MetricsServer(f"127.0.0.1:{port}", metrics.registry, lambda: None)


@pytest.mark.parametrize(
    ("host", "loopback"), [("127.0.0.1", True), ("::1", True), ("0.0.0.0", False), ("10.0.0.1", False)]
)
def test_what_counts_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_checkpoint_bytes_describe_the_step_under_way_and_end_with_the_pass(
    metrics: LoopMetrics, deployment: Deployment
) -> None:
    metrics.on_event(
        {"kind": "progress", "step": "checkpoint.download@spark-head", "node": HEAD, "done": 7, "total": 9}
    )
    assert value(metrics, "spark_reconciler_checkpoint_done_bytes", node=HEAD, phase="download") == 7
    converged_pass(metrics, deployment, ["resync"])
    assert value(metrics, "spark_reconciler_checkpoint_done_bytes", node=HEAD, phase="download") is None
    assert value(metrics, "spark_reconciler_checkpoint_size_bytes", node=HEAD, phase="download") is None


def test_a_node_the_spec_no_longer_has_loses_its_series(metrics: LoopMetrics, deployment: Deployment) -> None:
    facts = converged_facts(deployment)
    after = converged_pass(metrics, deployment, ["resync"], facts)
    assert value(metrics, "spark_reconciler_guard_trips_total", node=WORKER) == 0, "from 0: a first trip increases"
    renamed = deployment.nodes[1].model_copy(update={"name": "spark-other"})
    metrics.deployment_changed(deployment.model_copy(update={"nodes": [deployment.head, renamed]}))
    metrics.pass_ended(["spec file changed"], 1.0, after, facts, NOW)
    assert value(metrics, "spark_reconciler_node_up", node=WORKER) is None
    assert value(metrics, "spark_reconciler_drift", component="ranks", node=WORKER) is None
    assert value(metrics, "spark_reconciler_node_up", node="spark-other") == 0
    assert value(metrics, "spark_reconciler_node_up", node=HEAD) == 1


def test_the_liveness_count_follows_the_loop_after_a_pass(metrics: LoopMetrics) -> None:
    metrics.probed(False, 1.0, 2)
    metrics.liveness_now(0)  # the pass that restarted the group starts the count afresh
    assert value(metrics, "spark_reconciler_liveness_consecutive_failures") == 0


def test_every_trigger_and_result_is_counted_from_zero(metrics: LoopMetrics) -> None:
    for trigger in ("spec", "liveness", "container_event", "start", "resync", "other"):
        for result in ("converged", "not_converged", "held", "blocked", "failed"):
            assert value(metrics, "spark_reconciler_reconcile_total", trigger=trigger, result=result) == 0
