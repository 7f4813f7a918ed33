"""The event history: appended, redacted, bounded by rotation, read back in order; the steps
apply runs and the passes converge makes land in it; `reconciler events` prints it."""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path

import pytest

from reconciler import apply, redact
from reconciler.actions import Action, Pull, action
from reconciler.cli import main
from reconciler.errors import ApplyError, NodeCommandError
from reconciler.events import EventLog, read_events
from reconciler.execution import ApplyContext, Progress
from reconciler.plan import Plan
from tests.scenarios import SPEC_PATH, empty_facts, reference_deployment


def test_events_are_appended_private_redacted_and_read_back_in_order(tmp_path: Path) -> None:
    redact.register("sk-event-secret-0123456789")
    try:
        log = EventLog(tmp_path / "state" / "events.jsonl")
        log.emit("pass", trigger="spec changed", seconds=1.5, outcome="converged")
        log.emit("step", step="ranks.start", result="answered with sk-event-secret-0123456789")
    finally:
        redact.clear()
    path = tmp_path / "state" / "events.jsonl"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert "sk-event-secret" not in path.read_text()
    found = read_events(path)
    assert [event["kind"] for event in found] == ["pass", "step"]
    assert found[0]["trigger"] == "spec changed"
    assert "(redacted)" in found[1]["result"]


def test_the_history_is_rotated_and_bounded(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(path, max_bytes=400, keep=3)
    for number in range(60):
        log.emit("step", number=number, padding="x" * 40)
    files = sorted(item.name for item in tmp_path.iterdir())
    assert files == ["events.jsonl", "events.jsonl.1", "events.jsonl.2"]
    assert all(item.stat().st_size <= 400 for item in tmp_path.iterdir())
    numbers = [event["number"] for event in read_events(path)]
    assert numbers == sorted(numbers), "oldest first across the rotated files"
    assert numbers[-1] == 59
    assert numbers[0] > 0, "the oldest went"


def test_a_line_that_is_no_event_is_left_out_and_since_filters(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(
        '{"at": "2026-12-01T00:00:00Z", "kind": "pass"}\n'
        "not json\n"
        '{"kind": "no time"}\n'
        '[1, 2]\n{"at": "2026-12-03T00:00:00Z", "kind": "step"}\n{"at": "2026-12-03T00:0'
    )
    assert [event["kind"] for event in read_events(path)] == ["pass", "step"]
    from reconciler.clock import parse_utc_iso

    since = parse_utc_iso("2026-12-02T00:00:00Z")
    assert [event["kind"] for event in read_events(path, since=since)] == ["step"]


def test_a_history_that_cannot_be_written_loses_the_line_not_the_pass(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("a file where the state dir should be")
    EventLog(blocked / "events.jsonl").emit("pass", outcome="converged")  # no error
    EventLog(None).emit("pass")


def test_every_step_apply_runs_is_an_event_done_or_failed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def pull(_ctx: ApplyContext, act: Action) -> str:
        if act.node == "b":
            raise NodeCommandError("manifest unknown", "check image.ref")
        return "pulled"

    monkeypatch.setattr(apply, "executor_for", lambda _action: pull)
    path = tmp_path / "events.jsonl"
    ctx = ApplyContext(reference_deployment(), empty_facts(), {}, Progress(io.StringIO()), events=EventLog(path))
    first = action(Pull(ref="img@sha256:1"), "a", "create", "pull on a", "the spec's image")
    second = action(Pull(ref="img@sha256:1"), "b", "create", "pull on b", "the spec's image", (first.id,))
    with pytest.raises(ApplyError):
        apply.apply_plan(ctx, Plan("dsv41", [], [first, second]))
    steps = [event for event in read_events(path) if event["kind"] == "step"]
    assert [(e["node"], e["step"], e["outcome"]) for e in steps] == [
        ("a", "image.pull", "done"),
        ("b", "image.pull", "failed"),
    ]
    assert steps[0]["cause"] == "the spec's image"
    assert steps[1]["error"] == "manifest unknown"
    assert isinstance(steps[0]["seconds"], float)


def test_the_events_command_prints_the_history_since_an_age(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    from reconciler.events import history_path

    path = history_path(reference_deployment().state_dir)
    path.parent.mkdir(parents=True)
    old = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 7200))
    path.write_text(json.dumps({"at": old, "kind": "pass", "outcome": "converged"}) + "\n")
    EventLog(path).emit("restart", cause="dsv41-r1 on spark-worker: exited with code 1")
    assert main(["events", "--spec", str(SPEC_PATH), "--since", "1h", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [event["kind"] for event in shown["events"]] == ["restart"]
    assert main(["events", "--spec", str(SPEC_PATH)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[1].split()[1] == "restart"
    assert "cause=dsv41-r1 on spark-worker: exited with code 1" in lines[1]


@pytest.mark.parametrize("text", ["1h", "30m", "90s", "7d", "2026-12-03T10:00:00Z"])
def test_since_takes_an_age_or_a_time(text: str) -> None:
    from reconciler.cli.parser import since

    assert 0 < since(text) <= time.time()


@pytest.mark.parametrize("text", ["", "h", "-1h", "1y", "yesterday", "9999999h", "2026-13-40T00:00:00Z"])
def test_since_refuses_anything_else(text: str) -> None:
    from reconciler.cli.parser import since

    with pytest.raises(argparse.ArgumentTypeError):
        since(text)


def test_a_scripts_events_file_gets_the_same_lines_and_the_progress(tmp_path: Path) -> None:
    from reconciler.commands import _with_progress_events
    from reconciler.progress import Counter, PassState, StepState

    history, script = tmp_path / "events.jsonl", tmp_path / "script.jsonl"
    log = EventLog(history, also=script)
    published: list[object] = []
    publish = _with_progress_events(published.append, log)
    step = StepState(2, 5, "checkpoint.download-x@spark-head", "download", "spark-head", "2026-12-04T00:00:00Z")
    step.count(0.0, Counter("download", 100, 1000))
    step.count(1.0, Counter("download", 300, 1000))
    publish(PassState(by="reconciler apply", pid=1, started_at="2026-12-04T00:00:00Z", active=[step]))
    publish(None)
    log.emit("pass", outcome="converged")
    assert len(published) == 2, "the pass state still reaches its publisher"
    shown = read_events(script)
    assert [event["kind"] for event in shown] == ["progress", "pass"]
    assert (shown[0]["what"], shown[0]["done"], shown[0]["total"], shown[0]["rate_bps"], shown[0]["eta_s"]) == (
        "download",
        300,
        1000,
        200,
        4,
    )
    assert [event["kind"] for event in read_events(history)] == ["pass"], "the history keeps no progress"


def test_apply_refuses_an_events_file_it_cannot_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocked = tmp_path / "no-such-dir" / "events.jsonl"
    assert main(["apply", "--spec", str(SPEC_PATH), "--events", str(blocked), "--yes"]) == 1
    assert f"cannot write the events to {blocked}" in capsys.readouterr().err


def test_a_step_s_event_carries_the_bytes_it_moved(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from reconciler.progress import Counter

    def pull(ctx: ApplyContext, _act: Action) -> str:
        ctx.progress.reporter()(Counter("pull", 5_000, 9_000))
        ctx.progress.reporter()(Counter("pull", 9_000, 9_000))
        return "pulled"

    path = tmp_path / "events.jsonl"
    ctx = ApplyContext(reference_deployment(), empty_facts(), {}, Progress(io.StringIO()), events=EventLog(path))
    pulled = action(Pull(ref="img@sha256:1"), "a", "create", "pull on a", "the spec's image")
    quiet = action(Pull(ref="img@sha256:2"), "b", "create", "pull on b", "the spec's image", (pulled.id,))
    monkeypatch.setattr(apply, "executor_for", lambda act: pull if act.node == "a" else lambda _c, _a: "nothing")
    apply.apply_plan(ctx, Plan("dsv41", [], [pulled, quiet]))
    steps = [event for event in read_events(path) if event["kind"] == "step"]
    assert steps[0]["bytes"] == 9_000
    assert "bytes" not in steps[1], "a step that counted nothing claims no bytes"
    assert [span[0].id for span in ctx.spans] == [pulled.id, quiet.id]


def test_progress_events_say_how_long_a_step_has_been_quiet(tmp_path: Path) -> None:
    from reconciler.commands import _with_progress_events
    from reconciler.progress import PassState, StepState

    script = tmp_path / "script.jsonl"
    seen: list[dict[str, object]] = []
    log = EventLog(None, also=script, listener=seen.append)
    publish = _with_progress_events(lambda _state: None, log)
    step = StepState(7, 9, "ranks.wait-ready@spark-head", "wait", "spark-head", "2026-12-04T00:00:00Z")
    step.tell("r0| loading weights")
    step.said_at -= 42  # the engine has said nothing for 42 s
    publish(PassState(by="reconciler apply", pid=1, started_at="2026-12-04T00:00:00Z", active=[step]))
    (shown,) = read_events(script)
    assert shown["kind"] == "progress"
    assert shown["detail"] == "r0| loading weights"
    assert shown["quiet_s"] >= 42
    assert seen == [shown], "the listener sees the same event"
    step.tell("r0| loading weights")
    assert step.quiet_s() >= 42, "the same line again is not news"
    step.tell("r0| ready")
    assert step.quiet_s() < 1


def test_a_listener_that_fails_loses_nothing_of_the_history(tmp_path: Path) -> None:
    def broken(_event: dict[str, object]) -> None:
        raise RuntimeError("a bug in the metrics")

    path = tmp_path / "events.jsonl"
    EventLog(path, listener=broken).emit("pass", outcome="converged")
    assert [event["outcome"] for event in read_events(path)] == ["converged"]
