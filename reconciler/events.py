"""The event history: what the reconciler did, one JSON line an event, on the machine it runs on.

Every converge (a loop pass or an `apply`: its trigger, duration and outcome), every step it ran
(step, node, cause, duration, outcome), every unplanned restart counted, breaker trip, drain and
incident is appended to `STATE_DIR/events.jsonl`, redacted like everything else the reconciler
writes. The file is bounded: past MAX_BYTES it is rotated (`events.jsonl.1`, ...) and the oldest
of KEEP files goes. `reconciler events` reads them back, oldest first. Writing never fails
what is being recorded: a history that cannot be written loses that line, not the pass.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from reconciler.clock import parse_utc_iso, utc_iso
from reconciler.nodeside.ops import private_dir
from reconciler.nodeside.statedir import StateDir
from reconciler.redact import redact

NAME = "events.jsonl"
# 4 MiB a file, three files: some 30,000 events, weeks of a loop that passes every few minutes.
MAX_BYTES = 4 * 1024 * 1024
KEEP = 3
# One event's line at most (a step's result may quote a node): longer fields are cut.
MAX_FIELD_CHARS = 2000


class EventLog:
    """Appends events to a history file, rotating it past `max_bytes`; `None` path: records nothing.
    `also`: a script's file (`apply --events FILE`) that gets the same lines, and the progress
    within steps, appended and never rotated. `listener`: sees every event, progress included,
    as it is written (the loop's metrics); whatever it raises is its own loss, not the pass's."""

    def __init__(
        self,
        path: Path | None,
        *,
        max_bytes: int = MAX_BYTES,
        keep: int = KEEP,
        also: Path | None = None,
        listener: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self.also = also
        self.listener = listener

    def emit(self, kind: str, **fields: Any) -> None:
        event = _event(kind, fields)
        line = _line(event)
        if self.path is not None:
            with contextlib.suppress(OSError):
                self._append(self.path, line)
        self.progress_only(line)
        self._tell(event)

    def progress(self, **fields: Any) -> None:
        """Byte work within a step, for the script's file only (the history keeps the steps)."""
        event = _event("progress", fields)
        self.progress_only(_line(event))
        self._tell(event)

    def _tell(self, event: dict[str, Any]) -> None:
        if self.listener is not None:
            with contextlib.suppress(Exception):  # see the class's docstring
                self.listener(event)

    def progress_only(self, line: bytes) -> None:
        if self.also is not None:
            with contextlib.suppress(OSError):
                _append_to(self.also, line)

    def _append(self, path: Path, data: bytes) -> None:
        private_dir(str(path.parent))
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_size + len(data) > self.max_bytes:
                self._rotate(path)
        _append_to(path, data)

    def _rotate(self, path: Path) -> None:
        """events.jsonl -> .1 -> .2 ...; the oldest of `keep` files goes."""
        for number in range(self.keep - 1, 0, -1):
            older = _rotated(path, number)
            if number == self.keep - 1:
                older.unlink(missing_ok=True)
            newer = path if number == 1 else _rotated(path, number - 1)
            with contextlib.suppress(FileNotFoundError):
                newer.rename(older)


def _event(kind: str, fields: dict[str, Any]) -> dict[str, Any]:
    return {"at": utc_iso(), "kind": kind, **{key: _bounded(value) for key, value in fields.items()}}


def _line(event: dict[str, Any]) -> bytes:
    return (redact(json.dumps(event, ensure_ascii=False, default=str)) + "\n").encode("utf-8", errors="replace")


def _append_to(path: Path, data: bytes) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(descriptor, "ab") as handle:
        handle.write(data)


def _rotated(path: Path, number: int) -> Path:
    return path.with_name(f"{path.name}.{number}")


def _bounded(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
        return value[:MAX_FIELD_CHARS] + "..."
    return value


def history_path(state_dir: str) -> Path:
    """The history of the deployment whose state dir this is, on this machine."""
    return Path(StateDir(state_dir).expanded().root) / NAME


def read_events(path: Path, since: float | None = None, *, keep: int = KEEP) -> list[dict[str, Any]]:
    """Every readable event in the history, oldest first, from `since` (epoch seconds) on; a line
    that is not an event (cut by a crash, edited by hand) is left out."""
    events: list[dict[str, Any]] = []
    for file in [*(_rotated(path, number) for number in range(keep - 1, 0, -1)), path]:
        with contextlib.suppress(OSError):
            events += _events_in(file.read_bytes().decode("utf-8", errors="replace"))
    return [event for event in events if since is None or _epoch(event) >= since]


def _events_in(text: str) -> list[dict[str, Any]]:
    found = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError, RecursionError):
            event = json.loads(line)
            if isinstance(event, dict) and isinstance(event.get("at"), str) and isinstance(event.get("kind"), str):
                found.append(event)
    return found


def _epoch(event: dict[str, Any]) -> float:
    parsed = parse_utc_iso(str(event.get("at")))
    return parsed if parsed is not None else 0.0


def follow(path: Path, since: float | None, poll_s: float = 1.0) -> Iterator[dict[str, Any]]:
    """The events from `since`, then each new one as it is written (until interrupted)."""
    seen = read_events(path, since)
    yield from seen
    offset = path.stat().st_size if path.exists() else 0
    while True:
        time.sleep(poll_s)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            continue
        if size < offset:  # rotated: the new file starts from its beginning
            offset = 0
        with path.open("rb") as handle:
            handle.seek(offset)
            data = handle.read()
        complete = data[: data.rfind(b"\n") + 1]
        offset += len(complete)
        yield from _events_in(complete.decode("utf-8", errors="replace"))
