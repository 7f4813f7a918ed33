"""Pipelined checkpoint distribution: files handed on while the actions that make them still run.

A worker's copy need not wait for the whole checkpoint on its source: each file may go as soon as
it is complete there and matches its sha256. The plan marks such an action `pipelined` (a Copy
behind its source's Download, Reassemble and Verify, or behind the copy of the worker before it
in the chain; the head's Reassemble behind the Download of its parts), and `apply` runs it at
the same time as the actions it is pipelined behind, in `run_group`. The producers publish each
file on their node's `Board` once it is complete and verified (a shard after its reassembly and
hash, never its parts to a copy); the pipelined action takes files through its `Feed`.

What keeps this correct without trusting the producers to publish everything: once every action
a pipelined action is behind has ended well, its feed is *released*, and every file it wants is
ready, exactly as if it had run after them in sequence. A producer that fails fails its node's
board, and every feed on it raises instead of waiting: nothing hangs. A feed made outside
`run_group` (a copy run on its own) is released from the start.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from reconciler.actions import Action, Step, behind, is_pipelined, source_of
from reconciler.errors import PipelineStoppedError, ReconcilerError

# Small files ready at once go in one rsync up to this many bytes: one rsync per 256 kB bank
# file would spend more on starting rsync than on the bytes.
BATCH_BYTES = 64 * 1024 * 1024


def split_streams(sizes: Mapping[str, int], count: int) -> list[list[str]]:
    """The files as `count` streams (fewer if there are fewer files), balanced by bytes.

    Biggest first, each file to the stream with the fewest bytes so far (ties: the lower
    stream), names sorted within a size so the split is the same on every run.
    """
    loads = [0] * max(count, 1)
    streams: list[list[str]] = [[] for _ in loads]
    for name in sorted(sizes, key=lambda item: (-sizes[item], item)):
        lightest = min(range(len(loads)), key=lambda index: (loads[index], index))
        streams[lightest].append(name)
        loads[lightest] += sizes[name]
    return [stream for stream in streams if stream]


class Board:
    """The files of one node that are complete and match their sha256, as they become so."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.changed = threading.Condition()
        self.ready: set[str] = set()
        self.failure: str | None = None

    def publish(self, names: Iterable[str]) -> None:
        with self.changed:
            self.ready.update(names)
            self.changed.notify_all()

    def fail(self, reason: str) -> None:
        with self.changed:
            if self.failure is None:
                self.failure = reason
            self.changed.notify_all()


class Feed:
    """What one action takes from a board: the files it wants, each once.

    `take` hands a copy stream its next batch, the biggest ready file first; `wait_for` blocks
    until named files are ready. Both raise when the board fails, and return once `release`d
    (every file wanted is then ready).
    """

    def __init__(self, board: Board, wanted: Mapping[str, int], *, released: bool = False) -> None:
        self.board = board
        self.remaining = dict(wanted)
        self.released = released
        self.stopped: str | None = None

    def release(self) -> None:
        with self.board.changed:
            self.released = True
            self.board.changed.notify_all()

    def stop(self, reason: str) -> None:
        """This consumer gave up (one of its streams failed): its other streams take nothing more."""
        with self.board.changed:
            self.stopped = reason
            self.board.changed.notify_all()

    def all_ready(self) -> bool:
        with self.board.changed:
            return self.released or all(name in self.board.ready for name in self.remaining)

    def take(self, streams: int) -> list[str] | None:
        """The next batch for one of `streams` streams; None when every wanted file is taken."""
        with self.board.changed:
            while True:
                self._raise_if_failed()
                if not self.remaining:
                    return None
                ready = self._ready()
                if ready:
                    batch = self._batch(ready, streams)
                    for name in batch:
                        del self.remaining[name]
                    return batch
                self.board.changed.wait()

    def wait_for(self, names: Iterable[str]) -> None:
        wanted = set(names)
        with self.board.changed:
            while True:
                self._raise_if_failed()
                if self.released or wanted <= self.board.ready:
                    return
                self.board.changed.wait()

    def _raise_if_failed(self) -> None:
        if self.board.failure is not None:
            raise PipelineStoppedError(
                f"stopped: {self.board.node} did not get its files ready: {self.board.failure}",
                "fix the failure named above and run `reconciler apply` again: finished files are kept",
            )
        if self.stopped is not None:
            raise PipelineStoppedError(f"stopped: {self.stopped}", "see the failure named above")

    def _ready(self) -> list[str]:
        ready = self.remaining if self.released else [n for n in self.remaining if n in self.board.ready]
        return sorted(ready, key=lambda name: (-self.remaining[name], name))

    def _batch(self, ready: list[str], streams: int) -> list[str]:
        if len(ready) == len(self.remaining):
            # Everything left is ready: this stream's share, as the streams of a plain copy split.
            return split_streams({name: self.remaining[name] for name in ready}, max(streams, 1))[0]
        batch, size = [ready[0]], self.remaining[ready[0]]
        for name in ready[1:]:
            if size + self.remaining[name] > BATCH_BYTES:
                break
            batch.append(name)
            size += self.remaining[name]
        return batch


@dataclass
class Boards:
    """Every node's board and hash-cache lock while `apply` runs, and the feeds `run_group` made."""

    boards: dict[str, Board] = field(default_factory=dict)
    feeds: dict[str, Feed] = field(default_factory=dict)
    locks: dict[str, threading.Lock] = field(default_factory=dict)
    guard: threading.Lock = field(default_factory=threading.Lock)

    def board(self, node: str) -> Board:
        with self.guard:
            return self.boards.setdefault(node, Board(node))

    def cache_lock(self, node: str) -> threading.Lock:
        """Held while a node's hash cache is read and written: two actions may hash on one node at once."""
        with self.guard:
            return self.locks.setdefault(node, threading.Lock())

    def feed(self, action: Action, source: str, wanted: Mapping[str, int]) -> Feed:
        """The feed `run_group` made for this action, else one with every file ready now."""
        with self.guard:
            made = self.feeds.get(action.id)
        if made is None:
            return Feed(self.board(source), wanted, released=True)
        made.remaining = dict(wanted)
        return made


# The checkpoint's steps that run before the rank group restarts: a run of them holding a
# pipelined action is run by `run_group`.
CHECKPOINT_STEPS = {
    Step.PIN,
    Step.LINK,
    Step.DOWNLOAD,
    Step.REASSEMBLE,
    Step.VERIFY,
    Step.COPY,
    Step.PRUNE,
    Step.STAGE_PLAN,
}
# The image's transfer joins the checkpoint's group: on its own lane of each node (see
# `_waits_for`), so the image travels while the checkpoint does.
IMAGE_TRANSFER_STEPS = {Step.FETCH_IMAGE, Step.COPY_IMAGE}
GROUP_STEPS = CHECKPOINT_STEPS | IMAGE_TRANSFER_STEPS

Outcome = tuple[str, float, ReconcilerError | None]


def run_group(ctx_boards: Boards, group: list[Action], run: Callable[[Action], Outcome]) -> list[Outcome]:
    """Run the actions, each once what it waits for has ended well; the outcomes in plan order.

    An action waits for the earlier actions of the group on its node and for those it depends
    on; a pipelined action starts without waiting for those it depends on (its feed waits for
    their files instead), and its feed is released once they all ended well. An action that
    fails, or cannot start because one it waits for failed, fails its node's board. Every
    action ends before this returns.
    """
    nodes = {action.id: action.node for action in group}
    ended = {action.id: threading.Event() for action in group}
    good: dict[str, bool] = {}
    feeds = _make_feeds(ctx_boards, group, nodes)
    lock = threading.Lock()

    def finish(action: Action, ok: bool, reason: str) -> None:
        with lock:
            good[action.id] = ok
        # A node's board holds its checkpoint files: the image's lane failing stops no copy of them.
        if not ok and action.step not in IMAGE_TRANSFER_STEPS:
            ctx_boards.board(action.node).fail(reason)
        ended[action.id].set()
        for waiting in group:
            alongside = behind(waiting, nodes)
            feed = feeds.get(waiting.id)
            if feed is None or action.id not in alongside:
                continue
            if not ok:
                feed.board.fail(reason)
            elif all(ended[d].is_set() and good.get(d) for d in alongside):
                feed.release()

    def one(index: int) -> Outcome:
        action = group[index]
        for other in _waits_for(group, index, nodes):
            ended[other].wait()
            if not good.get(other):
                outcome: Outcome = ("", 0.0, ReconcilerError(f"not started: {other} did not succeed", ""))
                finish(action, False, f"{action.id} not started")
                return outcome
        result = run(action)
        error = result[2]
        finish(action, error is None, f"{action.id} failed: {error.message}" if error is not None else "")
        return result

    with ThreadPoolExecutor(max_workers=len(group), thread_name_prefix="pipeline") as pool:
        outcomes = list(pool.map(one, range(len(group))))
    with ctx_boards.guard:
        for action in group:
            ctx_boards.feeds.pop(action.id, None)
    return outcomes


def _make_feeds(boards: Boards, group: list[Action], nodes: Mapping[str, str]) -> dict[str, Feed]:
    feeds: dict[str, Feed] = {}
    for action in group:
        if is_pipelined(action):
            feeds[action.id] = Feed(boards.board(source_of(action)), {}, released=not behind(action, nodes))
    with boards.guard:
        boards.feeds.update(feeds)
    return feeds


def _waits_for(group: list[Action], index: int, nodes: Mapping[str, str]) -> list[str]:
    """The earlier actions of the group on the action's node (of its lane: the checkpoint's or
    the image's) and those it depends on, but for those a pipelined action runs alongside."""
    action = group[index]
    alongside = behind(action, nodes)
    lane = action.step in IMAGE_TRANSFER_STEPS
    earlier = [
        other.id
        for other in group[:index]
        if other.node == action.node and (other.step in IMAGE_TRANSFER_STEPS) == lane
    ]
    deps = [dep for dep in action.depends_on if dep in nodes and dep not in earlier]
    return [other for other in [*earlier, *deps] if other not in alongside]
