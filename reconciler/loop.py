"""`reconciler run`: converge, then stay up and heal.

Triggers feed one queue and are coalesced, so bursts (both ranks dying, an editor saving
twice) cost one pass: spec file changes (watchfiles), Docker `die`/`oom` events of our
containers on every node, a resync timer, and probes — readiness (`/v1/models` with the key)
and liveness (a one-token completion), because `/health` answers while the engine is dead.
Each pass is `commands.converge`, the same path and the same lock as a manual `apply`.

The decisions are pure and tested without threads or a clock (`LoopLogic`, `SpecKeeper`,
`Triggers`): when to look again, backoff with jitter up to a cap after a failed pass, when
failed probes call for a pass, what a held group means, which spec runs when an edit is
invalid (the last good one). `Loop` is the thin shell of threads, sockets and files around them.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import watchfiles

from reconciler import commands, incidents, notify
from reconciler.clock import utc_iso
from reconciler.constants import EXIT_INTERRUPTED
from reconciler.errors import ReconcilerError, SpecError
from reconciler.execution import ApplyContext, Progress
from reconciler.facts.node import Facts, Liveness
from reconciler.health import probe_liveness, read_key
from reconciler.loopstatus import LoopStatus, write_status
from reconciler.metrics import LoopMetrics
from reconciler.metricsserver import MetricsServer
from reconciler.notifier import Notifications, Notifier
from reconciler.plan import Plan, condition, summary_line
from reconciler.serving import LABEL_DEPLOYMENT, LABEL_OWNER, OWNER
from reconciler.spec import Deployment, LoadedSpec, parse_spec, read_spec_text
from reconciler.spec import Loop as LoopSettings
from reconciler.transport.base import Transport
from reconciler.transport.connect import close_all, connect_all

DEBOUNCE_S = 0.5
# The longest the main thread blocks in one wait. The kernel may hand SIGTERM to any thread;
# Python runs the handler in the main thread only once that thread wakes, so a wait of the full
# resync period could leave systemd's stop unanswered for minutes.
WAKE_EVERY_S = 1.0
BACKOFF_BASE_S = 15.0
# The reason the spec watcher gives: a pass for it runs even during a backoff.
SPEC_CHANGED = "spec file changed"
# How long a key read for the metrics endpoint is trusted before it is read again.
KEY_CACHE_S = 60.0
# How soon a key that could not be read is tried again (a first pass may be creating it).
KEY_RETRY_S = 5.0
# How long a stopping loop waits for the notify command to take the events still queued.
NOTIFY_DRAIN_S = 35.0


class Clock(Protocol):
    """What the loop reads the time from: the `time` module, or a test's fake."""

    def monotonic(self) -> float: ...

    def time(self) -> float: ...


class Triggers:
    """Reasons to look again, coalesced: many fires before a pass make one pass."""

    def __init__(self, sleep: Callable[[float], None] = time.sleep) -> None:
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._reasons: list[str] = []
        self._sleep = sleep

    def fire(self, reason: str) -> None:
        with self._lock:
            self._reasons.append(reason)
        self._event.set()

    def wait(self, timeout: float, until: Callable[[], bool] = lambda: False) -> list[str]:
        """The reasons gathered until `timeout`, or until a first one plus a short debounce
        (what else arrives in that moment joins the same pass), or until `until()` says so (read
        at each wake: a signal handler's flag, which must never take this object's locks)."""
        left, fired = timeout, False
        while left > 0 and not fired and not until():
            step = min(left, WAKE_EVERY_S)
            fired = self._event.wait(step)
            left -= step
        if fired:
            self._sleep(DEBOUNCE_S)
        with self._lock:
            reasons, self._reasons = self._reasons, []
            self._event.clear()
        return list(dict.fromkeys(reasons))


@dataclass
class LoopLogic:
    """The loop's decisions: no thread, socket or file, a clock and a jitter source handed in."""

    settings: LoopSettings
    clock: Clock = field(default_factory=lambda: time)
    jitter: Callable[[], float] = lambda: random.uniform(0.8, 1.2)
    status: LoopStatus = field(default_factory=LoopStatus)
    backoff_until: float = 0.0
    liveness: Liveness = field(default_factory=Liveness)
    # Probes run only while the group is converged and serving: never during a pass.
    serving: bool = False

    def wait_s(self) -> float:
        """How long to wait for a trigger: until the backoff ends, else a resync period."""
        until_backoff = self.backoff_until - self.clock.monotonic()
        return max(until_backoff, 1.0) if until_backoff > 0 else float(self.settings.resync_s)

    def admits(self, reasons: list[str]) -> bool:
        """A pass now? Not during a backoff, unless the spec changed (the fix may be in it)."""
        in_backoff = self.clock.monotonic() < self.backoff_until
        return not in_backoff or SPEC_CHANGED in reasons

    def pass_started(self) -> Liveness:
        """The probes' verdict for this pass to act on. Failures enough to restart the group are
        handed over and forgotten: whatever the pass does, they must not restart it again."""
        self.serving = False
        handed = self.liveness
        if handed.failures >= self.settings.failure_threshold:
            self.liveness = Liveness()
        return handed

    def pass_succeeded(self, applied: bool, after: Plan) -> None:
        """The condition after a pass; a pass that acted starts liveness counting afresh."""
        self.status.failures = 0
        self.backoff_until = 0.0
        self.status.next_try = None
        if applied:
            self.liveness = Liveness()
        self.status.notes = after.notes + [f"{b.node}: {b.message}" for b in after.blockers]
        # A blocker that leaves the ranks alone (the Hub down under a complete checkpoint) does
        # not stop the probes: the group still serves and must still be healed.
        self.serving = not after.has_changes and not after.ranks_blocked and not after.held
        self.status.condition = condition(after)

    def pass_failed(self, message: str) -> float:
        """Back off exponentially with jitter, up to the cap; returns the delay."""
        self.serving = False
        self.status.failures += 1
        # The exponent is capped: 2 ** 1024 overflows a float, and 2 ** 20 periods exceed any cap.
        growth = 2.0 ** min(self.status.failures - 1, 20)
        delay = min(BACKOFF_BASE_S * growth, float(self.settings.max_backoff_s))
        delay *= float(self.jitter())
        self.backoff_until = self.clock.monotonic() + delay
        self.status.next_try = utc_iso(self.clock.time() + delay)
        first_line = message.splitlines()[0] if message else "failed"
        self.status.condition = f"failed {self.status.failures}x, next try in {delay:.0f} s: {first_line}"
        return delay

    def probed(self, problem: str | None) -> bool:
        """Count a probe's verdict; True when enough failures in a row call for a pass."""
        if problem is None:
            self.liveness = Liveness()
            return False
        self.liveness = Liveness(failures=self.liveness.failures + 1, detail=problem)
        return self.liveness.failures >= self.settings.failure_threshold

    def published(self) -> LoopStatus:
        self.status.liveness_failures = self.liveness.failures
        return self.status


def rebooted_nodes(last: Facts | None, now: Facts) -> list[str]:
    """`node rebooted` for every node whose boot id differs from the last pass's."""
    if last is None:
        return []
    lines = []
    for name, observed in now.nodes.items():
        before = last.nodes[name].host.boot_id if name in last.nodes else None
        after = observed.host.boot_id
        if before is not None and after is not None and before != after:
            lines.append(f"{name} rebooted since the last pass (boot id {before[:8]} -> {after[:8]})")
    return lines


@dataclass(frozen=True)
class SpecChange:
    """What a reading of the spec file meant: nothing new, an invalid edit, or a new spec."""

    kind: str  # "same" | "invalid" | "new"
    error: str | None = None
    deployment_changed: bool = False
    nodes_changed: bool = False


@dataclass
class SpecKeeper:
    """The spec the loop runs: an invalid edit keeps the last good one until the file is fixed."""

    path: str
    text: str
    loaded: LoadedSpec
    # Why the text last offered is not the running spec (None: it is).
    error: str | None = None

    @classmethod
    def load(cls, path: str) -> SpecKeeper:
        text = read_spec_text(path)
        return cls(path, text, parse_spec(text, path))

    @property
    def deployment(self) -> Deployment:
        return self.loaded.deployment

    def offer(self, text: str) -> SpecChange:
        if text == self.text:
            return SpecChange("invalid" if self.error else "same", error=self.error)
        self.text = text
        try:
            loaded = parse_spec(text, self.path)
        except SpecError as error:
            self.error = f"{error.problems[0].render().splitlines()[0]} (running the last good spec)"
            return SpecChange("invalid", error=self.error)
        self.error = None
        before = self.deployment
        self.loaded = loaded
        changed_nodes = before.nodes != loaded.deployment.nodes
        return SpecChange("new", deployment_changed=loaded.deployment != before, nodes_changed=changed_nodes)


class Loop:
    """The shell: threads for each trigger, a watchdog, and the passes."""

    def __init__(self, spec_path: str, progress: Progress | None = None) -> None:
        self.spec_path = spec_path
        self.progress = progress or Progress()
        self.keeper = SpecKeeper.load(spec_path)
        self.logic = LoopLogic(self.deployment.loop)
        self.triggers = Triggers()
        self.stopping = threading.Event()
        self.interrupted = False  # by a Ctrl-C, not systemd's stop
        self.transports: dict[str, Transport] = connect_all(self.deployment)
        self.last_facts: Facts | None = None
        self.threads: list[threading.Thread] = []
        self.metrics = LoopMetrics(self.deployment)
        self.metrics_server: MetricsServer | None = None
        self.metrics_listen = "off"
        self.notifications = Notifications(self.deployment)
        self.notifier = Notifier(lambda: self.deployment.loop.notify, self._log)
        self._key_cache: tuple[float, str | None] = (0.0, None)
        self._key_lock = threading.Lock()

    @property
    def deployment(self) -> Deployment:
        return self.keeper.deployment

    @property
    def status(self) -> LoopStatus:
        return self.logic.status

    # ---- the main loop -------------------------------------------------------------------

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self._signalled())
        signal.signal(signal.SIGINT, lambda *_: self._signalled(interrupted=True))
        self._serve_metrics()
        self._start_threads()
        # Say "starting" at once: the first pass may download for hours before it says more.
        self._publish()
        self.pass_(["start"])
        notify.ready(self.status.line())
        while not self.stopping.is_set():
            reasons = self.triggers.wait(self.logic.wait_s(), until=self.stopping.is_set)
            if self.stopping.is_set():
                break
            if self.logic.admits(reasons):
                self.pass_(reasons or ["resync"])
        notify.stopping()
        # The last pass's news goes out before the loop does (a stuck command costs its timeout).
        self.notifier.drain(NOTIFY_DRAIN_S)
        if self.metrics_server is not None:
            self.metrics_server.close()
        close_all(self.transports)
        # systemd's stop (SIGTERM) is a clean exit; a Ctrl-C in a terminal reports itself as one.
        return EXIT_INTERRUPTED if self.interrupted else 0

    def _signalled(self, *, interrupted: bool = False) -> None:
        """SIGTERM or Ctrl-C. Python runs this in the main thread between two of its bytecodes,
        which may be inside Triggers.wait holding its locks: it takes none of those (firing a
        trigger could wait on a lock its own thread holds, forever). The stopping Event's lock
        is held only by the threads that wait on it, never by the main thread; the main loop
        reads the Event at its next wake (within a second)."""
        self.interrupted = self.interrupted or interrupted
        self.stopping.set()

    def stop(self, *, interrupted: bool = False) -> None:
        self.interrupted = self.interrupted or interrupted
        self.stopping.set()
        self.triggers.fire("stopping")

    def pass_(self, reasons: list[str]) -> None:
        self._log(f"pass: {', '.join(dict.fromkeys(reasons))}")
        started = time.monotonic()
        try:
            clear_trips = self._reload_spec()
            request = commands.Converge(
                doing="reconcile loop pass",
                trigger=", ".join(dict.fromkeys(reasons)),
                wait_s=3600,
                first=commands.clear_trips if clear_trips else None,
                observed=self._observed,
                show=self._show,
                liveness=self.logic.pass_started(),
                blocked_is_error=False,
                on_wait=self._log,
                on_event=self._on_event,
                take_upgrade=self.deployment.loop.take_upgrades,
            )
            outcome = commands.converge(self.deployment, self.transports, self.progress, request)
            self.last_facts = outcome.facts
            self.logic.pass_succeeded(outcome.before.has_changes, outcome.after)
            self.metrics.pass_ended(reasons, time.monotonic() - started, outcome.after, outcome.facts, time.time())
            self.metrics.liveness_now(self.logic.liveness.failures)
            for event in self.notifications.from_pass(outcome.after, outcome.facts):
                self.notifier.send(event)
        except ReconcilerError as exc:
            self._failed(exc.message, exc.hint, reasons, started)
        except Exception as exc:  # the loop must outlive any bug in a pass; the journal keeps the detail
            self._failed(f"unexpected {type(exc).__name__}: {exc}", "please report this bug", reasons, started)
        self.status.last_pass = utc_iso()
        self._publish()

    def _on_event(self, line: dict[str, Any]) -> None:
        """Each line of the event history as it is written: counted, and told to the owner's
        notify command when it is news."""
        self.metrics.on_event(line)
        self.notifications.deployment = self.deployment
        event = self.notifications.from_history(line)
        if event is not None:
            self.notifier.send(event)

    def _observed(self, facts: Facts) -> None:
        """A node whose boot id changed since the last pass rebooted: say so first, as the
        cause of what this pass finds (ranks gone, a guard to start again)."""
        for line in rebooted_nodes(self.last_facts, facts):
            self._log(line)

    def _show(self, before: Plan) -> None:
        if before.has_changes:
            self._log(summary_line(before))
        cause = incidents.unplanned_cause(before)
        if cause is not None:
            self._log(f"cause: {cause}")

    def _failed(self, message: str, hint: str, reasons: list[str], started: float) -> None:
        self.logic.pass_failed(message)
        self.metrics.pass_failed(reasons, time.monotonic() - started, time.time())
        self.metrics.liveness_now(self.logic.liveness.failures)
        self._log(f"{message}\n  hint: {hint}")

    # ---- spec reloads ----------------------------------------------------------------------

    def _reload_spec(self) -> bool:
        """Read the spec file again; True when a changed spec should clear guard trips."""
        try:
            text = read_spec_text(self.spec_path)
        except SpecError as error:
            self.status.spec_error = f"{error.problems[0].render().splitlines()[0]}; running the last good spec"
            return False
        change = self.keeper.offer(text)
        if change.kind == "invalid":
            if change.error != self.status.spec_error:
                self._log(f"spec error: {change.error}")
            self.status.spec_error = change.error
            return False
        self.status.spec_error = None
        self.logic.settings = self.deployment.loop  # unchanged unless the spec is new
        self.metrics.deployment_changed(self.deployment)
        self._metrics_follow_spec()
        if change.nodes_changed:
            close_all(self.transports)
            self.transports = connect_all(self.deployment)
            self._watch_new_nodes()
        if change.deployment_changed:
            self._log("spec changed: converging to it")
            self.logic.backoff_until = 0.0
        return change.deployment_changed

    # ---- metrics ---------------------------------------------------------------------------

    def _serve_metrics(self) -> None:
        """Serve the metrics where the spec says; a port that cannot be had is said once, not
        fatal (the next spec that names another address tries that one)."""
        listen = self.deployment.loop.metrics
        self.metrics_listen = listen
        if listen == "off":
            return
        try:
            self.metrics_server = MetricsServer(listen, self.metrics.registry, self._api_key)
        except OSError as exc:
            self._log(f"cannot serve metrics on {listen}: {exc.strerror or exc}; running without them (loop.metrics)")
            return
        keyed = " (the API key required)" if self.metrics_server.keyed else ""
        self._log(f"metrics on {self.metrics_server.url}{keyed}")

    def _metrics_follow_spec(self) -> None:
        """A new loop.metrics moves the endpoint (or ends it: off)."""
        if self.metrics_listen == self.deployment.loop.metrics:
            return
        if self.metrics_server is not None:
            self.metrics_server.close()
            self.metrics_server = None
        self._serve_metrics()

    def _api_key(self) -> str | None:
        """The API key for a scrape of metrics served beyond loopback, read at most once in
        KEY_CACHE_S whatever the scrapers send (a rotated key is taken up without a restart);
        None until a pass has seen the head, or while the key cannot be read."""
        with self._key_lock:
            read_at, key = self._key_cache
            trusted_s = KEY_CACHE_S if key is not None else KEY_RETRY_S
            if read_at and time.monotonic() - read_at < trusted_s:
                return key
            self._key_cache = (time.monotonic(), self._read_key())
            return self._key_cache[1]

    def _read_key(self) -> str | None:
        facts = self.last_facts
        if facts is None:
            return None
        try:
            return read_key(ApplyContext(self.deployment, facts, self.transports, self.progress))
        except Exception:  # a scrape must not see the head's trouble: no key, nobody let in
            return None

    # ---- status ----------------------------------------------------------------------------

    def _publish(self) -> None:
        status = self.logic.published()
        try:
            notify.status(status.line())
            self._log(f"status: {status.line()}")
            write_status(self.deployment, status)
        except OSError as exc:  # a full or broken state dir must not end the loop
            self._log(f"cannot write the status file: {exc}")

    def _log(self, message: str) -> None:
        self.progress.line(f"[loop] {message}")

    # ---- trigger threads -------------------------------------------------------------------

    def _start_threads(self) -> None:
        """The trigger threads; the watchdog pings systemd only while every one of them lives."""
        self.threads = [
            threading.Thread(target=self._watch_spec, name="spec watcher", daemon=True),
            threading.Thread(target=self._probe, name="liveness probe", daemon=True),
        ]
        for thread in [*self.threads, threading.Thread(target=self._watchdog, name="watchdog", daemon=True)]:
            thread.start()
        self._watch_new_nodes()

    def _watch_new_nodes(self) -> None:
        """A Docker event stream per node of the spec; the one of a node no longer in it ends."""
        suffix = " events"
        self.threads = [
            t for t in self.threads if not t.name.endswith(suffix) or t.name[: -len(suffix)] in self.transports
        ]
        watched = {thread.name for thread in self.threads}
        for node in self.transports:
            if f"{node}{suffix}" not in watched:
                thread = threading.Thread(target=self._watch_events, args=(node,), name=f"{node}{suffix}", daemon=True)
                self.threads.append(thread)
                thread.start()

    def _watch_spec(self) -> None:
        spec = Path(self.spec_path).resolve()
        for changes in watchfiles.watch(spec.parent, stop_event=self.stopping, debounce=200, raise_interrupt=False):
            if any(Path(changed).resolve() == spec for _, changed in changes):
                self.triggers.fire(SPEC_CHANGED)

    def _watch_events(self, node: str) -> None:
        """Docker `die`/`oom` of our containers on one node; reconnects after any error."""
        delay = 1.0
        since = int(time.time())
        while not self.stopping.is_set() and node in self.transports:
            labels = [f"{LABEL_OWNER}={OWNER}", f"{LABEL_DEPLOYMENT}={self.deployment.name}"]
            filters = {"type": "container", "event": ["die", "oom"], "label": labels}
            stream = None
            try:
                stream = self.transports[node].docker().events(decode=True, filters=filters, since=since)
                for event in stream:
                    delay = 1.0
                    since = int(event.get("time", time.time())) + 1
                    name = event.get("Actor", {}).get("Attributes", {}).get("name", "?")
                    self.triggers.fire(f"{node}: {name} {event.get('Action', 'event')}")
            except Exception:  # any failure of the event stream means: reconnect later
                time.sleep(delay)
                delay = min(delay * 2, 60.0)
            finally:
                if stream is not None:
                    stream.close()

    def _probe(self) -> None:
        """Readiness and liveness of a serving group; enough failures in a row trigger a pass.

        Whatever goes wrong inside one probe (a key that cannot be sent, a bug) counts as a
        failed probe: a probe thread that died would leave a dead engine unhealed forever.
        """
        while not self.stopping.wait(self.logic.settings.liveness_s):
            if not self.logic.serving:
                continue
            started = time.monotonic()
            try:
                problem = self._probe_once()
            except Exception as exc:  # see above: the thread must outlive any failure of a probe
                problem = f"the probe itself failed: {type(exc).__name__}: {exc}"
            due = self.logic.probed(problem)
            self.metrics.probed(problem is None, time.monotonic() - started, self.logic.liveness.failures)
            if problem is not None:
                self._log(f"liveness probe failed ({self.logic.liveness.failures}x): {problem}")
            if due:
                self.triggers.fire("liveness probe failed")

    def _probe_once(self) -> str | None:
        if self.last_facts is None:
            return None
        return probe_liveness(ApplyContext(self.deployment, self.last_facts, self.transports, self.progress))

    def _watchdog(self) -> None:
        """Ping systemd while every trigger thread lives; a dead one means a restart is due."""
        interval = notify.watchdog_interval_s()
        if interval is None:
            return
        while not self.stopping.wait(interval):
            dead = [thread.name for thread in self.threads if not thread.is_alive()]
            if dead:
                self._log(f"the {', '.join(dead)} thread stopped; no more watchdog pings, so systemd restarts the loop")
                return
            notify.watchdog()
