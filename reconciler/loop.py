"""`reconciler run`: converge, then stay up and heal.

Triggers feed one queue and are coalesced, so bursts (both ranks dying, an editor saving
twice) cost one pass: spec file changes (watchfiles), Docker `die`/`oom` events of our
containers on every node, a resync timer, and probes — readiness (`/v1/models` with the key)
and liveness (a one-token completion), because `/health` answers while the engine is dead.
One pass at a time, under the same lock as a manual `apply`.

Failures: transient ones (SSH drop, Docker timeout, Hub 5xx) are retried inside apply;
a failed pass backs off exponentially with jitter, and says so in STATUS and the status
file. An invalid spec edit keeps the last good spec running until the file is fixed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import watchfiles

from reconciler import notify
from reconciler.apply import apply_plan
from reconciler.components import memguard
from reconciler.errors import ReconcilerError, SpecError
from reconciler.execution import ApplyContext, Progress
from reconciler.facts.gather import gather
from reconciler.facts.node import Facts, Liveness
from reconciler.fsutil import write_private
from reconciler.health import probe_liveness
from reconciler.lock import deployment_lock
from reconciler.plan import Plan, plan, summary_line
from reconciler.redact import redact
from reconciler.serving import LABEL_DEPLOYMENT, LABEL_OWNER, OWNER
from reconciler.spec import Deployment, LoadedSpec, parse_spec, read_spec_text
from reconciler.transport import Transport, close_all, connect_all

DEBOUNCE_S = 0.5
BACKOFF_BASE_S = 15.0


class Triggers:
    """Reasons to look again, coalesced: many fires before a pass make one pass."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._reasons: list[str] = []

    def fire(self, reason: str) -> None:
        with self._lock:
            self._reasons.append(reason)
        self._event.set()

    def wait(self, timeout: float) -> list[str]:
        if self._event.wait(timeout):
            time.sleep(DEBOUNCE_S)
        with self._lock:
            reasons, self._reasons = self._reasons, []
            self._event.clear()
        return reasons


@dataclass
class LoopStatus:
    """What the loop is doing, for STATUS=, the journal and `reconciler status`."""

    condition: str = "starting"
    spec_error: str | None = None
    last_pass: str | None = None
    failures: int = 0
    next_try: str | None = None
    liveness_failures: int = 0
    notes: list[str] = field(default_factory=list)


class Loop:
    def __init__(self, spec_path: str, progress: Progress | None = None) -> None:
        self.spec_path = spec_path
        self.progress = progress or Progress()
        self.spec_text = read_spec_text(spec_path)
        self.loaded: LoadedSpec = parse_spec(self.spec_text, spec_path)
        self.triggers = Triggers()
        self.stopping = threading.Event()
        self.status = LoopStatus()
        self.transports: dict[str, Transport] = connect_all(self.deployment)
        self.backoff_until = 0.0
        self.liveness = Liveness()
        self.serving = False
        self.last_facts: Facts | None = None
        self.threads: list[threading.Thread] = []

    @property
    def deployment(self) -> Deployment:
        return self.loaded.deployment

    # ---- the main loop -------------------------------------------------------------------

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self.stop())
        signal.signal(signal.SIGINT, lambda *_: self.stop())
        self._start_threads()
        self.pass_(["start"])
        notify.ready(self.status.condition)
        while not self.stopping.is_set():
            reasons = self.triggers.wait(self._wait_s())
            if self.stopping.is_set():
                break
            if time.monotonic() < self.backoff_until and not any(r.startswith("spec") for r in reasons):
                continue
            self.pass_(reasons or ["resync"])
        notify.stopping()
        close_all(self.transports)
        return 0

    def stop(self) -> None:
        self.stopping.set()
        self.triggers.fire("stopping")

    def _wait_s(self) -> float:
        until_backoff = self.backoff_until - time.monotonic()
        return max(until_backoff, 1.0) if until_backoff > 0 else float(self.deployment.loop.resync_s)

    def pass_(self, reasons: list[str]) -> None:
        self._reload_spec()
        self._log(f"pass: {', '.join(dict.fromkeys(reasons))}")
        # No liveness verdicts while a pass may be restarting the group.
        self.serving = False
        try:
            with deployment_lock(self.deployment, "reconcile loop pass", wait_s=3600, on_wait=self._log):
                result = self._converge()
            self._succeeded(result)
        except ReconcilerError as exc:
            self._failed(exc)
        except Exception as exc:  # the loop must outlive any bug in a pass; the journal keeps the detail
            self._failed(ReconcilerError(f"unexpected {type(exc).__name__}: {exc}", "please report this bug"))
        self.status.last_pass = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._publish()

    def _converge(self) -> Plan:
        facts = self._facts()
        before = plan(self.deployment, facts)
        if before.has_changes:
            self._log(summary_line(before))
            apply_plan(ApplyContext(self.deployment, facts, self.transports, self.progress), before)
            self.liveness = Liveness()
            return plan(self.deployment, self._facts())
        return before

    def _facts(self) -> Facts:
        self.last_facts = gather(self.deployment, self.transports).model_copy(update={"liveness": self.liveness})
        return self.last_facts

    def _succeeded(self, after: Plan) -> None:
        self.status.failures = 0
        self.backoff_until = 0.0
        self.status.next_try = None
        self.status.notes = after.notes + [f"{b.node}: {b.message}" for b in after.blockers]
        held = bool(after.held)
        # A blocker that leaves the ranks alone (the Hub down under a complete checkpoint) does
        # not stop the probes: the group still serves and must still be healed.
        self.serving = not after.has_changes and not after.ranks_blocked and not held
        if held:
            self.status.condition = "held: " + after.held[0]
        elif after.blockers:
            self.status.condition = f"blocked: {after.blockers[0].node}: {after.blockers[0].message}"
        else:
            self.status.condition = "converged" if not after.has_changes else "converging: " + summary_line(after)

    def _failed(self, exc: ReconcilerError) -> None:
        self.serving = False
        self.status.failures += 1
        delay = min(BACKOFF_BASE_S * 2 ** (self.status.failures - 1), self.deployment.loop.max_backoff_s)
        delay *= random.uniform(0.8, 1.2)
        self.backoff_until = time.monotonic() + delay
        self.status.next_try = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + delay))
        first_line = exc.message.splitlines()[0]
        self.status.condition = f"failed {self.status.failures}x, next try in {delay:.0f} s: {first_line}"
        self._log(f"{exc.message}\n  hint: {exc.hint}")

    # ---- spec reloads ----------------------------------------------------------------------

    def _reload_spec(self) -> None:
        try:
            text = read_spec_text(self.spec_path)
        except SpecError as error:
            self.status.spec_error = f"{error.problems[0].render().splitlines()[0]}; running the last good spec"
            return
        if text == self.spec_text:
            return
        try:
            loaded = parse_spec(text, self.spec_path)
        except SpecError as error:
            first = error.problems[0].render().splitlines()[0]
            self.status.spec_error = f"{first} (running the last good spec)"
            self._log(f"spec error: {first}; keeping the last good spec")
            self.spec_text = text
            return
        self.spec_text = text
        self.status.spec_error = None
        changed = loaded.deployment != self.deployment
        self.loaded = loaded
        if changed:
            self._log("spec changed: converging to it")
            self._clear_trips()
            self.backoff_until = 0.0

    def _clear_trips(self) -> None:
        """A guard trip holds the group until the spec changes (or `reconciler start`)."""
        facts = gather(self.deployment, self.transports)
        context = ApplyContext(self.deployment, facts, self.transports, self.progress)
        for node in self.deployment.nodes:
            if facts.nodes[node.name].reachable and facts.nodes[node.name].guard.trip is not None:
                memguard.clear_trip(context, node.name)

    # ---- status ----------------------------------------------------------------------------

    def _publish(self) -> None:
        self.status.liveness_failures = self.liveness.failures
        status = self.status.condition + (f" | {self.status.spec_error}" if self.status.spec_error else "")
        notify.status(status)
        self._log(f"status: {status}")
        write_private(status_path(self.deployment), redact(json.dumps(asdict(self.status), indent=2)) + "\n")

    def _log(self, message: str) -> None:
        self.progress.line(f"[loop] {message}")

    # ---- trigger threads -------------------------------------------------------------------

    def _start_threads(self) -> None:
        """The trigger threads; the watchdog pings systemd only while every one of them lives."""
        self.threads = [
            threading.Thread(target=self._watch_spec, name="spec watcher", daemon=True),
            threading.Thread(target=self._probe, name="liveness probe", daemon=True),
            *(
                threading.Thread(target=self._watch_events, args=(node,), name=f"{node} events", daemon=True)
                for node in self.transports
            ),
        ]
        for thread in [*self.threads, threading.Thread(target=self._watchdog, name="watchdog", daemon=True)]:
            thread.start()

    def _watch_spec(self) -> None:
        spec = Path(self.spec_path).resolve()
        for changes in watchfiles.watch(spec.parent, stop_event=self.stopping, debounce=200, raise_interrupt=False):
            if any(Path(changed).resolve() == spec for _, changed in changes):
                self.triggers.fire("spec file changed")

    def _watch_events(self, node: str) -> None:
        """Docker `die`/`oom` of our containers on one node; reconnects after any error."""
        delay = 1.0
        since = int(time.time())
        while not self.stopping.is_set():
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
        while not self.stopping.wait(self.deployment.loop.liveness_s):
            if not self.serving:
                continue
            try:
                problem = self._probe_once()
            except Exception as exc:  # see above: the thread must outlive any failure of a probe
                problem = f"the probe itself failed: {type(exc).__name__}: {exc}"
            if problem is None:
                self.liveness = Liveness()
                continue
            self.liveness = Liveness(failures=self.liveness.failures + 1, detail=problem)
            self._log(f"liveness probe failed ({self.liveness.failures}x): {problem}")
            if self.liveness.failures >= self.deployment.loop.failure_threshold:
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


def status_path(deployment: Deployment) -> Path:
    return Path(os.path.expanduser(deployment.state_dir)) / "loop-status.json"


def read_status(deployment: Deployment) -> dict[str, Any] | None:
    try:
        loaded: dict[str, Any] = json.loads(status_path(deployment).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return loaded
