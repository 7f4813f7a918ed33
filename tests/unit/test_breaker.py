"""The crash-loop breaker's decisions (pure: spec and facts in, plan out) and the incident
records' detection and files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconciler import incidents
from reconciler.actions import StartRank, StopRank, TripBreaker
from reconciler.facts.node import BreakerTrip, Facts, GroupRestart, Liveness, load_facts
from reconciler.plan import Plan, plan
from reconciler.spec import Deployment
from tests.scenarios import CONVERGED_FACTS, reference_deployment, with_container, with_node, with_serving

HEAD, WORKER = "spark-head", "spark-worker"
NOW = "2026-12-03T12:00:00Z"


def restarts(*ats: str) -> list[GroupRestart]:
    return [GroupRestart(at=at, cause="dsv41-r1 on spark-worker: exited with code 1") for at in ats]


def crashed(history: list[GroupRestart], **changes: object) -> Facts:
    """Converged facts with rank 1 exited, the head's record holding `history`."""
    facts = with_container(load_facts(CONVERGED_FACTS), WORKER, status="exited", exit_code=1)
    facts = with_node(facts, HEAD, restarts=history, **changes)
    return facts.model_copy(update={"taken_at": NOW})


def counted(result: Plan) -> list[str]:
    return [
        a.payload.unplanned
        for a in result.actions
        if isinstance(a.payload, (StopRank, StartRank)) and a.payload.unplanned is not None
    ]


def test_an_unplanned_restart_is_counted_once_by_its_first_action() -> None:
    result = plan(reference_deployment(), crashed([]))
    assert counted(result) == [
        "dsv41-r1 on spark-worker: exited with code 1 (any exit fails the group, code 0 included)"
    ]
    first = result.actions[0].payload
    assert isinstance(first, StopRank)
    assert first.unplanned is not None


def test_restarts_below_the_limit_within_the_window_still_restart() -> None:
    result = plan(reference_deployment(), crashed(restarts("2026-12-03T10:00:00Z", "2026-12-03T11:00:00Z")))
    assert any(isinstance(a.payload, StartRank) for a in result.actions)
    assert not result.held


def test_one_more_than_max_restarts_within_the_window_holds_the_group() -> None:
    history = restarts("2026-12-03T09:00:00Z", "2026-12-03T10:00:00Z", "2026-12-03T11:30:00Z")
    result = plan(reference_deployment(), crashed(history))
    steps = [type(a.payload).__name__ for a in result.actions if a.component == "ranks"]
    assert steps == ["TripBreaker", "HaltRank"], "the trip is recorded, rank 0 stopped and kept, nothing started"
    trip = result.actions[0].payload
    assert isinstance(trip, TripBreaker)
    assert [at for at, _ in trip.restarts] == [item.at for item in history]
    assert "exited with code 1" in trip.cause
    held = result.held[0]
    assert "crash loop" in held
    assert "3 unplanned group restarts within 6 h" in held
    assert "2026-12-03T11:30:00Z" in held
    assert "reconciler start" in held
    assert "reconciler incidents" in held


def test_restarts_older_than_the_window_are_not_counted() -> None:
    history = restarts("2026-12-02T09:00:00Z", "2026-12-02T10:00:00Z", "2026-12-03T11:30:00Z")
    result = plan(reference_deployment(), crashed(history))
    assert not result.held
    assert counted(result)


def test_the_limit_and_window_are_the_specs() -> None:
    deployment = reference_deployment()
    tight = deployment.model_copy(update={"loop": deployment.loop.model_copy(update={"max_restarts": 1})})
    assert plan(tight, crashed(restarts("2026-12-03T11:59:00Z"))).held
    narrow = deployment.model_copy(update={"loop": deployment.loop.model_copy(update={"restart_window_s": 60})})
    history = restarts("2026-12-03T10:00:00Z", "2026-12-03T11:00:00Z", "2026-12-03T11:30:00Z")
    assert not plan(narrow, crashed(history)).held


def test_planned_restarts_are_never_counted_nor_held() -> None:
    """A spec edit restarts the group whatever the record holds: the owner's change is no failure."""
    history = restarts("2026-12-03T09:00:00Z", "2026-12-03T10:00:00Z", "2026-12-03T11:30:00Z")
    facts = with_node(load_facts(CONVERGED_FACTS), HEAD, restarts=history).model_copy(update={"taken_at": NOW})
    edited = with_serving(reference_deployment(), max_num_seqs=8)
    result = plan(edited, facts)
    assert any(isinstance(a.payload, StartRank) for a in result.actions)
    assert not result.held
    assert counted(result) == []


def test_a_missing_container_is_a_first_start_not_a_failure() -> None:
    facts = load_facts(CONVERGED_FACTS)
    head = facts.nodes[HEAD]
    facts = with_node(facts, HEAD, containers=[c for c in head.containers if c.name != "dsv41-r0"])
    assert counted(plan(reference_deployment(), facts)) == []


def test_failed_liveness_counts_and_trips_like_an_exit() -> None:
    facts = load_facts(CONVERGED_FACTS).model_copy(
        update={"taken_at": NOW, "liveness": Liveness(failures=3, detail="POST /v1/completions timed out")}
    )
    assert counted(plan(reference_deployment(), facts))[0].startswith("liveness: 3 one-token")
    history = restarts("2026-12-03T09:00:00Z", "2026-12-03T10:00:00Z", "2026-12-03T11:30:00Z")
    held = plan(reference_deployment(), with_node(facts, HEAD, restarts=history))
    assert held.held
    assert "liveness" in held.held[0]


def test_a_recorded_trip_holds_until_released() -> None:
    trip = BreakerTrip(since="2026-12-03T11:31:00Z", cause="r1 exited", restarts=restarts("2026-12-03T11:00:00Z"))
    facts = with_node(load_facts(CONVERGED_FACTS), HEAD, breaker=trip)
    result = plan(reference_deployment(), facts)
    assert result.held
    assert "crash loop since 2026-12-03T11:31:00Z" in result.held[0]
    assert [type(a.payload).__name__ for a in result.actions if a.component == "ranks"] == ["HaltRank", "HaltRank"]


def test_an_unreadable_record_entry_is_left_out_never_a_hold_without_cause() -> None:
    from reconciler.facts.gather import _restarts

    raw = {"restarts": [{"at": "2026-12-03T11:00:00Z", "cause": "r1 exited"}, {"at": 5}, "junk", None]}
    assert [item.at for item in _restarts(raw)] == ["2026-12-03T11:00:00Z"]
    assert _restarts("not a record") == []
    assert _restarts({"restarts": "x"}) == []


# ---- incidents --------------------------------------------------------------------------------


def test_detect_names_the_failure_a_restart_answers_once_per_exit() -> None:
    deployment = reference_deployment()
    facts = crashed([])
    result = plan(deployment, facts)
    found = incidents.detect(deployment, facts, result)
    assert [(item.kind, "exited with code 1" in item.cause) for item in found] == [("rank exit", True)]
    again = incidents.detect(deployment, facts.model_copy(update={"taken_at": "2026-12-03T12:05:00Z"}), result)
    assert again[0].key == found[0].key, "the same exited container seen by a later pass is the same incident"


def test_detect_sees_a_guard_trip_and_a_breaker_hold() -> None:
    from reconciler.facts.memory import GuardFacts, GuardTrip

    deployment = reference_deployment()
    facts = crashed(restarts("2026-12-03T09:00:00Z", "2026-12-03T10:00:00Z", "2026-12-03T11:30:00Z"))
    held = incidents.detect(deployment, facts, plan(deployment, facts))
    assert [item.kind for item in held] == ["rank exit"], "the hold follows a rank exit: that is the incident"
    guard = GuardFacts(running=True, trip=GuardTrip(at="2026-12-03T11:59:00Z", mem_available_gib=0.5, floor_gib=1.0))
    tripped = with_node(load_facts(CONVERGED_FACTS), WORKER, guard=guard)
    found = incidents.detect(deployment, tripped, plan(deployment, tripped))
    assert [item.kind for item in found] == ["guard trip"]
    assert "spark-worker" in found[0].cause


def test_nothing_planned_is_no_incident() -> None:
    deployment = reference_deployment()
    facts = load_facts(CONVERGED_FACTS)
    assert incidents.detect(deployment, facts, plan(deployment, facts)) == []
    edited = with_serving(deployment, max_num_seqs=8)
    assert incidents.detect(edited, facts, plan(edited, facts)) == []


@pytest.fixture
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Deployment:
    monkeypatch.setenv("HOME", str(tmp_path))
    return reference_deployment()


def test_records_are_written_redacted_listed_and_shown(state_home: Deployment) -> None:
    from reconciler import redact

    redact.register("sk-incident-secret-1234567890")
    deployment = state_home
    facts = crashed([])
    result = plan(deployment, facts)
    found = replace_cause(incidents.detect(deployment, facts, result)[0], "r1 said sk-incident-secret-1234567890")
    lines: list[str] = []
    written = incidents.record(deployment, {}, facts, result, found, log=lines.append)
    assert written is not None
    assert "recorded" in lines[0]
    assert incidents.record(deployment, {}, facts, result, found, log=lines.append) is None, "one record per key"
    listed = incidents.list_incidents(deployment)
    assert [item.id for item in listed] == [written.id]
    incident, files = incidents.show(deployment, written.id)
    assert {"facts.json", "plan.json"} <= set(files)
    assert json.loads(files["plan.json"])["actions"], "the plan that followed"
    assert [rank["state"] for rank in incident.ranks] == ["node not connected", "node not connected"]
    everything = "".join(path.read_text() for path in incidents.incidents_dir(deployment).rglob("*") if path.is_file())
    assert "sk-incident-secret" not in everything
    assert "(redacted)" in everything
    redact.clear()


def test_records_are_bounded_in_count(state_home: Deployment, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(incidents, "MAX_INCIDENTS", 3)
    deployment = state_home
    facts = crashed([])
    result = plan(deployment, facts)
    for number in range(5):
        found = incidents.Found("liveness", f"probe {number}", f"liveness {number}")
        incidents.record(deployment, {}, facts, result, found, log=lambda _line: None)
    kept = incidents.list_incidents(deployment)
    assert len(kept) == 3
    assert {item.cause for item in kept} == {"probe 2", "probe 3", "probe 4"}


def test_show_refuses_an_unknown_or_path_like_id(state_home: Deployment) -> None:
    from reconciler.errors import ReconcilerError

    for bad in ("nope", "../etc", ""):
        with pytest.raises(ReconcilerError, match="no incident"):
            incidents.show(state_home, bad)


def replace_cause(found: incidents.Found, cause: str) -> incidents.Found:
    return incidents.Found(found.kind, cause, found.key)


def test_start_clears_the_breaker_without_gathered_facts(state_home: Deployment) -> None:
    """`start` runs before any facts are gathered: the node expands `~` in the state dir itself."""
    from reconciler.components import breaker
    from reconciler.execution import ApplyContext
    from reconciler.nodeside.statedir import StateDir
    from reconciler.transport.local import LocalTransport

    deployment = state_home
    layout = StateDir(str(Path(deployment.state_dir).expanduser()))
    Path(layout.breaker).parent.mkdir(parents=True, exist_ok=True)
    for path in (layout.breaker, layout.restarts):
        Path(path).write_text("{}")
    transports = {node.name: LocalTransport(node.name) for node in deployment.nodes}
    breaker.clear(ApplyContext(deployment, Facts(nodes={}), transports))  # type: ignore[arg-type]
    assert not Path(layout.breaker).exists()
    assert not Path(layout.restarts).exists()


def test_a_restart_that_never_finished_is_counted_so_a_start_failing_every_time_trips() -> None:
    """A start that timed out waiting for readiness leaves its ranks running and the intent
    recorded: the next pass resumes the restart, which counts like any restart nobody asked for."""
    from reconciler.facts.node import RestartIntent

    intent = RestartIntent(since="2026-12-03T11:50:00Z", cause="group restart: dsv41-r1 on spark-worker: ...")
    running = load_facts(CONVERGED_FACTS).model_copy(update={"taken_at": NOW})
    resumed = with_node(running, HEAD, restart_intent=intent)
    result = plan(reference_deployment(), resumed)
    (cause,) = counted(result)
    assert cause.startswith("resuming the group restart recorded at 2026-12-03T11:50:00Z")
    assert incidents.detect(reference_deployment(), resumed, result) == [], "its failure was recorded as it failed"
    looping = with_node(
        resumed, HEAD, restarts=restarts("2026-12-03T10:00:00Z", "2026-12-03T11:00:00Z", "2026-12-03T11:30:00Z")
    )
    held = plan(reference_deployment(), looping)
    assert any(isinstance(a.payload, TripBreaker) for a in held.actions)
    assert not [a for a in held.actions if isinstance(a.payload, StartRank)]


def test_records_mask_every_variable_whose_name_says_secret(state_home: Deployment) -> None:
    """A token in serving.extra_env was never registered with the redaction: its name masks it."""
    deployment = state_home
    facts = with_container(crashed([]), WORKER, env={"MY_SERVICE_TOKEN": "tok-unregistered-42", "PLAIN": "kept"})
    result = plan(deployment, facts)
    found = incidents.Found("rank exit", "r1 exited", "masking")
    written = incidents.record(deployment, {}, facts, result, found, log=lambda _line: None)
    assert written is not None
    _, files = incidents.show(deployment, written.id)
    assert "tok-unregistered-42" not in files["facts.json"] + files["plan.json"]
    assert '"PLAIN": "kept"' in files["facts.json"]
