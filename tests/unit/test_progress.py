"""Progress of a pass: counters, rate and ETA, their text, throttling, and where they are shown.

A clock is handed in everywhere, so the throttles are tested with exact times, not with sleeps.
"""

from __future__ import annotations

import io
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from reconciler import commands, redact
from reconciler.actions import Action, Pull, action
from reconciler.components.image import Layers
from reconciler.components.rsync import rsync_counter
from reconciler.execution import PUBLISH_INTERVAL_S, Progress
from reconciler.loopstatus import LoopStatus, read_status, render, status_path, write_pass, write_status
from reconciler.nodeside import common as nodeside_common
from reconciler.progress import (
    PREFIX,
    Counter,
    PassState,
    Rate,
    StepState,
    Throttle,
    describe,
    eta_s,
    human_duration,
    parse_line,
    printable_line,
)
from reconciler.spec import Deployment
from tests.scenarios import reference_deployment
from tests.unit.test_secrets import NotifySocket

SECRET = "hf_progressSecretToken1234567890"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def download_action() -> Action:
    return action(Pull(ref="img@sha256:1"), "spark-head", "create", "pull img", "test")


# ---- counters and their structured lines -------------------------------------------------------


def test_a_node_meters_structured_line_reads_back_as_its_counts(capsys: pytest.CaptureFixture[str]) -> None:
    meter = nodeside_common.Meter("download", 100, 12)
    meter.add(41, name="model-00003-of-00006.safetensors")
    meter.file_done()
    meter.file_done()
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith(PREFIX)
    assert parse_line(line) == Counter("download", 41, 100, 2, 12, "model-00003-of-00006.safetensors")
    assert parse_line(PREFIX + '{"what":"hash","done":0}') == Counter("hash", 0)


def test_the_node_side_programs_spell_the_heads_prefix() -> None:
    assert nodeside_common.PROGRESS_PREFIX == PREFIX


@pytest.mark.parametrize(
    "line",
    [
        "downloading model-00001: 41%",
        PREFIX + "{not json",
        PREFIX + "[1, 2]",
        PREFIX + '{"done": 5}',
        PREFIX + '{"what": "", "done": 5}',
        PREFIX + '{"what": "hash"}',
        PREFIX + '{"what": "hash", "done": -1}',
        PREFIX + '{"what": "hash", "done": true}',
        PREFIX + '{"what": "hash", "done": 1.5}',
        PREFIX + '{"what": "hash", "done": 1, "total": "10"}',
        PREFIX + '{"what": "hash", "done": 1, "name": 7}',
    ],
)
def test_anything_but_a_well_formed_counter_is_no_progress(line: str) -> None:
    assert parse_line(line) is None


def test_a_counters_text_from_a_node_loses_control_characters_and_escapes() -> None:
    counter = parse_line(PREFIX + json.dumps({"what": "down\x1b[31mload", "done": 1, "name": "a\nb\rc\x07"}))
    assert counter == Counter("download", 1, name="a b c")


def test_a_log_line_shows_only_its_last_redraw_printable_and_cut() -> None:
    assert printable_line("Loading: 10%\rLoading: 55%\r\n") == "Loading: 55%"
    assert printable_line("\x1b[32mINFO\x1b[0m ready") == "INFO ready"
    assert printable_line("x" * 300, limit=10) == "x" * 9 + "…"


# ---- rate, ETA and text ------------------------------------------------------------------------


def test_the_rate_spans_the_window_and_forgets_older_samples() -> None:
    rate = Rate(window_s=10)
    rate.add(0, 0)
    assert rate.per_s() is None, "one sample is no rate"
    for second in range(1, 31):
        # 100 B/s for 20 s, then 1000 B/s: after 10 s more only the new rate is in the window.
        rate.add(second, second * 100 if second <= 20 else 2000 + (second - 20) * 1000)
    assert rate.per_s() == pytest.approx(1000, rel=0.1)


def test_a_count_that_goes_down_starts_the_rate_afresh() -> None:
    rate = Rate()
    rate.add(0, 0)
    rate.add(10, 5000)
    rate.add(11, 100)
    assert rate.per_s() is None
    rate.add(12, 600)
    assert rate.per_s() == 500


def test_eta_needs_a_total_and_a_moving_rate() -> None:
    assert eta_s(40, 100, 2.0) == 30
    assert eta_s(40, None, 2.0) is None
    assert eta_s(40, 100, None) is None
    assert eta_s(40, 100, 0.0) is None
    assert eta_s(150, 100, 2.0) == 0


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0, "0s"), (45.4, "45s"), (89, "89s"), (300, "5m"), (3599, "60m"), (3600, "1h00m"), (3 * 3600 + 330, "3h05m")],
)
def test_durations_are_as_precise_as_a_remaining_time_deserves(seconds: float, shown: str) -> None:
    assert human_duration(seconds) == shown
    assert human_duration(5 * 86400) == "5d"


def test_a_counter_reads_as_percent_of_total_rate_eta_and_file() -> None:
    counter = Counter("download", 41 * 10**8, 10**10, 2, 12, "model-00003.safetensors")
    shown = describe(counter, 2e7)
    assert shown == "download 41% of 10.0 GB, 20.0 MB/s, ETA 5m, file 3/12 model-00003.safetensors"
    assert describe(Counter("hash", 5 * 10**6, None, 3, 3), None) == "hash 5.0 MB, 3/3 files"
    assert describe(Counter("pull", 0, None, 1, 9, unit="layer"), None) == "pull 0 B, 1/9 layers"


def test_a_step_reads_as_step_n_of_m_with_its_progress_and_detail() -> None:
    step = StepState(3, 12, "checkpoint.download@spark-head", "checkpoint on spark-head: download " + "x" * 80, "h", "")
    assert step.text() == f"step 3/12 checkpoint.download@spark-head (checkpoint on spark-head: download {'x' * 20}…)"
    step.count(0, Counter("download", 0, 1000))
    step.count(10, Counter("download", 410, 1000))
    step.detail = "r0| loading"
    assert step.text().endswith(": download 41% of 1.0 kB, 41 B/s, ETA 14s; r0| loading")


def test_the_pass_reads_as_its_phase_until_a_step_runs() -> None:
    state = PassState(by="reconcile loop pass", pid=1, started_at="t0", phase="gathering facts")
    assert state.line() == "pass in progress: gathering facts"
    state.active.append(StepState(1, 2, "image.pull@a", "image on a: pull", "a", "t1"))
    assert state.line() == "pass in progress: step 1/2 image.pull@a (image on a: pull)"


def test_a_throttle_lets_the_first_event_through_then_one_per_interval() -> None:
    throttle = Throttle(2.0)
    assert [throttle.due("k", t) for t in (0, 1, 1.9, 2.0, 3, 4.5)] == [True, False, False, True, False, True]
    assert throttle.due("other", 4.6)


# ---- what Progress shows and publishes ---------------------------------------------------------


class Published:
    def __init__(self) -> None:
        self.states: list[dict[str, Any] | None] = []

    def __call__(self, state: PassState | None) -> None:
        self.states.append(None if state is None else json.loads(json.dumps(state.to_dict("now"))))

    def lines(self) -> list[str]:
        return [state["line"] for state in self.states if state is not None]


def run_download(progress: Progress, clock: Clock, seconds: int, step_s: float = 0.5) -> None:
    """A step whose work reports 1 MB every step_s until `seconds` have passed."""
    report = progress.reporter()
    for tick in range(int(seconds / step_s) + 1):
        clock.now = 1000.0 + tick * step_s
        report(Counter("download", tick * 10**6, 100 * 10**6, 0, 1, "model.safetensors"))


def test_without_a_terminal_byte_work_is_a_line_every_few_seconds() -> None:
    out, clock = io.StringIO(), Clock()
    progress = Progress(out, tty=False, clock=clock)
    with progress.step(3, 12, download_action()):
        run_download(progress, clock, seconds=20)
    lines = out.getvalue().splitlines()
    assert len(lines) == 5, "t = 0, 5, 10, 15, 20 s"
    assert all("\r" not in line and line.startswith("    spark-head: download ") for line in lines)
    assert lines[-1] == "    spark-head: download 40% of 100.0 MB, 2.0 MB/s, ETA 30s, file 1/1 model.safetensors"


def test_on_a_terminal_byte_work_is_a_bar_redrawn_in_place_and_erased_at_the_end() -> None:
    out, clock = io.StringIO(), Clock()
    progress = Progress(out, tty=True, clock=clock)
    with progress.step(1, 1, download_action()):
        run_download(progress, clock, seconds=4)
        progress.line("a line in between")
    text = out.getvalue()
    assert "\n" not in text.replace("a line in between\n", "")
    assert text.count("\r    spark-head: [") == 10, "one redraw per half second, and one after the line"
    assert "\r    spark-head: [#" + "." * 23 + "] download 8% of 100.0 MB, 2.0 MB/s, ETA 46s" in text
    assert "\r\x1b[Ka line in between\n" in text, "the bar is erased before a line"
    assert text.endswith("\r\x1b[K"), "and when the step ends"


def test_a_pass_is_published_at_every_step_start_and_end_and_every_few_seconds_within() -> None:
    clock, published = Clock(), Published()
    progress = Progress(io.StringIO(), tty=False, clock=clock)
    with progress.publishing("reconciler apply", published):
        progress.phase("gathering facts")
        with progress.step(3, 12, download_action()):
            run_download(progress, clock, seconds=10)
    lines = published.lines()
    assert lines[:2] == ["pass in progress: starting", "pass in progress: gathering facts"]
    assert lines[2] == "pass in progress: step 3/12 image.pull@spark-head (image on spark-head: pull img)"
    within = [line for line in lines if "download " in line]
    assert len(within) == int(10 / PUBLISH_INTERVAL_S) + 1
    assert len(set(within)) == len(within), "each one says something new"
    assert published.states[-1] is None, "the end of the pass is published too"
    assert lines[-1] == "pass in progress: gathering facts", "the step's end"


def test_the_published_state_carries_the_step_and_its_bytes() -> None:
    clock, published = Clock(), Published()
    progress = Progress(io.StringIO(), tty=False, clock=clock)
    with progress.publishing("reconcile loop pass", published), progress.step(3, 12, download_action()):
        run_download(progress, clock, seconds=10)
        state = published.states[-1]
    assert state is not None
    assert state["by"] == "reconcile loop pass"
    assert (state["steps"], state["finished"]) == (12, 0)
    [step] = state["active"]
    assert (step["step"], step["steps"], step["action"], step["node"]) == (3, 12, "image.pull@spark-head", "spark-head")
    assert step["bytes"] == {
        "what": "download",
        "done": 20 * 10**6,
        "total": 100 * 10**6,
        "rate_bps": 2 * 10**6,
        "eta_s": 40,
        "files_done": 0,
        "files": 1,
        "file": "model.safetensors",
    }


def test_a_nodes_structured_lines_are_counted_and_its_other_lines_shown() -> None:
    out, clock = io.StringIO(), Clock()
    progress = Progress(out, tty=False, clock=clock)
    with progress.step(1, 1, download_action()) as step:
        sink = progress.sink("spark-worker")
        sink(PREFIX + '{"what":"hash","done":5,"total":10,"files_done":1,"files":2}')
        sink("resuming model-00001 at byte 5")
    assert step.counter == Counter("hash", 5, 10, 1, 2)
    assert PREFIX not in out.getvalue()
    assert "    spark-worker: hash 50% of 10 B, 1/2 files\n" in out.getvalue()
    assert "    spark-worker: resuming model-00001 at byte 5\n" in out.getvalue()


def test_a_reporter_keeps_its_step_when_another_thread_calls_it() -> None:
    progress = Progress(io.StringIO(), tty=False)
    with progress.step(1, 1, download_action()) as step:
        report = progress.reporter()
        reader = threading.Thread(target=report, args=(Counter("copy", 7),))
        reader.start()
        reader.join()
    assert step.counter == Counter("copy", 7)


def test_the_readiness_detail_is_published_with_the_step() -> None:
    published = Published()
    progress = Progress(io.StringIO(), tty=False)
    with progress.publishing("reconciler apply", published), progress.step(1, 1, download_action()):
        progress.note("waiting 5 s for /v1/models; r0| Model loading")
    assert published.lines()[-2].endswith(": waiting 5 s for /v1/models; r0| Model loading")


# ---- the status file -----------------------------------------------------------------------------


@pytest.fixture
def deployment(tmp_path: Path) -> Deployment:
    return reference_deployment().model_copy(update={"state_dir": str(tmp_path / "state")})


def test_the_loop_and_the_pass_each_replace_only_their_own_entries(deployment: Deployment) -> None:
    write_status(deployment, LoopStatus(condition="converged"))
    write_pass(deployment, {"pid": os.getpid(), "line": "pass in progress: step 1/2 x"})
    write_status(deployment, LoopStatus(condition="converging: 2 to add"))
    loaded = json.loads(status_path(deployment).read_text(encoding="utf-8"))
    assert loaded["condition"] == "converging: 2 to add"
    assert loaded["pass"]["line"] == "pass in progress: step 1/2 x"
    write_pass(deployment, None)
    assert read_status(deployment) == {**loaded, "pass": None}


def test_a_pass_whose_process_is_gone_is_not_in_progress(deployment: Deployment) -> None:
    write_pass(deployment, {"pid": 2**22 + 12345, "line": "pass in progress: step 1/2 x"})
    assert read_status(deployment) == {"pass": None}


def test_status_shows_the_pass_in_progress_and_no_loop_line_without_a_loop() -> None:
    pass_line = "pass in progress: step 3/12 checkpoint.download@spark-head (…): download 41% of 3.0 GB"
    shown = render({"pass": {"line": pass_line, "by": "reconciler apply", "updated": "2025-01-31T12:00:00Z"}})
    assert shown == [f"  {pass_line} (reconciler apply, updated 2025-01-31T12:00:00Z)"]
    looping = render({"condition": "converged", "last_pass": "t", "spec_error": None, "pass": None})
    assert looping == ["  loop: converged (last pass t)"]


def test_a_converge_publishes_its_pass_to_systemd_and_the_status_file(
    deployment: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notify_socket = NotifySocket(tmp_path)
    monkeypatch.setenv("NOTIFY_SOCKET", notify_socket.path)
    redact.register(SECRET)
    seen: list[dict[str, Any] | None] = []
    publish = commands.pass_publisher(deployment)

    def publish_and_read(state: PassState | None) -> None:
        publish(state)
        seen.append(read_status(deployment))

    progress = Progress(io.StringIO(), tty=False)
    with progress.publishing("reconciler apply", publish_and_read), progress.step(1, 2, download_action()):
        progress.note(f"r0| token {SECRET}")
    statuses = [message for message in notify_socket.messages() if message.startswith("STATUS=")]
    assert statuses[0] == "STATUS=pass in progress: starting"
    assert "STATUS=pass in progress: step 1/2 image.pull@spark-head (image on spark-head: pull img)" in statuses
    assert all(SECRET[:8] not in message for message in statuses)
    in_progress = [status["pass"] for status in seen if status and status.get("pass")]
    assert in_progress[0]["by"] == "reconciler apply"
    assert any(current["active"] and current["active"][0]["step"] == 1 for current in in_progress)
    assert SECRET[:8] not in status_path(deployment).read_text(encoding="utf-8")
    assert seen[-1] == {"pass": None}


# ---- sources of counters -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "size", "counter"),
    [
        ("     21,659,648  43%   19.53MB/s    0:00:01  ", 30_000_000, Counter("copy", 21_659_648, 30_000_000)),
        (
            "  30,000,000  60%   20.85MB/s    0:00:01 (xfr#1, to-chk=1/3)",
            None,
            Counter("copy", 30_000_000, 50_000_000, 2, 3),
        ),
        ("  1,000  0%    0.00kB/s    0:00:00 (xfr#1, ir-chk=10/12)", None, Counter("copy", 1000, None, 2, 12)),
        ("  40  100%  1.00kB/s    0:00:00", 30, Counter("copy", 40, 40)),
    ],
)
def test_rsync_progress2_lines_are_counters_of_the_copy(line: str, size: int | None, counter: Counter) -> None:
    assert rsync_counter(line, size) == counter


def test_other_rsync_lines_are_not_progress() -> None:
    assert rsync_counter("rsync: connection unexpectedly closed", 10) is None
    assert rsync_counter("sending incremental file list", 10) is None


def test_a_pull_counts_downloaded_bytes_of_known_layers_and_finished_layers() -> None:
    layers = Layers()
    events: list[dict[str, Any]] = [
        {"status": "Pulling from tb/engine", "id": "latest"},
        {"status": "Pulling fs layer", "id": "a"},
        {"status": "Already exists", "id": "b"},
        {"status": "Downloading", "id": "a", "progressDetail": {"current": 300, "total": 1000}},
        {"status": "Pulling fs layer", "id": "c"},
        {"status": "Downloading", "id": "c", "progressDetail": {"current": 50, "total": 500}},
    ]
    assert [layers.take(event) for event in events] == [False, True, True, True, True, True]
    assert layers.counter() == Counter("pull", 350, 1500, 1, 3, unit="layer")
    layers.take({"status": "Download complete", "id": "a"})
    layers.take({"status": "Pull complete", "id": "a"})
    assert layers.counter() == Counter("pull", 1050, 1500, 2, 3, unit="layer")
