"""Group starts timed phase by phase: from the steps a converge ran, kept, and shown by status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconciler.actions import Action, StartRank, Step
from reconciler.cli.observe import render_status
from reconciler.components.ranks import REBOOTED, RESUMING
from reconciler.facts.node import Facts
from reconciler.plan import plan
from reconciler.record import replace
from reconciler.starts import KEEP, duration_text, keep_start, read_starts, restart_cause, start_record, summary
from tests.scenarios import empty_facts, reference_deployment


def first_start_actions() -> list[Action]:
    return list(plan(reference_deployment(), empty_facts()).actions)


def timed(actions: list[Action], seconds: dict[Step, tuple[float, float]]) -> list[tuple[Action, float, float]]:
    """Each action of a timed step, spanning (start, end); the same step on two nodes overlaps."""
    return [(action, *seconds[action.step]) for action in actions if action.step in seconds]


FIRST_START = {
    Step.PULL: (0.0, 50.0),
    Step.DOWNLOAD: (0.0, 400.0),
    Step.VERIFY: (100.0, 420.0),
    Step.COPY: (120.0, 430.0),
    Step.START_RANK: (430.0, 432.0),
    Step.WAIT_READY: (432.0, 1090.0),
    Step.SMOKE: (1090.0, 1102.0),
}


def test_a_first_start_records_each_phase_and_ready_after_the_first_rank_start() -> None:
    record = start_record(timed(first_start_actions(), FIRST_START))
    assert record is not None
    assert record["cause_kind"] == "start"
    assert record["ready_s"] == 660.0
    assert record["total_s"] == 1102.0
    assert record["phases"] == {
        "checkpoint_download": 400.0,
        "checkpoint_verify": 320.0,
        "checkpoint_copy": 310.0,
        "image_pull": 50.0,
        "container_start": 2.0,
        "engine_load": 658.0,
        "smoke": 12.0,
    }


def test_steps_that_never_became_ready_record_no_start() -> None:
    unready: dict[Step, tuple[float, float]] = {
        step: span for step, span in FIRST_START.items() if step not in {Step.WAIT_READY, Step.SMOKE}
    }
    assert start_record(timed(first_start_actions(), unready)) is None
    assert start_record([]) is None


def test_a_start_answering_a_failure_is_recorded_with_that_failure_s_kind() -> None:
    actions = first_start_actions()
    start = next(action for action in actions if action.step is Step.START_RANK)
    assert isinstance(start.payload, StartRank)
    failed = replace(start, payload=replace(start.payload, unplanned="liveness: 3 one-token completions failed"))
    spans = [(failed, 0.0, 1.0), *timed([a for a in actions if a.step is Step.WAIT_READY], {Step.WAIT_READY: (1, 9)})]
    record = start_record(spans)
    assert record is not None
    assert record["cause_kind"] == "liveness"
    replaced = replace(start, verb="replace")
    record = start_record([(replaced, 0.0, 1.0), *spans[1:]])
    assert record is not None
    assert record["cause_kind"] == "planned"


def test_records_are_kept_newest_last_and_bounded(tmp_path: Path) -> None:
    path = tmp_path / "starts.json"
    for number in range(KEEP + 5):
        at = f"2026-12-04T10:{number:02d}:00Z"
        keep_start(path, {"at": at, "cause_kind": "start", "ready_s": number, "phases": {"smoke": 1}})
    kept = read_starts(path)
    assert len(kept) == KEEP
    assert kept[-1]["ready_s"] == KEEP + 4


def test_a_damaged_or_foreign_file_reads_as_no_history(tmp_path: Path) -> None:
    path = tmp_path / "starts.json"
    for content in [
        "{",
        "[1, 2]",
        json.dumps([{"at": 1}]),
        json.dumps([{"at": "t", "ready_s": 1, "phases": {"a": "x"}}]),
    ]:
        path.write_text(content, encoding="utf-8")
        assert read_starts(path) == []
    assert read_starts(tmp_path / "absent.json") == []
    path.write_bytes(b"[" + b" " * (2 * 1024 * 1024) + b"]")
    assert read_starts(path) == []


def test_status_shows_the_last_start_beside_the_one_before() -> None:
    previous = {"at": "2026-12-03T10:00:00Z", "ready_s": 648.0, "phases": {"engine_load": 640.0}}
    last = {"at": "2026-12-04T10:00:00Z", "ready_s": 662.4, "phases": {"engine_load": 650.0, "smoke": 12.0}}
    line = summary([previous, last])
    assert line == "ready 11m02s after start (engine_load 10m50s, smoke 12s) at 2026-12-04T10:00:00Z; previous 10m48s"
    assert summary([]) is None
    assert "previous" not in (summary([last]) or "")
    report = {
        "deployment": "dsv41",
        "converged": True,
        "nodes": {},
        "api": "https://x:8000",
        "health": 200,
        "conditions": [],
        "starts": [previous, last],
    }
    assert f"last start: {line}" in render_status(report)


def test_durations_read_as_people_write_them() -> None:
    assert [duration_text(s) for s in (0.4, 48, 60, 662, 3599.6, 3900)] == [
        "0s",
        "48s",
        "1m00s",
        "11m02s",
        "1h00m",
        "1h05m",
    ]


def test_a_restart_whose_first_action_is_a_stop_carries_the_failure_it_answers() -> None:
    from reconciler.actions import StopRank

    facts = converged_with_rank1_exited()
    actions = list(plan(reference_deployment(), facts).actions)
    stop = next(action for action in actions if action.step is Step.STOP_RANK)
    assert isinstance(stop.payload, StopRank)
    assert stop.payload.unplanned is not None
    spans = timed(actions, {Step.STOP_RANK: (0, 10), Step.START_RANK: (10, 12), Step.WAIT_READY: (12, 80)})
    record = start_record(spans)
    assert record is not None
    assert record["cause_kind"] == "rank_exit"
    assert record["phases"]["stop"] == 10.0


def converged_with_rank1_exited() -> Facts:
    from tests.scenarios import converged_facts, with_container

    return with_container(converged_facts(), "spark-worker", status="exited", exit_code=137)


@pytest.mark.parametrize(
    ("cause", "kind"),
    [
        (
            f"{RESUMING} (dsv41-r1 on spark-worker: spark-worker {REBOOTED}): it did not finish",
            "unfinished_start",
        ),
        ("dsv41-r1 on spark-worker: spark-worker rebooted since it started (boot id a -> b)", "reboot"),
        ("liveness: 3 one-token completions failed in a row (timeout)", "liveness"),
        ("dsv41-r0 on spark-head: exited with code 1", "rank_exit"),
    ],
)
def test_the_kind_of_a_restart_s_cause(cause: str, kind: str) -> None:
    assert restart_cause(cause, planned=False) == kind
    assert restart_cause(cause, planned=True) == "planned"


@pytest.mark.parametrize(
    "record",
    [
        {"at": "2026-12-04T10:00:00Z", "ready_s": "Infinity", "phases": {}},
        {"at": "2026-12-04T10:00:00Z", "ready_s": True, "phases": {}},
        {"at": "2026-12-04T10:00:00Z", "ready_s": 1e308, "phases": {}},
        {"at": "2026-12-04T10:00:00Z", "ready_s": 5, "phases": {"\x1b[2Jwiped": 1}},
        {"at": "\x1b[2J2026", "ready_s": 5, "phases": {"smoke": 1}},
        {"at": "2026-12-04T10:00:00Z", "ready_s": 5, "phases": {"smoke": -1}},
    ],
)
def test_a_hand_edited_record_is_left_out_not_shown(tmp_path: Path, record: dict[str, object]) -> None:
    path = tmp_path / "starts.json"
    good = {"at": "2026-12-04T09:00:00Z", "ready_s": 5, "phases": {"smoke": 1}}
    text = json.dumps([good, record]).replace('"Infinity"', "Infinity")
    path.write_text(text, encoding="utf-8")
    assert read_starts(path) == [good]
