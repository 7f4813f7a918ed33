"""The rsync layer of a copy to a worker: parallel streams, each an rsync over SSH or to a
daemon on the worker's fabric address, their argv and their progress as one byte counter.

One rsync over SSH is paced by its slowest single-threaded stage: the cipher in `ssh`/`sshd`
or rsync's own checksum and I/O loop, about one core each, far below the fabric (25 GB/s) and
the NVMe (5-7 GB/s). Several streams at once use several cores. The files are dealt to the
streams biggest first, each to the stream with the fewest bytes so far (longest processing
time first): the shards spread over the streams, the many small EXL3 files fill the gaps, and
the streams end close together, so the copy's tail is short.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shlex
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from reconciler.actions import Copy
from reconciler.errors import NodeCommandError, PipelineStoppedError, ReconcilerError
from reconciler.execution import ApplyContext
from reconciler.nodeside.copydaemon import MODULE as DAEMON_MODULE
from reconciler.nodeside.copydaemon import USER as DAEMON_USER
from reconciler.nodeside.statedir import StateDir
from reconciler.pipeline import Feed, split_streams
from reconciler.progress import Counter
from reconciler.spec import SshTarget
from reconciler.transport.base import LineSink, check, run_program
from reconciler.transport.sshroute import SshRoute, openssh_command, route_for

# Beyond this the NVMe, not the CPU, is the limit: about 1 GB/s per stream, 5-7 GB/s of disk.
MAX_STREAMS = 8

# AES-GCM runs on the CPU's AES instructions (x86 AES-NI, Arm's crypto extension on the Spark)
# and needs no separate MAC, several times the rate of OpenSSH's first default choice,
# chacha20-poly1305. `^` puts them first in the default list, so a server without them still
# negotiates the rest; the route's other options are untouched.
CIPHER_OPTION = "Ciphers=^aes128-gcm@openssh.com,aes256-gcm@openssh.com"


def stream_count(cores: int | None, files: int) -> int:
    """One stream per core of the node that runs them (the head), within [1, MAX_STREAMS] and
    never more than there are files."""
    wanted = min(max(cores or 1, 1), MAX_STREAMS)
    return max(1, min(wanted, files))


def rsync_streams(
    ctx: ApplyContext,
    node: str,
    copy: Copy,
    sizes: dict[str, int],
    feed: Feed,
    landed: Callable[[list[str]], None],
    *,
    daemon_dir: str | None = None,
) -> int:
    """rsync the copy's source node -> worker `node` in parallel streams; resumable. Returns the
    number of streams.

    `sizes`: the files to copy (relative names) and their sizes, which the streams are split
    by. A copy that names its files copies them again ignoring size and time (a flipped byte
    keeps both), else files already complete on the worker are skipped. Nothing else on the
    worker is touched. The copy's fabric addresses (origin, worker) send the streams to a daemon
    on the worker's (see nodeside/copydaemon.py); without them, over SSH. `feed`: where the
    files come from as they are ready on the origin (all at once unless pipelined); `landed` is
    told each batch once it is on the worker. `daemon_dir`: where the worker's daemon keeps its
    files (a copy running beside another needs its own); default: the checkpoint copy's.
    """
    origin, destination, recopy = copy.source_node, copy.destination_dir, copy.files is not None
    worker = ctx.node(node)
    if worker.ssh is None:
        raise NodeCommandError(f"{node}: a peer copy needs an ssh: target", "add nodes[].ssh for this worker")
    if copy.fabric is None and origin != ctx.deployment.head.name:
        raise NodeCommandError(
            f"{node}: a copy from {origin} goes over the fabric, and its addresses are not known",
            "run `reconciler plan` again: without fabric addresses the head copies itself, over SSH",
        )
    ctx.ops(node).mkdirs(destination)
    # Sized by the head's cores (this process runs there): the nodes are alike.
    count = stream_count(os.cpu_count(), len(sizes))
    # Everything ready now: the streams split as a plain copy's, one rsync each.
    fixed = split_streams(sizes, count) if feed.all_ready() else None
    count = len(fixed) if fixed is not None else count
    label = f"{origin}->{node}"
    meter = StreamMeter(ctx.progress.reporter(label), ctx.progress.sink(label), copy.bytes, count)
    transport = ctx.transport(origin)
    # A pipelined stream runs one rsync per batch, each a connection of its own: room for the
    # next to connect before the daemon has reaped the one before.
    connections = count if fixed is not None else 2 * count
    directory = daemon_dir or StateDir(ctx.deployment.state_dir).copy_daemon
    with _channel(ctx, node, worker.ssh, destination, copy.fabric, connections, directory) as channel:
        waiting = "" if fixed is not None else f", each file once it is verified on {origin}"
        ctx.progress.line(f"    {label}: {count} rsync streams {channel.shown}{waiting}")

        def send(index: int, names: list[str]) -> None:
            # rsync's progress goes to stdout; redirect it to stderr so it streams like ours.
            command = ["sh", "-c", 'exec "$@" 1>&2', "rsync", *channel.argv(copy.source_dir, names, recopy)]
            result = transport.run(command, stdin=channel.stdin, timeout=24 * 3600, on_line=meter.lines(index))
            meter.finished(index)
            check(result, origin, "rsync to " + node)
            landed(names)

        def stream(index: int) -> None:
            try:
                if fixed is not None:
                    send(index, fixed[index])
                    return
                while (batch := feed.take(count)) is not None:
                    send(index, batch)
            except ReconcilerError as exc:
                feed.stop(f"{label}: {exc.message}")
                raise

        with ThreadPoolExecutor(max_workers=count, thread_name_prefix="rsync") as pool:
            futures = [pool.submit(stream, index) for index in range(count)]
        errors = [error for future in futures if (error := future.exception()) is not None]
    if errors:
        # The stream that failed says why; the others only that they stopped for it.
        raise next((error for error in errors if not isinstance(error, PipelineStoppedError)), errors[0])
    return count


@dataclass(frozen=True)
class _Channel:
    """Where a copy's streams go: their argv (source dir, names, recopy) and what they read on
    stdin (the daemon's password), and how that is shown."""

    argv: Callable[[str, list[str], bool], list[str]]
    stdin: bytes | None
    shown: str


@contextlib.contextmanager
def _channel(
    ctx: ApplyContext,
    node: str,
    ssh: SshTarget,
    destination: str,
    fabric: tuple[str, str] | None,
    connections: int,
    directory: str,
) -> Iterator[_Channel]:
    if fabric is None:
        # Resolved here, where the control connection resolves it: the head runs the reconciler.
        route = route_for(node, ssh)

        def over_ssh(source: str, names: list[str], recopy: bool) -> list[str]:
            return rsync_argv(route, source, destination, names, recopy=recopy)

        yield _Channel(over_ssh, None, f"over SSH ({route.describe()})")
        return
    origin_ip, worker_ip = fabric
    secret = secrets.token_hex(24)
    args = {"dir": directory, "path": destination, "address": worker_ip, "allow": origin_ip, "secret": secret}
    daemon = ctx.transport(node)
    lines = ctx.node_lines(node)
    port = run_program(daemon, "copydaemon", "start", {**args, "connections": connections}, on_line=lines)["port"]
    try:

        def to_daemon(source: str, names: list[str], recopy: bool) -> list[str]:
            return daemon_argv(worker_ip, int(port), source, names, recopy=recopy)

        yield _Channel(to_daemon, f"{secret}\n".encode(), f"over the fabric to an rsync daemon on {worker_ip}:{port}")
    finally:
        run_program(daemon, "copydaemon", "stop", {"dir": directory}, on_line=lines)


_EXCLUDES = ["--exclude", "*.safetensors.part[0-9][0-9]", "--exclude", ".cache/"]


def _named(source_dir: str, names: list[str], recopy: bool) -> list[str]:
    """Exactly these files, by name relative to `source_dir`; again even if size and time match
    when `recopy`."""
    source = f"{source_dir.rstrip('/')}/"
    return ["-R", *(["--ignore-times"] if recopy else []), *(f"{source}./{name}" for name in names)]


def daemon_argv(address: str, port: int, source_dir: str, names: list[str], *, recopy: bool) -> list[str]:
    """One stream to the copy's rsync daemon: exactly these files, by name relative to
    `source_dir`; the password on stdin (never in argv), the module root is the destination."""
    argv = ["rsync", "-a", "--partial", "--info=progress2", *_EXCLUDES, "--password-file=-"]
    return [*argv, *_named(source_dir, names, recopy), f"rsync://{DAEMON_USER}@{address}:{port}/{DAEMON_MODULE}/"]


class StreamMeter:
    """The streams' rsync progress lines as one byte counter of the copy (bytes, rate and ETA
    per destination); their other lines as text. Lines arrive on the streams' reader threads."""

    def __init__(self, report: Callable[[Counter], None], other: LineSink, size: int | None, count: int) -> None:
        self._report, self._other, self._size = report, other, size
        self._counters: list[Counter | None] = [None] * count
        # What a stream's earlier rsyncs counted (a pipelined stream runs one per batch).
        self._before: list[Counter | None] = [None] * count
        self._lock = threading.Lock()

    def lines(self, index: int) -> LineSink:
        def take(line: str) -> None:
            counter = rsync_counter(line, None)
            if counter is None:
                self._other(line)
                return
            with self._lock:  # reported under the lock too, so the bytes never go backwards
                before = self._before[index]
                self._counters[index] = counter if before is None else _sum([before, counter])
                self._report(self._combined())

        return take

    def finished(self, index: int) -> None:
        """One rsync of stream `index` ended: the stream's next one counts on from there."""
        with self._lock:
            self._before[index] = self._counters[index]

    def _combined(self) -> Counter:
        """Every stream's bytes; totals and file counts once every stream has said its own."""
        known = [counter for counter in self._counters if counter is not None]
        summed = _sum(known)
        if len(known) < len(self._counters):
            summed = Counter("copy", summed.done)
        return replace(summed, total=max(self._size, summed.done)) if self._size else summed


def _sum(counters: list[Counter]) -> Counter:
    """Counters added up; a total or a file count only when every one of them has its own."""

    def of_all(values: list[int | None]) -> int | None:
        return None if any(value is None for value in values) else sum(value or 0 for value in values)

    return Counter(
        "copy",
        sum(counter.done for counter in counters),
        of_all([counter.total for counter in counters]),
        of_all([counter.files_done for counter in counters]),
        of_all([counter.files for counter in counters]),
    )


# `--info=progress2`: '  1,234,567  45%  110.52MB/s    0:01:23 (xfr#3, to-chk=10/20)'; the part in
# parentheses follows only once a file is done, `ir-chk` while rsync still lists files.
_RSYNC_PROGRESS = re.compile(
    r"^\s*(?P<done>[\d,]+)\s+(?P<percent>\d+)%\s+\S+/s\s+[\d:]+"
    r"(?:\s+\(xfr#(?P<files_done>\d+), (?:ir|to)-chk=(?P<left>\d+)/(?P<files>\d+)\))?\s*$"
)


def rsync_counter(line: str, size: int | None) -> Counter | None:
    """A progress2 line as a Counter: bytes sent of `size` (rsync's percent counts the files
    already there too, so the plan's size is the better total), and files checked of files."""
    match = _RSYNC_PROGRESS.match(line)
    if match is None:
        return None
    done = int(match["done"].replace(",", ""))
    percent = int(match["percent"])
    total = max(size, done) if size else (done * 100 // percent if percent else None)
    files = int(match["files"]) if match["files"] else None
    files_done = files - int(match["left"]) if files is not None else None
    return Counter("copy", done, total, files_done, files)


def rsync_argv(
    route: SshRoute, source_dir: str, destination: str, only: list[str] | None, *, recopy: bool = True
) -> list[str]:
    """One copy stream's argv: over the control connection's route; remote paths stay data.

    rsync's `ssh` gets the resolved route as explicit options (port, user, address, keys,
    known_hosts, jump hosts), so it reaches the worker exactly as paramiko does, plus the
    cipher preference (CIPHER_OPTION).
    `--protect-args` (rsync >= 3.0; `--secluded-args` since 3.2.7, which keeps the old name)
    sends the remote paths inside rsync's protocol instead of through the remote shell, so a
    model dir with spaces or `;` can never run anything on the worker. rsync writes each file
    to a temporary name and renames it: a file being replaced is never rewritten in place.
    `only`: exactly these files (the whole tree when None), again even if size and time match
    when `recopy`.
    """
    target = route.target
    remote = f"{target.user}@{target.name}:{destination.rstrip('/')}/"
    argv = ["rsync", "-a", "--protect-args", "--partial", "--info=progress2", *_EXCLUDES]
    argv += ["-e", shlex.join([*openssh_command(route), "-o", CIPHER_OPTION])]
    if only is None:
        return [*argv, f"{source_dir.rstrip('/')}/", remote]
    return [*argv, *_named(source_dir, only, recopy), remote]
