"""Subprocess, process-table and timing helpers shared by the testbed modules.

Daemons are started detached (`setsid ... &` from a throw-away shell) so they are never
children of the Python process that started them: a pytest process that runs `up` and
later `down` must not collect zombies it has to reap. PID 1 on some CI machines does not
reap orphans either, so a zombie counts as dead everywhere here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.testbed.config import TestbedError


def run(
    argv: list[str],
    *,
    check: bool = True,
    input_text: str | None = None,
    timeout: float = 60.0,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing text output; on failure raise with its stderr."""
    try:
        proc = subprocess.run(
            argv, input=input_text, capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd
        )
    except subprocess.TimeoutExpired as exc:
        raise TestbedError(f"timed out after {timeout:.0f} s: {' '.join(argv)}") from exc
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip()
        raise TestbedError(f"exit {proc.returncode}: {' '.join(argv)}\n{detail}")
    return proc


def spawn_detached(argv: list[str], log: Path, cwd: Path | None = None) -> int:
    """Start argv in its own session, detached from us; return the PID of what argv execs into."""
    script = 'log=$1; shift; setsid "$@" </dev/null >"$log" 2>&1 & echo $!'
    out = run(["sh", "-c", script, "sh", str(log), *argv], cwd=cwd).stdout.strip()
    return int(out)


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    comm: str
    argv: list[str]


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        stat = _read(f"/proc/{pid}/stat").decode()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def processes() -> list[ProcInfo]:
    """Every live process except this one, with its argv (empty for kernel threads)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            raw = _read(f"/proc/{entry}/cmdline")
            comm = _read(f"/proc/{entry}/comm").decode().strip()
        except OSError:
            continue
        found.append(ProcInfo(int(entry), comm, _argv(raw)))
    return found


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in _read(f"/proc/{pid}/task/{pid}/children").split()]
    except OSError:
        return []


def comm_of(pid: int) -> str:
    try:
        return _read(f"/proc/{pid}/comm").decode().strip()
    except OSError:
        return ""


def argv_of(pid: int) -> list[str]:
    try:
        return _argv(_read(f"/proc/{pid}/cmdline"))
    except OSError:
        return []


def _argv(cmdline: bytes) -> list[str]:
    return [a.decode(errors="replace") for a in cmdline.split(b"\0") if a]


def signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def stop(pids: Iterable[int], grace: float) -> list[int]:
    """SIGTERM, SIGKILL whatever is left after `grace` seconds; return the PIDs that survived even that."""
    pending = [p for p in pids if alive(p)]
    signal_all(pending, signal.SIGTERM)
    if not wait_for(lambda: not any(alive(p) for p in pending), grace):
        signal_all([p for p in pending if alive(p)], signal.SIGKILL)
        wait_for(lambda: not any(alive(p) for p in pending), 5.0)
    return [p for p in pending if alive(p)]


def kill_now(pids: Iterable[int]) -> None:
    pending = [p for p in pids if alive(p)]
    signal_all(pending, signal.SIGKILL)
    wait_for(lambda: not any(alive(p) for p in pending), 5.0)


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.02) -> bool:
    """Poll until predicate() is true; False on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Steps:
    """Prints each named step with its wall time, and the total at the end."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.start = time.monotonic()
        self.timings: dict[str, float] = {}

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            took = time.monotonic() - began
            self.timings[name] = took
            print(f"  {name:<36} {took:6.2f} s", flush=True)

    def total(self) -> float:
        took = time.monotonic() - self.start
        print(f"{self.title}: {took:.2f} s", flush=True)
        return took
