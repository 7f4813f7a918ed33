"""Fault injection and the request log of the stand-in Hub.

TEST STAND-IN, not part of the product. Tests use these to reproduce what a real download meets
(5xx answers the client retries, cuts it resumes with Range) and to prove afterwards which bytes travelled:

- `cut`: close the connection after N body bytes of a matching file, for the next `times` responses;
- `fail`: answer a status (default 503) to the next `count` requests whose URL path matches a glob
  (and whose method matches, if one is given); status 200 answers an HTML page instead of the
  Hub's JSON (a captive portal), 429 carries `Retry-After`;
- `rate`: cap each response body at N bytes/s;
- `ignore_ranges`: answer every Range request with the whole file (200), as some proxies do.

Rules come from `serve --fault SPEC` or from `POST /_standin/faults` at run time (see `server.py`).
"""

from __future__ import annotations

import fnmatch
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class CutRule:
    """Close the connection after `after_bytes` body bytes of a file whose repo path matches `path` (a glob)."""

    path: str
    after_bytes: int
    times: int = 1


@dataclass
class FailRule:
    """Answer `status` to the next `count` requests whose URL path matches `path` (a glob) and `method` if set."""

    count: int
    status: int = 503
    path: str = "*"
    method: str | None = None


@dataclass
class _State:
    cuts: list[CutRule] = field(default_factory=list)
    fails: list[FailRule] = field(default_factory=list)
    rate_bps: int | None = None
    ignore_ranges: bool = False  # answer Range requests with the whole file, as some proxies do


class Faults:
    """Thread-safe fault rules; each `take_*` consumes one use of the first matching rule."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = _State()

    def add_cut(self, rule: CutRule) -> None:
        with self._lock:
            self._state.cuts.append(rule)

    def add_fail(self, rule: FailRule) -> None:
        with self._lock:
            self._state.fails.append(rule)

    def set_rate(self, bytes_per_second: int | None) -> None:
        with self._lock:
            self._state.rate_bps = bytes_per_second

    def set_ignore_ranges(self, ignore: bool) -> None:
        with self._lock:
            self._state.ignore_ranges = ignore

    @property
    def ignore_ranges(self) -> bool:
        with self._lock:
            return self._state.ignore_ranges

    def clear(self) -> None:
        with self._lock:
            self._state = _State()

    @property
    def rate_bps(self) -> int | None:
        with self._lock:
            return self._state.rate_bps

    def take_failure(self, method: str, url_path: str) -> int | None:
        with self._lock:
            for rule in self._state.fails:
                if rule.count > 0 and rule.method in (None, method) and fnmatch.fnmatch(url_path, rule.path):
                    rule.count -= 1
                    return rule.status
        return None

    def take_cut(self, repo_path: str) -> int | None:
        with self._lock:
            for rule in self._state.cuts:
                if rule.times > 0 and fnmatch.fnmatch(repo_path, rule.path):
                    rule.times -= 1
                    return rule.after_bytes
        return None

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            return {
                "cut": [asdict(c) for c in self._state.cuts],
                "fail": [asdict(f) for f in self._state.fails],
                "rate_bps": self._state.rate_bps,
                "ignore_ranges": self._state.ignore_ranges,
            }

    def update_from_json(self, data: dict[str, Any]) -> None:
        """Add the rules of a control request:
        `{"cut": [...], "fail": [...], "rate_bps": N|null, "ignore_ranges": bool}`."""
        for cut in data.get("cut", []):
            self.add_cut(
                CutRule(path=str(cut["path"]), after_bytes=int(cut["after_bytes"]), times=int(cut.get("times", 1)))
            )
        for fail in data.get("fail", []):
            method = fail.get("method")
            self.add_fail(
                FailRule(
                    count=int(fail["count"]),
                    status=int(fail.get("status", 503)),
                    path=str(fail.get("path", "*")),
                    method=None if method is None else str(method).upper(),
                )
            )
        if "rate_bps" in data:
            rate = data["rate_bps"]
            self.set_rate(None if rate is None else int(rate))
        if "ignore_ranges" in data:
            self.set_ignore_ranges(bool(data["ignore_ranges"]))

    def add_cli_spec(self, spec: str) -> None:
        """`cut:PATH:BYTES[:TIMES]`, `fail:COUNT[:STATUS[:GLOB[:METHOD]]]`, `rate:BYTES_PER_SECOND` or
        `ignore-ranges`."""
        kind, _, rest = spec.partition(":")
        args = rest.split(":")
        if kind == "cut" and len(args) in (2, 3):
            self.add_cut(CutRule(path=args[0], after_bytes=int(args[1]), times=int(args[2]) if len(args) == 3 else 1))
        elif kind == "fail" and rest:
            given = rest.split(":", 3)
            count, status, glob, method = given + ["", "503", "*", ""][len(given) :]
            self.add_fail(FailRule(count=int(count), status=int(status), path=glob, method=method.upper() or None))
        elif kind == "rate" and len(args) == 1 and rest:
            self.set_rate(int(args[0]))
        elif spec == "ignore-ranges":
            self.set_ignore_ranges(True)
        else:
            raise ValueError(
                f"bad fault spec {spec!r}: use cut:PATH:BYTES[:TIMES], fail:COUNT[:STATUS[:GLOB[:METHOD]]], "
                "rate:BPS or ignore-ranges"
            )


@dataclass
class LogEntry:
    """One request as the stand-in saw it; `bytes_sent` counts body bytes only, `file` is the repo path sent."""

    seq: int
    time: float
    method: str
    path: str
    query: str
    range: str | None
    host: str | None
    authorized: bool
    status: int = 0
    bytes_sent: int = 0
    file: str | None = None
    commit: str | None = None  # the served commit the request's revision resolved to (None: no revision)
    note: str | None = None
    # Held while body bytes are written and counted: a client can hold the last byte before the
    # writer has counted it, so a log read waits for the count of a write already under way.
    sending: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def settled(self) -> dict[str, Any]:
        """The entry's fields once no body write is half counted (waiting a bounded time for a stalled client)."""
        acquired = self.sending.acquire(timeout=SETTLE_WAIT_S)
        try:
            return {name: getattr(self, name) for name in _LOGGED_FIELDS}
        finally:
            if acquired:
                self.sending.release()


SETTLE_WAIT_S = 5.0
_LOGGED_FIELDS = [name for name in LogEntry.__dataclass_fields__ if name != "sending"]


class RequestLog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[LogEntry] = []
        self._seq = 0

    def open(self, method: str, path: str, query: str, headers: dict[str, str]) -> LogEntry:
        with self._lock:
            self._seq += 1
            entry = LogEntry(
                seq=self._seq,
                time=time.time(),
                method=method,
                path=path,
                query=query,
                range=headers.get("range"),
                host=headers.get("host"),
                authorized="authorization" in headers,
            )
            self._entries.append(entry)
            return entry

    def entries(self, since: int = 0) -> list[dict[str, Any]]:
        with self._lock:
            chosen = [e for e in self._entries if e.seq > since]
        return [entry.settled() for entry in chosen]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
