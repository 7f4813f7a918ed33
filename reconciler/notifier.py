"""`loop.notify`: the owner's command, run with one JSON event on its stdin when something needs them.

Not to be confused with `notify` (systemd's readiness protocol). Four events reach the command:
`hold` (the group is held: `stopped`, `crash_loop`, `guard_trip`; seen in a pass's facts, so a
`reconciler stop` run elsewhere counts too), `trip` (the crash-loop breaker or a node's memory
guard tripped), `incident` (an unplanned failure was recorded) and `recovery` (the first
converged pass after any of those). Each is a JSON object with `event`, `at`,
`deployment`, `summary` (one line for people) and the event's own fields; it is redacted like
every line the reconciler writes.

The command runs on a thread of its own, one event at a time, so a slow webhook never holds a
pass; it gets TIMEOUT_S, no shell, an environment of PATH, HOME and LANG only (whatever else the
service has stays out of it), and its output goes to the loop's journal. A command that fails,
hangs or is missing costs that one notification and a journal line, never the loop. Events
beyond QUEUE_LIMIT waiting are dropped, said in the journal.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable
from typing import Any

from reconciler.clock import utc_iso
from reconciler.facts.node import Facts, hold_reasons
from reconciler.plan import Plan, ending
from reconciler.redact import redact
from reconciler.spec import Deployment

TIMEOUT_S = 30.0
QUEUE_LIMIT = 100
# What the command's output may put into the journal, per run.
OUTPUT_LIMIT = 2000
# The step that holds the group when the breaker trips (its event marks the trip).
BREAKER_STEP = "ranks.hold-crash-loop"
# What each hold reason is, in words.
HOLD_WORDS = {
    "stopped": "held by `reconciler stop`",
    "crash_loop": "held by the crash-loop breaker",
    "guard_trip": "held after a memory-guard trip",
}


def event_for(deployment: Deployment, event: str, summary: str, **fields: Any) -> dict[str, Any]:
    """One notification: the fields every event has, then its own."""
    return {"event": event, "at": utc_iso(), "deployment": deployment.name, "summary": summary, **fields}


class Notifications:
    """What to tell the owner, from the loop's history lines and each pass's end. Pure: it
    returns events; `Notifier` runs the command."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        # Something was told since the deployment last converged: its recovery is news.
        self.troubled: list[str] = []
        self._trips_seen: dict[str, str] = {}
        self._holds_told: set[str] = set()

    def from_history(self, line: dict[str, Any]) -> dict[str, Any] | None:
        """A breaker trip or an incident, from the loop's own converge as it is written."""
        kind = line.get("kind")
        if kind == "step" and line.get("step") == BREAKER_STEP and line.get("outcome") == "done":
            limit = self.deployment.loop.max_restarts
            summary = f"{self.deployment.name}: the crash-loop breaker tripped ({limit} unplanned restarts)"
            return self._told("trip", summary, what="breaker")
        if kind == "incident":
            what, cause = str(line.get("incident", "")), str(line.get("cause", ""))
            summary = f"{self.deployment.name}: incident {line.get('id', '')}: {what}: {cause}"
            return self._told("incident", summary, id=line.get("id"), incident=what, cause=cause)
        return None

    def from_pass(self, after: Plan, facts: Facts) -> list[dict[str, Any]]:
        """What a pass found: a hold begun (by the loop, or by `reconciler stop` in another
        process: the facts say it either way), guard trips the nodes recorded since last seen,
        then the recovery, if this pass is it."""
        found = self._new_holds(facts) + self._new_trips(facts)
        if self.troubled and not found and ending(after) == "converged":
            after_what = sorted(set(self.troubled))
            self.troubled = []
            summary = f"{self.deployment.name}: converged again, serving (after: {', '.join(after_what)})"
            found.append(event_for(self.deployment, "recovery", summary, after=after_what))
        return found

    def _new_holds(self, facts: Facts) -> list[dict[str, Any]]:
        head = facts.nodes.get(self.deployment.head.name)
        if head is None or not head.reachable:
            return []  # a head that does not answer says nothing about holds: nothing is news
        reasons = hold_reasons(facts, self.deployment.head.name)
        new = [reason for reason in reasons if reason not in self._holds_told]
        self._holds_told = set(reasons)
        summary = f"{self.deployment.name}: the serving group is "
        return [self._told("hold", summary + HOLD_WORDS[reason], reason=reason) for reason in new]

    def _new_trips(self, facts: Facts) -> list[dict[str, Any]]:
        found = []
        for name, observed in facts.nodes.items():
            trip = observed.guard.trip
            if trip is None or self._trips_seen.get(name) == trip.at:
                continue
            self._trips_seen[name] = trip.at
            summary = (
                f"{self.deployment.name}: the memory guard on {name} stopped the ranks "
                f"(MemAvailable {trip.mem_available_gib:.2f} GiB under the floor of {trip.floor_gib:g} GiB)"
            )
            found.append(
                self._told("trip", summary, what="memguard", node=name, mem_available_gib=trip.mem_available_gib)
            )
        return found

    def _told(self, event: str, summary: str, **fields: Any) -> dict[str, Any]:
        self.troubled.append(event)
        return event_for(self.deployment, event, summary, **fields)


class Notifier:
    """Runs `loop.notify` with each event, in order, on one thread; `log` is the journal."""

    def __init__(self, command: Callable[[], list[str] | None], log: Callable[[str], None]) -> None:
        self.command = command
        self.log = log
        self.waiting: queue.Queue[dict[str, Any]] = queue.Queue(QUEUE_LIMIT)
        self.thread = threading.Thread(target=self._serve, name="notify", daemon=True)
        self.thread.start()

    def send(self, event: dict[str, Any]) -> None:
        if not self.command():
            return
        try:
            self.waiting.put_nowait(event)
        except queue.Full:
            self.log(f"notify: {QUEUE_LIMIT} events already wait for the command; dropped: {event['summary']}")

    def _serve(self) -> None:
        while True:
            event = self.waiting.get()
            try:
                argv = self.command()
                if argv:
                    self.log(run_command(argv, event))
            finally:
                self.waiting.task_done()

    def drain(self, timeout_s: float) -> bool:
        """Wait until every queued event was handed over (tests, and a clean stop)."""
        done = threading.Event()

        def wait_for_all() -> None:
            self.waiting.join()
            done.set()

        threading.Thread(target=wait_for_all, daemon=True).start()
        return done.wait(timeout_s)


def run_command(argv: list[str], event: dict[str, Any]) -> str:
    """Run the command once with the event; what happened, as a journal line. The command runs
    in a process group of its own, which ends with it (or at the time limit): nothing it started
    outlives it; of its output only the last OUTPUT_LIMIT bytes are kept."""
    payload = redact(json.dumps(event, sort_keys=True)) + "\n"
    shown = f"notify ({event['event']})"
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=_environment(),
            cwd="/",
            start_new_session=True,
        )
    except OSError as exc:
        return f"{shown}: cannot run {argv[0]}: {exc.strerror or exc}"
    tail = bytearray()
    reader = threading.Thread(target=_keep_tail, args=(process, tail), daemon=True)
    reader.start()
    with contextlib.suppress(OSError):  # a command that never reads its stdin is its own business
        assert process.stdin is not None
        process.stdin.write(payload.encode())
        process.stdin.close()
    try:
        code: int | None = process.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        code = None
    _end_group(process)
    reader.join(timeout=1)
    if code is None:
        return f"{shown}: {argv[0]} did not finish in {TIMEOUT_S:g} s; it was stopped"
    output = redact(bytes(tail).decode("utf-8", "replace").strip())
    result = "done" if code == 0 else f"{argv[0]} exited {code}"
    return f"{shown}: {result}" + (f": {output}" if output else "")


def _keep_tail(process: subprocess.Popen[bytes], tail: bytearray) -> None:
    assert process.stdout is not None
    descriptor = process.stdout.fileno()
    with contextlib.suppress(OSError):
        for chunk in iter(lambda: os.read(descriptor, 65536), b""):
            tail.extend(chunk)
            del tail[:-OUTPUT_LIMIT]


def _end_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)


def _environment() -> dict[str, str]:
    """PATH, HOME and LANG of the loop: a notify command needs no more, and gets no more."""
    return {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
