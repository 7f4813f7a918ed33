"""What executors share while `apply` runs: the spec, the facts, the transports, progress, hooks.

Executors live beside the planning code of their component (as pyinfra pairs facts and
operations); this module is the seam between them and `apply`, which only dispatches. An
executor gets the action with its payload and runs that; the facts are here only for what a
node is (its home, its transport), never to decide again what to do.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TextIO

from reconciler.actions import Action, Smoke
from reconciler.clock import utc_iso
from reconciler.errors import FactsError
from reconciler.events import EventLog
from reconciler.facts.node import Facts
from reconciler.nodeops import NodeOps
from reconciler.nodeside.statedir import StateDir
from reconciler.pipeline import Boards
from reconciler.progress import Counter, PassState, StepState, Throttle, bar, parse_line, plausible, printable
from reconciler.spec import Deployment, Node, expand_home
from reconciler.transport.base import LineSink, Transport

# A journal line of byte work every few seconds (a terminal redraws its bar more often);
# STATUS= and loop-status.json within a step at most every PUBLISH_INTERVAL_S.
JOURNAL_INTERVAL_S = 5.0
BAR_INTERVAL_S = 0.5
PUBLISH_INTERVAL_S = 2.0
# A line of ours may quote a node (an error's detail): each of its lines is cut to this.
_MAX_MESSAGE_LINE = 4000
# The first word of a node's line names its kind for the rate limit (`resuming`, `WARNING`).
_MAX_KIND = 80

# Takes the pass's state (None once it ended) to STATUS= and the status file; must not raise.
Publisher = Callable[[PassState | None], None]


class Progress:
    """What a command shows while it works, on stderr (a terminal or the journal alike).

    Plain lines, rate-limited where a source repeats itself; byte work as a bar on a terminal
    and as a line every few seconds without one; and the pass's state (step n of m, its bytes,
    rate and ETA, a detail such as the ranks' last log lines), handed to a publisher at every
    step's start and end and every few seconds within one. Which step a report belongs to is
    the calling thread's (apply runs each step, and each of a batch, on one thread); a sink or
    reporter made on that thread keeps its step when other threads call it (a reader thread).
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        min_interval_s: float = 2.0,
        *,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream or sys.stderr
        self.tty = _isatty(self.stream) if tty is None else tty
        self.clock = clock
        self._lock = threading.RLock()
        self._lines = Throttle(min_interval_s)
        self._shown = Throttle(BAR_INTERVAL_S if self.tty else JOURNAL_INTERVAL_S)
        self._published = Throttle(PUBLISH_INTERVAL_S)
        self._pass = PassState(by="", pid=os.getpid(), started_at=utc_iso())
        self._publisher: Publisher | None = None
        self._loose: dict[str, StepState] = {}
        self._local = threading.local()
        self._bar_shown = False

    # ---- plain lines -----------------------------------------------------------------------

    def line(self, message: str) -> None:
        """`message` on a line of its own (or several: each is made printable, none moves the cursor)."""
        shown = "\n".join(printable(part, _MAX_MESSAGE_LINE) for part in message.split("\n"))
        with self._lock:
            self._erase_bar()
            self.stream.write(shown + "\n")
            self._draw_bar()
            self.stream.flush()

    def throttled(self, key: str, message: str) -> None:
        with self._lock:
            if not self._lines.due(key, self.clock()):
                return
        self.line(message)

    # ---- the pass and its steps ------------------------------------------------------------

    @contextlib.contextmanager
    def publishing(self, by: str, publish: Publisher) -> Iterator[None]:
        """Hand the pass's state to `publish` while the block runs (`by` says who runs it)."""
        with self._lock:
            self._pass = PassState(by=by, pid=os.getpid(), started_at=utc_iso())
            self._publisher = publish
            publish(self._pass)
        try:
            yield
        finally:
            with self._lock:
                self._publisher = None
                publish(None)

    def phase(self, text: str) -> None:
        """What the pass does between steps (gathering facts, planning again)."""
        with self._lock:
            self._pass.phase = text
            self._publish()

    @contextlib.contextmanager
    def step(self, number: int, steps: int, action: Action) -> Iterator[StepState]:
        """Step `number` of `steps` runs on this thread for the block."""
        state = StepState(
            number, steps, action.id, f"{action.component} on {action.node}: {action.summary}", action.node, utc_iso()
        )
        with self._lock:
            self._pass.steps = steps
            self._pass.active.append(state)
            self._publish()
        outer = self.current()
        self._local.step = state
        try:
            yield state
        finally:
            self._local.step = outer
            with self._lock:
                self._erase_bar()
                self._pass.active.remove(state)
                self._pass.finished += 1
                self._draw_bar()
                self._publish()

    def current(self) -> StepState | None:
        step: StepState | None = getattr(self._local, "step", None)
        return step

    def note(self, detail: str) -> None:
        """The current step's detail (the readiness wait: the ranks' last log lines), published
        like byte progress: at most every few seconds."""
        step = self.current()
        if step is None:
            return
        with self._lock:
            step.tell(printable(detail, _MAX_MESSAGE_LINE))
            if self._published.due("pass", self.clock()):
                self._publish()

    # ---- byte work -------------------------------------------------------------------------

    def reporter(self, label: str | None = None) -> Callable[[Counter], None]:
        """Where byte counters of this thread's step go, from any thread; `label` names the
        source in lines (a node, or `head->worker`), else the step's node."""
        step = self.current()
        return lambda counter: self._count(counter, label, step)

    def sink(self, label: str) -> LineSink:
        """A node program's stderr: structured progress lines are counted for this thread's step;
        any other line is shown, printable and cut, rate-limited per label and first word
        (programs repeat)."""
        report = self.reporter(label)

        def take(line: str) -> None:
            counter = parse_line(line)
            if counter is not None:
                report(counter)
                return
            shown = printable(line).strip()
            if shown:
                self.throttled(f"{label}:{shown.split(':')[0][:_MAX_KIND]}", f"    {label}: {shown}")

        return take

    def _count(self, counter: Counter, label: str | None, step: StepState | None) -> None:
        if not plausible(counter):  # a count no file has, from rsync or Docker on a node
            return
        now = self.clock()
        with self._lock:
            target = step if step is not None else self._loose_step(label or counter.what)
            target.count(now, counter)
            if self.tty:
                if self._shown.due("bar", now):
                    self._erase_bar()
                    self._draw_bar(extra=None if step is not None else target)
            elif self._shown.due(f"{target.action}:{label}", now):
                self.line(f"    {label or target.node}: {target.progress_text()}")
            if step is not None and self._published.due("pass", now):
                self._publish()

    def _loose_step(self, label: str) -> StepState:
        """Byte work outside any step (a node operation run by a command, not by apply)."""
        if label not in self._loose:
            self._loose[label] = StepState(0, 0, "", "", label, utc_iso())
        return self._loose[label]

    # ---- writing out -----------------------------------------------------------------------

    def _publish(self) -> None:
        if self._publisher is not None:
            self._publisher(self._pass)

    def _draw_bar(self, extra: StepState | None = None) -> None:
        if not self.tty:
            return
        counting = [step for step in (*self._pass.active, extra) if step is not None and step.counter is not None]
        if not counting:
            return
        text = "    " + " | ".join(_bar_text(step) for step in counting)
        width = max(shutil.get_terminal_size((100, 20)).columns - 1, 20)
        self.stream.write("\r" + text[:width] + "\033[K")
        self.stream.flush()
        self._bar_shown = True

    def _erase_bar(self) -> None:
        if self._bar_shown:
            self.stream.write("\r\033[K")
            self._bar_shown = False


def _bar_text(step: StepState) -> str:
    drawn = bar(step.counter) if step.counter is not None else ""
    return " ".join(part for part in (f"{step.node}:", drawn, step.progress_text()) if part)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or minimal stream is no terminal
        return False


# The post-start smoke: a tool beside the chain (reconciler.verify), handed in by whoever
# converges, so the rank component runs it as a step without importing it.
SmokeRunner = Callable[["ApplyContext", Smoke], str]


@dataclass
class ApplyContext:
    deployment: Deployment
    facts: Facts
    transports: dict[str, Transport]
    progress: Progress = field(default_factory=Progress)
    smoke: SmokeRunner | None = None
    # Files each node has complete and verified while a pipelined group runs (see pipeline.py).
    boards: Boards = field(default_factory=Boards)
    # The event history the steps, restarts, trips and drains are appended to (none: not kept).
    events: EventLog = field(default_factory=lambda: EventLog(None))
    # (action, started, ended) in monotonic seconds of every step done, for the start's phases.
    spans: list[tuple[Action, float, float]] = field(default_factory=list)
    # Bytes each step moved (its progress counter at its end), by action id, for its event.
    moved: dict[str, int] = field(default_factory=dict)

    def node(self, name: str) -> Node:
        return self.deployment.node(name)

    def transport(self, name: str) -> Transport:
        return self.transports[name]

    def home(self, name: str) -> str:
        home = self.facts.nodes[name].home if name in self.facts.nodes else None
        if home is None:
            raise FactsError(f"{name}: home directory unknown", "gather facts again; the node may be unreachable")
        return home

    def path(self, name: str, path: str) -> str:
        """A spec path as it is on that node."""
        return expand_home(path, self.home(name))

    def state_dir(self, name: str) -> StateDir:
        """The node's state dir, `~` expanded as it is there."""
        return StateDir(self.path(name, self.deployment.state_dir))

    def ops(self, name: str) -> NodeOps:
        """The node's file operations; their progress lines appear as they are written."""
        return NodeOps(self.transport(name), self.deployment.state_dir, self.node_lines(name))

    def node_lines(self, name: str) -> LineSink:
        return self.progress.sink(name)


Executor = Callable[[ApplyContext, Action], str]
