"""Node output is untrusted: whatever a node prints, the head neither raises, nor hangs, nor grows
without bound, nor shows anything that moves the terminal's cursor or reads otherwise than it is.

Bounds are asserted by sizes, never by timings.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from reconciler import notify, redact
from reconciler.actions import Pull, action
from reconciler.errors import NodeCommandError
from reconciler.execution import Progress
from reconciler.health import _log_tails
from reconciler.loopstatus import render
from reconciler.progress import (
    MAX_COUNT,
    MAX_LINE,
    PREFIX,
    Counter,
    Rate,
    StepState,
    Throttle,
    parse_line,
    printable,
)
from reconciler.transport.base import (
    MAX_LINE_BYTES,
    MAX_STDERR_BYTES,
    CommandResult,
    LineSplitter,
    check,
    keep_tail,
    stderr_tail,
)
from reconciler.transport.local import LocalTransport
from tests.unit.test_secrets import NotifySocket

SECRET = "hf_hostileNodeOutputToken123456"
# Bidi overrides, embeddings and isolates, marks, zero-width characters, BOM, line and paragraph
# separators, a tag character: each makes a line read otherwise than it is.
INVISIBLE = [
    "\u202e",
    "\u202a",
    "\u202d",
    "\u2066",
    "\u2067",
    "\u2068",
    "\u2069",
    "\u200e",
    "\u200f",
    "\u061c",
    "\u200b",
    "\u200c",
    "\u200d",
    "\u2060",
    "\ufeff",
    "\U000e0041",
]
ESCAPES = [
    "\x1b[31m",  # colour
    "\x1b[2J\x1b[H",  # clear the screen, cursor home
    "\x1b[10A",  # cursor up
    "\x1b]0;owned\x07",  # window title, BEL-terminated
    "\x1b]8;;https://example.invalid\x1b\\",  # hyperlink, ST-terminated
    "\x1bc",  # reset the terminal
    "\x1b(0",  # line-drawing character set
    "\x9b31m",  # 8-bit CSI
    "\x1bP1$r\x1b\\",  # device control string
    "\b\b\b",
    "\x07",
]


def counter_line(**fields: object) -> str:
    return PREFIX + json.dumps(fields)


# ---- structured progress lines ----------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        PREFIX + "[" * 1500,
        PREFIX + '{"a":' * 100_000 + "1" + "}" * 100_000,
        PREFIX + '{"what":"download","done":' + "9" * 400 + ',"total":' + "9" * 401 + "}",
        PREFIX + '{"what":"download","done":' + "9" * 5000 + "}",
        counter_line(what="download", done=2**63),
        counter_line(what="download", done=1, total=10**30),
        counter_line(what="download", done=1, files_done=1, files=2**64),
        PREFIX + '{"what":"download","done":NaN}',
        PREFIX + '{"what":"download","done":1,"total":Infinity}',
        PREFIX + '{"what":"download","done":-Infinity}',
        PREFIX + '{"what":"download","done":1e400}',
        PREFIX + '{"what":"download","done":1,"name":NaN}',
        counter_line(what="download", done=False),
        counter_line(what="download", done=1, total=True),
        counter_line(what="download", done=2.0),
        counter_line(what="\x1b[31m\u202e", done=1),
        counter_line(what="download", done=1, name="x" * 1_000_000),
    ],
    ids=lambda line: line[len(PREFIX) : len(PREFIX) + 40],
)
def test_a_malformed_progress_line_is_no_progress_and_never_raises(line: str) -> None:
    assert parse_line(line) is None


def test_the_largest_count_is_accepted_and_renders() -> None:
    counter = parse_line(counter_line(what="download", done=MAX_COUNT - 1000, total=MAX_COUNT))
    assert counter == Counter("download", MAX_COUNT - 1000, MAX_COUNT)
    step = StepState(1, 1, "a", "b", "n", "t")
    step.count(0.0, Counter("download", 0, MAX_COUNT))
    step.count(1.0, counter)
    assert step.text().startswith("step 1/1 a (b): download 99% of 9223372.0 TB, 9223372.0 TB/s, ETA 0s")
    assert json.loads(json.dumps(step.to_dict()))["bytes"]["total"] == MAX_COUNT


def test_a_counter_out_of_range_from_another_source_is_ignored() -> None:
    progress = Progress(io.StringIO(), tty=False)
    pull = action(Pull(ref="img@sha256:1"), "spark-head", "create", "pull img", "test")
    with progress.step(1, 1, pull) as step:
        report = progress.reporter("spark-worker")
        report(Counter("pull", 10**400, 10**401))
        assert step.counter is None
        report(Counter("pull", 5, 10))
    assert step.counter == Counter("pull", 5, 10)


# ---- text shown anywhere ----------------------------------------------------------------------


@pytest.mark.parametrize("char", INVISIBLE, ids=lambda char: f"U+{ord(char):04X}")
def test_invisible_and_reordering_characters_are_removed(char: str) -> None:
    assert printable(f"safe{char}.txt{char}") == "safe.txt"
    assert parse_line(counter_line(what=f"hash{char}", done=1, name=f"a{char}b")) == Counter("hash", 1, name="ab")


@pytest.mark.parametrize("escape", ESCAPES, ids=repr)
def test_terminal_escapes_are_removed_whole(escape: str) -> None:
    assert printable(f"INFO{escape} ready{escape}") == "INFO ready"


def test_node_text_is_one_line_cut_with_an_ellipsis_and_redacted() -> None:
    redact.register(SECRET)
    assert printable("Traceback:\n  File x\r\n\tboom") == "Traceback:   File x   boom"
    assert printable("y" * 1000) == "y" * (MAX_LINE - 1) + "…"
    assert printable("z" * 10, limit=5) == "zzzz…"
    # A secret split by an invisible character is still one once that is gone.
    assert printable(f"token {SECRET[:10]}\u200b{SECRET[10:]}") == "token (redacted)"


def test_a_huge_text_is_looked_at_only_as_far_as_it_is_shown() -> None:
    shown = printable("\u202e" * 10_000_000 + "visible")
    assert shown == "…", "the start is all invisible; the rest is never scanned"


def test_a_nodes_other_lines_are_shown_printable_one_line_and_cut() -> None:
    out = io.StringIO()
    progress = Progress(out, tty=False)
    sink = progress.sink("spark-worker")
    sink("\x1b[2J\x1b]0;owned\x07WARNING\u202e: disk " + "w" * 1_000_000)
    sink("\x1b[31m\u200b\x1b[0m")  # nothing printable: nothing shown
    written = out.getvalue()
    assert written == "    spark-worker: WARNING: disk " + "w" * (MAX_LINE - len("WARNING: disk ") - 1) + "…\n"


def test_a_line_of_ours_keeps_its_lines_and_indentation_but_no_escapes() -> None:
    out = io.StringIO()
    Progress(out, tty=False).line("    worker: failed: \x1b[31mboom\x1b[0m\n      r0| \u202elast line")
    assert out.getvalue() == "    worker: failed: boom\n      r0| last line\n"


def test_the_ranks_log_tails_in_a_failure_are_printable() -> None:
    class Rank:
        def logs(self, tail: int) -> bytes:
            assert tail == 40
            return b"\x1b[31mERROR\x1b[0m engine died\n\x1b]0;owned\x07\xe2\x80\xae done\n"

    assert _log_tails({"dsv41-r0": Rank()}) == "r0| ERROR engine died\nr0|  done"


def test_status_shows_a_multi_line_node_error_as_one_printable_line_each() -> None:
    loop = {
        "condition": "failed 1x: spark-worker: ops.run failed: Traceback\n  File x\n\x1b[2JValueError\u202e",
        "last_pass": "t\nx",
        "spec_error": "line 3\n\x1b]0;owned\x07bad",
        "pass": {"line": "pass in progress: step 1/2 x: \x1b[31mhash\u200b", "by": "apply\n", "updated": "u\x1b[A"},
    }
    assert render(loop) == [
        "  loop: failed 1x: spark-worker: ops.run failed: Traceback   File x ValueError (last pass t x)",
        "  loop: spec error: line 3 bad",
        "  pass in progress: step 1/2 x: hash (apply, updated u)",
    ]


def test_status_is_one_printable_line_for_systemd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    notify_socket = NotifySocket(tmp_path)
    monkeypatch.setenv("NOTIFY_SOCKET", notify_socket.path)
    notify.status("converging\n\x1b[2J\u202edownload" + "d" * 1000)
    notify.ready("ready\nMAINPID=1")
    sent = notify_socket.messages()
    assert sent[0] == "STATUS=converging download" + "d" * (400 - len("converging download") - 1) + "…"
    assert sent[1] == "READY=1\nSTATUS=ready MAINPID=1", "a node's text never adds a field"


# ---- memory bounds ----------------------------------------------------------------------------


def test_the_rate_keeps_a_bounded_number_of_samples_however_often_a_source_reports() -> None:
    rate = Rate(window_s=20)
    for tick in range(200_000):  # 10,000 reports a second for 20 s, 1 kB/s
        rate.add(tick / 10_000, tick // 10)
    assert len(rate._samples) <= 203
    assert rate.per_s() == pytest.approx(1000, rel=0.01)


def test_a_throttle_remembers_only_its_most_recent_keys() -> None:
    throttle = Throttle(10, keys=3)
    assert all(throttle.due(key, 0) for key in "abcd")
    assert not throttle.due("d", 1), "a recent key is still throttled"
    assert throttle.due("a", 1), "the oldest key was forgotten"
    assert len(throttle._last) == 3


def test_distinct_lines_from_a_node_keep_a_bounded_number_of_rate_limits() -> None:
    progress = Progress(io.StringIO(), tty=False)
    sink = progress.sink("spark-worker")
    for number in range(10_000):
        sink(f"line{number}: text")
    assert len(progress._lines._last) <= 256


def test_a_line_without_an_end_is_cut_at_the_limit_and_the_next_line_arrives_whole() -> None:
    lines: list[str] = []
    splitter = LineSplitter(lines.append)
    chunk = b"x" * 4096
    for _ in range(256):  # 1 MiB, no newline
        splitter.feed(chunk)
        assert len(splitter._pending) <= MAX_LINE_BYTES
    assert lines == ["x" * MAX_LINE_BYTES]
    splitter.feed(b"still the same line\nnext line\n")
    assert lines == ["x" * MAX_LINE_BYTES, "next line"]


def test_lines_split_on_both_line_ends_across_chunks() -> None:
    lines: list[str] = []
    splitter = LineSplitter(lines.append)
    for data in (b"ab", b"c\nd", b"\r\n", b"10%\r20%\r", b"\n\n", b"tail"):
        splitter.feed(data)
    assert lines == ["abc", "d", "10%", "20%"]
    assert bytes(splitter._pending) == b"tail"


def test_a_sink_that_raises_is_reported_once_and_the_lines_after_it_still_arrive(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines: list[str] = []

    def sink(line: str) -> None:
        if line.startswith("bad"):
            raise ValueError(f"cannot show {line}\x1b[2J")
        lines.append(line)

    splitter = LineSplitter(sink)
    splitter.feed(b"one\nbad 1\ntwo\nbad 2\nthree\n")
    assert lines == ["one", "two", "three"]
    assert capsys.readouterr().err == (
        "reconciler: a command's output line could not be shown (ValueError: cannot show bad 1); "
        "the later ones still are\n"
    )


def test_a_local_command_runs_to_its_end_when_every_line_makes_the_sink_raise() -> None:
    def sink(line: str) -> None:
        raise RuntimeError(f"a bug in a sink, at {line}")

    # Far more than a pipe holds: a reader that died would leave the command blocked on its stderr.
    script = "import sys\nfor n in range(20000): sys.stderr.write(f'line {n} ' + 'x' * 50 + '\\n')\nprint('done')"
    result = LocalTransport("local").run([sys.executable, "-c", script], timeout=120, on_line=sink)
    assert (result.returncode, result.text) == (0, "done\n")
    assert result.stderr.endswith(b"line 19999 " + b"x" * 50 + b"\n")  # the tail, for messages


def test_stderr_kept_for_messages_is_only_its_tail() -> None:
    kept = bytearray()
    for _ in range(100):
        keep_tail(kept, b"x" * 10_000)
    keep_tail(kept, b"the end")
    assert len(kept) == MAX_STDERR_BYTES
    assert kept.endswith(b"the end")


def test_a_command_writing_stderr_without_end_is_kept_bounded() -> None:
    lines: list[str] = []
    chatty = [sys.executable, "-c", "import sys\nfor _ in range(64): sys.stderr.write('e' * 65536)\nprint('x')"]
    result = LocalTransport("spark-head").run(chatty, on_line=lines.append)
    assert result.returncode == 0
    assert len(result.stderr) <= MAX_STDERR_BYTES


def test_a_failed_commands_stderr_reaches_the_message_printable_and_redacted() -> None:
    redact.register(SECRET)
    hostile = CommandResult(3, b"", f"ok\n\x1b[2J\x1b]0;owned\x07token {SECRET}\u202e done\n".encode())
    with pytest.raises(NodeCommandError) as caught:
        check(hostile, "spark-worker", "probe")
    message = caught.value.message
    assert SECRET not in message
    assert not {"\x1b", "\u202e", "\x07"} & set(message)
    assert message.startswith("spark-worker: probe failed (exit 3): ok / ")
    assert stderr_tail(CommandResult(1, b"", b"\xff" * 100_000)).endswith("…")
