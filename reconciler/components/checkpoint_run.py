"""The checkpoint's executors: each runs the payload its action carries, on its node.

Every write that lands in a revision directory replaces a file whole (the Hub client's and the
node-side fetcher's downloads, rsync, reassembly and links all write a new file and rename it
over the old name), so a running engine that has a file open keeps reading the bytes it had;
nothing in a served revision is ever rewritten in place.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import re
import secrets
import shlex
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from reconciler import hub
from reconciler.actions import (
    Action,
    Copy,
    Download,
    HubFile,
    Link,
    Pin,
    Prune,
    PruneRevisions,
    Reassemble,
    StagePlan,
    Switch,
    Verify,
    runs,
    shorten,
)
from reconciler.clock import utc_iso
from reconciler.components.checkpoint import (
    human_bytes,
    shard_of,
)
from reconciler.components.copystreams import CIPHER_OPTION, stream_count
from reconciler.errors import FactsChangedError, NodeCommandError, PipelineStoppedError, ReconcilerError
from reconciler.execution import ApplyContext
from reconciler.facts.files import parse_manifest
from reconciler.nodeside.copydaemon import MODULE as DAEMON_MODULE
from reconciler.nodeside.copydaemon import USER as DAEMON_USER
from reconciler.nodeside.ops import ReassembleArgs, RemoveRevisionsArgs, SwitchArgs
from reconciler.nodeside.statedir import StateDir
from reconciler.pipeline import Feed, split_streams
from reconciler.progress import Counter
from reconciler.serving import rewrite_exl3_plan
from reconciler.spec import SshTarget
from reconciler.transport.base import LineSink, check, run_program
from reconciler.transport.sshroute import SshRoute, openssh_command, route_for

_INCOMPLETE_HINT = "run `reconciler apply` again: it re-fetches exactly the files named (nothing else is deleted)"


def _read_record(ctx: ApplyContext, node: str, path: str) -> dict[str, object]:
    text = ctx.ops(node).read_text(path)["text"]
    try:
        loaded = json.loads(text) if text is not None else {}
    except ValueError:
        loaded = {}
    return loaded if isinstance(loaded, dict) else {}


def _write_record(ctx: ApplyContext, node: str, path: str, record: dict[str, object]) -> None:
    ctx.ops(node).write_file(path, json.dumps(record, indent=1, sort_keys=True) + "\n")


def _pin(ctx: ApplyContext, action: Action, pin: Pin) -> str:
    record = _read_record(ctx, action.node, pin.record)
    record.update(repo=pin.repo, resolved={"revision": pin.revision, "commit": pin.commit, "since": utc_iso()})
    _write_record(ctx, action.node, pin.record, record)
    return f"{pin.revision} = {pin.commit[:12]}"


def _link(ctx: ApplyContext, action: Action, link: Link) -> str:
    linked = ctx.ops(action.node).link_files(link.target_dir, dict(link.files))
    return f"linked {linked} files into {link.target_dir}"


def _room_for(ctx: ApplyContext, node: str, directory: str, needed: int) -> None:
    """The plan's disk preflight, again just before writing: the disk may have filled since."""
    free = ctx.ops(node).disk_free(directory)
    if free is not None and needed > free:
        raise NodeCommandError(
            f"{node}: needs {human_bytes(needed)} free in {directory}, has {human_bytes(free)}",
            "free space, or point nodes[].model_dir at a larger disk; nothing was written",
        )


def _download(ctx: ApplyContext, action: Action, download: Download) -> str:
    _room_for(ctx, action.node, download.model_dir, sum(item.size or 0 for item in download.files))
    if download.on_node:
        fetched = fetch_on_node(ctx, action.node, download.model_dir, download.files, download.commit, download.refetch)
        return f"{len(fetched)} files fetched by {action.node} itself"
    model = ctx.deployment.model
    forget(download.model_dir, download.refetch)
    only = None if download.whole_repo else [item.path for item in download.files]
    target = download.model_dir
    ctx.progress.line(f"    {action.node}: downloading {download.repo}@{download.commit[:12]} into {target}")
    expected = {item.path: item.sha256 for item in download.files if item.sha256}
    with Landed(ctx, action.node, target, download.cache, expected) as landed:
        listing = hub.fetch(
            model,
            target,
            commit=download.commit,
            report=ctx.progress.line,
            only=only,
            on_bytes=ctx.progress.reporter(),
            on_file=lambda item: landed.add([item.path]),
        )
    return f"{download.repo}@{listing.commit[:12]} in {target}"


class Landed:
    """Files complete on a node, hashed into its cache one batch after another on a thread of
    its own, each published on the node's board once its sha256 matches (a file without a
    known sha256 as soon as it is complete: nothing could verify it later either; a shard's
    part at once, for its reassembly, which verifies the whole shard). A mismatch is left to
    the verify that follows, which re-fetches it. Leaving the block waits for the hashing."""

    def __init__(self, ctx: ApplyContext, node: str, root: str, cache: str | None, expected: dict[str, str]) -> None:
        self.ctx, self.node, self.root, self.cache, self.expected = ctx, node, root, cache, expected
        self.board = ctx.boards.board(node)
        self.queue: list[str] = []
        self.more = threading.Condition()
        self.closed = False
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"hash {node}", daemon=True)

    def __enter__(self) -> Landed:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.more:
            self.closed = True
            self.more.notify_all()
        self.thread.join()
        if self.failure is not None and exc[0] is None:
            raise self.failure

    def add(self, names: list[str]) -> None:
        at_once = [name for name in names if self.cache is None or name not in self.expected or shard_of(name)]
        self.board.publish(at_once)
        with self.more:
            self.queue += [name for name in names if name not in at_once]
            self.more.notify_all()

    def _run(self) -> None:
        while True:
            with self.more:
                while not self.queue and not self.closed:
                    self.more.wait()
                batch, self.queue = self.queue, []
                if not batch and self.closed:
                    return
            try:
                self._hash(batch)
            except BaseException as exc:  # raised on leaving the block, on the action's thread
                self.failure = self.failure or exc

    def _hash(self, names: list[str]) -> None:
        assert self.cache is not None
        with self.ctx.boards.cache_lock(self.node):
            digests = self.ctx.ops(self.node).hash_files(self.root, names, self.cache)
        self.board.publish(name for name in names if digests.get(name) == self.expected[name])


def fetch_on_node(
    ctx: ApplyContext, node: str, model_dir: str, files: list[HubFile], commit: str, force: list[str]
) -> list[str]:
    """A hub-sourced worker downloads for itself with the node-side fetcher (stdlib, Range resume).

    Entries the plan could only name by pattern are listed now, at the commit.
    """
    model = ctx.deployment.model
    if any(item.size is None for item in files):
        listing = hub.list_files(model, commit)
        patterns = [item.path for item in files]
        wanted = [item for item in listing.files if any(fnmatch.fnmatchcase(item.path, p) for p in patterns)]
        files = [HubFile(path=item.path, size=item.size, sha256=item.sha256) for item in wanted]
    entries = [
        {
            "path": item.path,
            "size": item.size,
            "etag": item.sha256 or f"{commit[:16]}",
            "sha256": item.sha256,
            "force": (shard_of(item.path) or item.path) in force,
        }
        for item in files
    ]
    args = {
        "endpoint": hub.endpoint(model) or "https://huggingface.co",
        "repo": model.repo,
        "commit": commit,
        "token": hub.token(model),
        "model_dir": model_dir,
        "files": entries,
    }
    result = run_program(ctx.transport(node), "fetch", "fetch", args, timeout=24 * 3600, on_line=ctx.node_lines(node))
    return list(result["fetched"])


def forget(model_dir: str, names: list[str]) -> None:
    """Make the Hub client fetch these files again: its metadata would call them complete. The
    files themselves stay until the fresh copy is renamed over them."""
    for name in names:
        (Path(model_dir) / hub.DOWNLOAD_CACHE / f"{name}.metadata").unlink(missing_ok=True)


def _manifest_hashes(ctx: ApplyContext, node: str, model_dir: str, manifest: str) -> dict[str, str]:
    """The manifest as it is on the node now (the download may just have brought it)."""
    text = ctx.ops(node).read_text(f"{model_dir}/{manifest}")["text"]
    if text is None:
        raise NodeCommandError(f"{node}: {manifest} missing in {model_dir}", _INCOMPLETE_HINT)
    return parse_manifest(text)


def _reassemble(ctx: ApplyContext, action: Action, reassemble: Reassemble) -> str:
    """Each shard once its parts have landed (at once unless pipelined behind their download),
    published on the node's board when built and its sha256 matched."""
    node = action.node
    wanted = {part: 0 for shard in reassemble.shards for part in shard.parts}
    expected = {shard.name: shard.sha256 for shard in reassemble.shards if shard.sha256}
    if len(expected) < len(reassemble.shards):
        wanted[reassemble.manifest] = 0
    feed = ctx.boards.feed(action, node, wanted)
    if len(expected) < len(reassemble.shards):
        feed.wait_for([reassemble.manifest])
        manifest = _manifest_hashes(ctx, node, reassemble.model_dir, reassemble.manifest)
        expected = {**{s.name: manifest[s.name] for s in reassemble.shards if s.name in manifest}, **expected}
    built: dict[str, int] = {}
    for shard in reassemble.shards:
        feed.wait_for(shard.parts)
        args = ReassembleArgs(
            model_dir=reassemble.model_dir,
            shards=[shard.name],
            expected={name: digest for name, digest in expected.items() if name == shard.name},
            keep_parts=reassemble.keep_parts,
            cache=reassemble.cache,
        )
        with ctx.boards.cache_lock(node):
            built.update(ctx.ops(node).reassemble(args))
        if shard.name in expected:
            ctx.boards.board(node).publish([shard.name])
    return ", ".join(f"{name} ({human_bytes(size)})" for name, size in built.items())


def _hash(ctx: ApplyContext, node: str, verify: Verify, names: list[str], deep: bool) -> dict[str, str | None]:
    return ctx.ops(node).hash_files(verify.model_dir, names, verify.cache, deep=deep)


def _differing(expected: dict[str, str], actual: dict[str, str | None]) -> tuple[list[str], list[str]]:
    missing = sorted(name for name in expected if actual.get(name) is None)
    wrong = sorted(name for name in expected if actual.get(name) not in (None, expected[name]))
    return missing, wrong


def _verify(ctx: ApplyContext, action: Action, verify: Verify) -> str:
    """Hash what changed (or everything, deep) against the plan's hashes and the manifest's.

    The hashes are the plan's (the Hub's sha256 and the manifest's) plus the manifest's entries
    as the file is on the node now: a fresh node gets the manifest with the download before. A
    file that differs is the world differing from the facts the plan was made from: its hash
    is in the node's hash cache now, the verify reports it, and the next plan re-fetches it
    (and restarts a group that may have read it).
    """
    node = action.node
    manifest = _manifest_hashes(ctx, node, verify.model_dir, verify.manifest)
    expected = {**{name: digest for name, digest in verify.files.items() if digest}, **manifest}
    missing, wrong = _differing(expected, _hash(ctx, node, verify, sorted(expected), verify.deep))
    if missing:
        raise NodeCommandError(f"{node}: files missing after the transfer: {shorten(missing)}", _INCOMPLETE_HINT)
    if wrong:
        raise FactsChangedError(
            f"{node}: sha256 differs from the manifest's and the Hub's: {shorten(wrong)}",
            "the next plan fetches exactly these files again: `reconciler apply` (it plans again by itself)",
            files=wrong,
        )
    return f"{len(expected)} files match their sha256"


def _copy(ctx: ApplyContext, action: Action, copy: Copy) -> str:
    _room_for(ctx, action.node, copy.destination_dir, copy.bytes)
    names = copy.files if copy.files is not None else sorted(copy.sizes)
    sizes = {name: copy.sizes.get(name, 0) for name in names}
    recopy = copy.files is not None
    node, origin = action.node, copy.source_node
    feed = ctx.boards.feed(action, origin, sizes)
    with Landed(ctx, node, copy.destination_dir, copy.cache, copy.hashes) as landed:
        streams = _rsync(
            ctx,
            node,
            copy.source_dir,
            copy.destination_dir,
            sizes,
            recopy,
            copy.bytes,
            copy.fabric,
            origin,
            feed=feed,
            landed=landed.add,
        )
    return f"copied {len(names)} files from {origin} to {node}:{copy.destination_dir} in {streams} rsync streams"


def _rsync(
    ctx: ApplyContext,
    node: str,
    source_dir: str,
    destination: str,
    sizes: dict[str, int],
    recopy: bool,
    size: int | None = None,
    fabric: tuple[str, str] | None = None,
    origin: str | None = None,
    *,
    feed: Feed | None = None,
    landed: Callable[[list[str]], None] | None = None,
) -> int:
    """rsync head -> worker in parallel streams; resumable. Returns the number of streams.

    `sizes`: the files to copy (relative names) and their sizes, which the streams are split
    by. `recopy`: copy them again ignoring size and time (a flipped byte keeps both), else
    files already complete on the worker are skipped. Nothing else on the worker is touched.
    `size`: the bytes to copy, if known. `fabric`: (origin, worker) fabric addresses, for a
    daemon on the worker's (see nodeside/copydaemon.py); without them, over SSH. `origin`:
    the node whose files are sent and that runs the streams, the head unless named. `feed`:
    where the files come from as they are ready on the origin (pipelined), else all at once;
    `landed` is told each batch once it is on the worker.
    """
    origin = origin or ctx.deployment.head.name
    worker = ctx.node(node)
    if worker.ssh is None:
        raise NodeCommandError(f"{node}: a peer copy needs an ssh: target", "add nodes[].ssh for this worker")
    if fabric is None and origin != ctx.deployment.head.name:
        raise NodeCommandError(
            f"{node}: a copy from {origin} goes over the fabric, and its addresses are not known",
            "run `reconciler plan` again: without fabric addresses the head copies itself, over SSH",
        )
    feed = feed or Feed(ctx.boards.board(origin), sizes, released=True)
    ctx.ops(node).mkdirs(destination)
    # Sized by the head's cores (this process runs there): the nodes are alike.
    count = stream_count(os.cpu_count(), len(sizes))
    # Everything ready now: the streams split as a plain copy's, one rsync each.
    fixed = split_streams(sizes, count) if feed.all_ready() else None
    count = len(fixed) if fixed is not None else count
    label = f"{origin}->{node}"
    meter = StreamMeter(ctx.progress.reporter(label), ctx.progress.sink(label), size, count)
    transport = ctx.transport(origin)
    # A pipelined stream runs one rsync per batch, each a connection of its own: room for the
    # next to connect before the daemon has reaped the one before.
    connections = count if fixed is not None else 2 * count
    with _channel(ctx, node, worker.ssh, destination, fabric, connections) as channel:
        waiting = "" if fixed is not None else f", each file once it is verified on {origin}"
        ctx.progress.line(f"    {label}: {count} rsync streams {channel.shown}{waiting}")

        def send(index: int, names: list[str]) -> None:
            # rsync's progress goes to stdout; redirect it to stderr so it streams like ours.
            command = ["sh", "-c", 'exec "$@" 1>&2', "rsync", *channel.argv(source_dir, names, recopy)]
            result = transport.run(command, stdin=channel.stdin, timeout=24 * 3600, on_line=meter.lines(index))
            meter.finished(index)
            check(result, origin, "rsync to " + node)
            if landed is not None:
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
    ctx: ApplyContext, node: str, ssh: SshTarget, destination: str, fabric: tuple[str, str] | None, connections: int
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
    directory = StateDir(ctx.deployment.state_dir).copy_daemon
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


def daemon_argv(address: str, port: int, source_dir: str, names: list[str], *, recopy: bool) -> list[str]:
    """One stream to the copy's rsync daemon: exactly these files, by name relative to
    `source_dir`; the password on stdin (never in argv), the module root is the destination."""
    source = f"{source_dir.rstrip('/')}/"
    again = ["--ignore-times"] if recopy else []
    argv = ["rsync", "-a", "--partial", "--info=progress2", *_EXCLUDES, "--password-file=-", "-R", *again]
    return [*argv, *(f"{source}./{name}" for name in names), f"rsync://{DAEMON_USER}@{address}:{port}/{DAEMON_MODULE}/"]


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
                self._counters[index] = counter if before is None else _plus(before, counter)
                self._report(self._combined())

        return take

    def finished(self, index: int) -> None:
        """One rsync of stream `index` ended: the stream's next one counts on from there."""
        with self._lock:
            self._before[index] = self._counters[index]

    def _combined(self) -> Counter:
        """Every stream's bytes; totals and file counts once every stream has said its own."""
        known = [counter for counter in self._counters if counter is not None]
        done = sum(counter.done for counter in known)
        everyone = len(known) == len(self._counters)
        total: int | None = max(self._size, done) if self._size else None
        if total is None and everyone:
            total = _sum_of_all([counter.total for counter in known])
        files = _sum_of_all([counter.files for counter in known]) if everyone else None
        files_done = _sum_of_all([counter.files_done for counter in known]) if everyone else None
        return Counter("copy", done, total, files_done, files)


def _plus(before: Counter, now: Counter) -> Counter:
    total = None if before.total is None or now.total is None else before.total + now.total
    return Counter(
        "copy",
        before.done + now.done,
        total,
        _sum_of_all([before.files_done, now.files_done]),
        _sum_of_all([before.files, now.files]),
    )


def _sum_of_all(values: list[int | None]) -> int | None:
    return None if any(value is None for value in values) else sum(value or 0 for value in values)


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
    cipher preference (copystreams.CIPHER_OPTION).
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
    source = f"{source_dir.rstrip('/')}/"
    if only is None:
        return [*argv, source, remote]
    again = ["--ignore-times"] if recopy else []
    return [*argv, "-R", *again, *(f"{source}./{name}" for name in only), remote]


def _stage_plan(ctx: ApplyContext, action: Action, stage: StagePlan) -> str:
    content = stage.content
    if content is None:
        text = ctx.ops(action.node).read_text(stage.source)["text"]
        if text is None:
            message = f"{action.node}: {stage.source} is missing; the checkpoint is incomplete"
            raise NodeCommandError(message, _INCOMPLETE_HINT)
        try:
            content = rewrite_exl3_plan(text)
        except (ValueError, KeyError, AttributeError, TypeError):
            raise NodeCommandError(
                f"{action.node}: {stage.source} is not an EXL3 plan (JSON with a qdir)", _INCOMPLETE_HINT
            ) from None
    directory = stage.target.rsplit("/", 1)[0]
    node = ctx.ops(action.node)
    node.mkdirs(directory, ctx.state_dir(action.node).engine_cache)
    # World-readable like the checkpoint it comes from: the engine in the container reads it.
    node.write_file(stage.target, content, mode=0o644)
    return f"staged {stage.target}"


def _prune(ctx: ApplyContext, action: Action, prune: Prune) -> str:
    removed = ctx.ops(action.node).prune_parts(prune.model_dir)
    return f"deleted {len(removed)} part files"


def _switch(ctx: ApplyContext, action: Action, switch: Switch) -> str:
    args = SwitchArgs(model_dir=switch.model_dir, target=switch.target, legacy_to=switch.legacy_to)
    ctx.ops(action.node).switch_model_dir(args)
    record = _read_record(ctx, action.node, switch.record)
    record.update(repo=switch.repo, history=switch.history, serving_since=utc_iso())
    _write_record(ctx, action.node, switch.record, record)
    return f"{switch.model_dir} -> {switch.target}"


def _prune_revisions(ctx: ApplyContext, action: Action, prune: PruneRevisions) -> str:
    args = RemoveRevisionsArgs(
        model_dir=prune.model_dir, remove=list(prune.remove), shared_only=list(prune.shared_only)
    )
    result = ctx.ops(action.node).remove_revisions(args)
    kept = result["kept"]
    note = f"; kept files found nowhere else: {shorten(kept)}" if kept else ""
    return f"removed {len(result['removed'])} revision directories{note}"


EXECUTORS = (
    runs(Pin, _pin),
    runs(Link, _link),
    runs(Download, _download),
    runs(Reassemble, _reassemble),
    runs(Verify, _verify),
    runs(Copy, _copy),
    runs(StagePlan, _stage_plan),
    runs(Prune, _prune),
    runs(Switch, _switch),
    runs(PruneRevisions, _prune_revisions),
)
