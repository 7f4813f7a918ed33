"""Progress of a pass as data: byte counters, rate and ETA, the steps under way, and their text.

A first pass can take hours (a 462 GB download), so what it is doing must be visible from
anywhere: a live bar on a terminal, a line every few seconds in the journal, systemd's STATUS=
and STATE_DIR/loop-status.json. Everything that decides what those show lives here and is pure
(times are handed in); `execution.Progress` is the thin shell that writes it out.

Byte work reports `Counter`s. The node-side programs (nodeside/ops.py, nodeside/fetch.py) cannot
import this module, so they print each counter as one structured line, `PREFIX` + JSON, on
stderr; the head parses those (`parse_line`) instead of scraping text meant for people. The rate
is measured here, on the head, from the counters as they arrive, so every source (the node-side
programs, rsync, the Hub client on the head, Docker pulls) gets the same rate and ETA.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from reconciler.fsutil import human_bytes
from reconciler.redact import redact

# The node-side programs spell the same prefix (they cannot import it); a unit test keeps them equal.
PREFIX = "@progress "
# Long enough to smooth a bursty transfer, short enough to follow a rate that changes.
RATE_WINDOW_S = 20.0
# At most this many samples per window: a source may report a thousand times a second.
_RATE_BUCKETS = 100
_SHORT_SUMMARY = 56
# How much of one line of node text is shown anywhere (terminal, journal, STATUS=, status file).
MAX_LINE = 400
_MAX_NAME = 200
# A counter's line is well under this; a longer one is not progress (and never reaches the parser).
_MAX_PROGRESS_LINE = 8192
# Counts are a node's 64-bit file sizes; anything larger is no count (and would not fit a float).
MAX_COUNT = 2**63 - 1


@dataclass(frozen=True)
class Counter:
    """How far one piece of byte work is: `what` (download, hash, copy, ...), bytes done of `total`,
    files (or other `unit`s: a pull's layers) finished of `files`, and the file being worked on,
    each when known."""

    what: str
    done: int
    total: int | None = None
    files_done: int | None = None
    files: int | None = None
    name: str | None = None
    unit: str | None = None


def parse_line(line: str) -> Counter | None:
    """A node's structured progress line as a Counter; None for any other line or a malformed one.

    Node output is untrusted: a wrong type, a count out of range, NaN, a line too long or nested
    too deep is not progress, and never an exception (this runs on a transport's reader thread).
    """
    if not line.startswith(PREFIX) or len(line) > _MAX_PROGRESS_LINE:
        return None
    try:
        data = json.loads(line[len(PREFIX) :], parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    what, name, unit = data.get("what"), data.get("name"), data.get("unit")
    shown_what = _shown(what, 40) if isinstance(what, str) else None
    if shown_what is None or not all(isinstance(text, str | None) for text in (name, unit)):
        return None
    counts: dict[str, Any] = {key: data.get(key) for key in ("done", "total", "files_done", "files")}
    counter = Counter(shown_what, **counts, name=_shown(name, _MAX_NAME), unit=_shown(unit, 20))
    return counter if counter.done is not None and plausible(counter) else None


def _shown(text: str | None, limit: int) -> str | None:
    return (printable(text, limit).strip() or None) if text is not None else None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is no count")


def plausible(counter: Counter) -> bool:
    """Whether every count of `counter` is one (rsync's and Docker's numbers come from nodes too)."""
    return all(
        value is None or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT)
        for value in (counter.done, counter.total, counter.files_done, counter.files)
    )


# Terminal escapes, whole: removing the ESC alone would leave '[31m' behind. CSI (colours, cursor
# moves), the string commands (OSC: titles, hyperlinks; DCS, APC, ...) up to their terminator or
# the end of the text, and the two-character ones (ESC c resets the terminal); 7- and 8-bit forms.
_ESCAPE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]?"
)


def printable(text: str, limit: int = MAX_LINE) -> str:
    """Node-provided text as one printable line of at most `limit` characters, secrets redacted.

    Gone: terminal escapes, control characters, and the invisible format characters (bidi
    overrides and isolates such as U+202E, zero-width ones such as U+200B, U+FEFF, tags) that
    make a line read otherwise than it is; line breaks become spaces. Only the start of a huge
    text is looked at, so the work is bounded by `limit`.
    """
    scanned = text[: limit * 8]
    shown = redact(_only_printable(_ESCAPE.sub("", scanned))).rstrip()
    if len(shown) > limit or len(scanned) < len(text):
        return shown[: limit - 1].rstrip() + "…"
    return shown


def _only_printable(text: str) -> str:
    if text.isprintable():
        return text
    # Not printable: controls, format characters (bidi, zero-width), separators, surrogates,
    # private use, unassigned code points. Of those, line breaks, tabs and Unicode's other spaces
    # become a space; the rest goes.
    return "".join(char if char.isprintable() else " " for char in text if char.isprintable() or char.isspace())


def printable_line(text: str, limit: int = MAX_LINE) -> str:
    """The last redraw of a log line (a `\\r` progress bar keeps only its last state), printable,
    cut to `limit` characters."""
    last = [part for part in text.replace("\r\n", "\n").split("\r") if part.strip()]
    return printable(last[-1], limit).strip() if last else ""


class Rate:
    """Bytes per second over the last `window_s` seconds of samples; None until two samples a
    moment apart exist. A count that goes down (the work started again) starts afresh."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self._bucket_s = window_s / _RATE_BUCKETS
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, done: int) -> None:
        if self._samples and done < self._samples[-1][1]:
            self._samples.clear()
        if len(self._samples) >= 2 and now - self._samples[-2][0] < self._bucket_s:
            # Within one bucket of the sample before, the newest replaces the last: at most two
            # samples per bucket however often a source reports.
            self._samples[-1] = (now, done)
        else:
            self._samples.append((now, done))
        # Keep one sample older than the window, so the rate always spans the whole window.
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()

    def per_s(self) -> float | None:
        if len(self._samples) < 2:
            return None
        (first_t, first_done), (last_t, last_done) = self._samples[0], self._samples[-1]
        if last_t - first_t < 0.5:
            return None
        return (last_done - first_done) / (last_t - first_t)


def eta_s(done: int, total: int | None, rate: float | None) -> float | None:
    """Seconds left at the current rate; None when the total or a moving rate is unknown."""
    if total is None or rate is None or rate <= 0:
        return None
    eta = max(total - done, 0) / rate
    return eta if math.isfinite(eta) else None


def human_duration(seconds: float) -> str:
    """'45s', '12m', '3h05m', '2d': as precise as a remaining time deserves."""
    whole = round(seconds)
    if whole < 90:
        return f"{whole}s"
    if whole < 3600:
        return f"{round(whole / 60)}m"
    if whole < 48 * 3600:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d"


def describe(counter: Counter, rate: float | None) -> str:
    """'download 41% of 3.0 GB, 1.2 GB/s, ETA 5m, file 3/12 model-00003.safetensors'."""
    eta = eta_s(counter.done, counter.total, rate)
    parts = [
        f"{counter.what} {_amount(counter)}",
        f"{human_bytes(rate)}/s" if rate is not None else "",
        f"ETA {human_duration(eta)}" if eta is not None else "",
        _files(counter),
    ]
    return ", ".join(part for part in parts if part)


def _amount(counter: Counter) -> str:
    if counter.total:
        percent = min(counter.done * 100 // counter.total, 100)
        return f"{percent}% of {human_bytes(counter.total)}"
    return human_bytes(counter.done)


def _files(counter: Counter) -> str:
    """'file 3/12 NAME' while one is worked on, else '3/12 files' (done of all)."""
    if counter.files is None:
        return counter.name or ""
    done, unit = counter.files_done or 0, counter.unit or "file"
    if counter.name and done < counter.files:
        return f"{unit} {done + 1}/{counter.files} {counter.name}"
    return f"{done}/{counter.files} {unit}s"


def bar(counter: Counter, width: int = 24) -> str:
    """'[#########...............]' for a known total; nothing without one."""
    if not counter.total:
        return ""
    filled = min(counter.done * width // counter.total, width)
    return "[" + "#" * filled + "." * (width - filled) + "]"


@dataclass
class StepState:
    """One step under way: which of how many, what it is, and how far its work has come."""

    number: int
    steps: int
    action: str
    summary: str
    node: str
    started_at: str
    counter: Counter | None = None
    rate: Rate = field(default_factory=Rate)
    detail: str | None = None
    # When the step last said anything (a counter that moved, a new detail): a step long quiet
    # (an engine's load that stopped logging) shows it.
    said_at: float = field(default_factory=time.monotonic)

    def count(self, now: float, counter: Counter) -> None:
        if self.counter is not None and counter.what != self.counter.what:
            self.rate = Rate(self.rate.window_s)
        if self.counter is None or counter.done != self.counter.done:
            self.said_at = time.monotonic()
        self.counter = counter
        self.rate.add(now, counter.done)

    def tell(self, detail: str) -> None:
        if detail != self.detail:
            self.said_at = time.monotonic()
        self.detail = detail

    def quiet_s(self) -> float:
        return round(time.monotonic() - self.said_at, 1)

    def progress_text(self) -> str:
        return describe(self.counter, self.rate.per_s()) if self.counter is not None else ""

    def text(self) -> str:
        """'step 3/12 checkpoint.download@spark-head (download 41 files, …): download 41% of …'."""
        summary = self.summary if len(self.summary) <= _SHORT_SUMMARY else self.summary[: _SHORT_SUMMARY - 1] + "…"
        head = f"step {self.number}/{self.steps} {self.action} ({summary})"
        tail = [part for part in (self.progress_text(), self.detail) if part]
        return head + (": " + "; ".join(tail) if tail else "")

    def to_dict(self) -> dict[str, Any]:
        rate = self.rate.per_s()
        counter = self.counter
        progress = None
        if counter is not None:
            eta = eta_s(counter.done, counter.total, rate)
            progress = {
                "what": counter.what,
                "done": counter.done,
                "total": counter.total,
                "rate_bps": round(rate) if rate is not None else None,
                "eta_s": round(eta) if eta is not None else None,
                "files_done": counter.files_done,
                "files": counter.files,
                "file": counter.name,
            }
        return {
            "step": self.number,
            "steps": self.steps,
            "action": self.action,
            "summary": self.summary,
            "node": self.node,
            "started": self.started_at,
            "bytes": progress,
            "detail": self.detail,
            "quiet_s": self.quiet_s(),
        }


@dataclass
class PassState:
    """The pass under way, as STATUS= and loop-status.json show it."""

    by: str
    pid: int
    started_at: str
    phase: str = "starting"
    steps: int = 0
    finished: int = 0
    active: list[StepState] = field(default_factory=list)

    def line(self) -> str:
        """The one line for STATUS=, the journal and `reconciler status`."""
        return "pass in progress: " + (" | ".join(step.text() for step in self.active) or self.phase)

    def to_dict(self, updated_at: str) -> dict[str, Any]:
        return {
            "by": self.by,
            "pid": self.pid,
            "started": self.started_at,
            "updated": updated_at,
            "phase": self.phase,
            "steps": self.steps,
            "finished": self.finished,
            "active": [step.to_dict() for step in self.active],
            "line": self.line(),
        }


class Throttle:
    """At most one event per key every `interval_s` (the first one always passes). Only the
    `keys` keys let through last are remembered: keys may come from node output, which has no
    end of distinct ones."""

    def __init__(self, interval_s: float, keys: int = 256) -> None:
        self.interval_s = interval_s
        self.keys = keys
        self._last: OrderedDict[str, float] = OrderedDict()

    def due(self, key: str, now: float) -> bool:
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            return False
        self._last[key] = now
        self._last.move_to_end(key)
        while len(self._last) > self.keys:
            self._last.popitem(last=False)
        return True

    def forget(self, key: str) -> None:
        self._last.pop(key, None)
