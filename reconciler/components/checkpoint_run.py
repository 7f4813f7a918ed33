"""The checkpoint's executors: each runs the payload its action carries, on its node.

Every write that lands in a revision directory replaces a file whole (the Hub client's and the
node-side fetcher's downloads, rsync, reassembly and links all write a new file and rename it
over the old name), so a running engine that has a file open keeps reading the bytes it had;
nothing in a served revision is ever rewritten in place.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from reconciler import hub
from reconciler.actions import (
    Action,
    Copy,
    Download,
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
from reconciler.components.assessment import rewritten_plan, shard_of
from reconciler.components.rsync import rsync_streams
from reconciler.errors import FactsChangedError, NodeCommandError
from reconciler.execution import ApplyContext
from reconciler.fsutil import human_bytes
from reconciler.nodeside.ops import ReassembleArgs, RemoveRevisionsArgs, SwitchArgs
from reconciler.repofiles import HubFile, parse_manifest
from reconciler.transport.base import run_program

_INCOMPLETE_HINT = "run `reconciler apply` again: it re-fetches exactly the files named (nothing else is deleted)"


def _update_record(ctx: ApplyContext, node: str, path: str, **fields: object) -> None:
    """Set these fields of the node's checkpoint record, keeping the rest (an unreadable record
    starts over)."""
    ops = ctx.ops(node)
    text = ops.read_text(path)["text"]
    try:
        loaded = json.loads(text) if text is not None else {}
    except ValueError:
        loaded = {}
    record = {**(loaded if isinstance(loaded, dict) else {}), **fields}
    ops.write_file(path, json.dumps(record, indent=1, sort_keys=True) + "\n")


def _pin(ctx: ApplyContext, action: Action, pin: Pin) -> str:
    resolved = {"revision": pin.revision, "commit": pin.commit, "since": utc_iso()}
    _update_record(ctx, action.node, pin.record, repo=pin.repo, resolved=resolved)
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
    _room_for(ctx, action.node, download.model_dir, sum(item.size for item in download.files))
    if download.on_node:
        fetched = fetch_on_node(ctx, action.node, download.model_dir, download.files, download.commit, download.refetch)
        return f"{len(fetched)} files fetched by {action.node} itself"
    target = download.model_dir
    forget(target, download.refetch)
    ctx.progress.line(f"    {action.node}: downloading {download.repo}@{download.commit[:12]} into {target}")
    expected = {item.path: item.sha256 for item in download.files if item.sha256}
    with Landed(ctx, action.node, target, download.cache, expected) as landed:
        listing = hub.fetch(
            ctx.deployment.model,
            target,
            commit=download.commit,
            report=ctx.progress.line,
            files=download.files,
            on_bytes=ctx.progress.reporter(),
            on_file=lambda item: landed.add([item.path]),
        )
    return f"{download.repo}@{listing.commit[:12]} in {target}"


class Landed:
    """Files complete on a node, hashed into its cache one batch after another on a thread of
    its own, each published on the node's board once its sha256 matches (a file without a
    known sha256 as soon as it is complete: nothing could verify it later either; a shard's
    part at once, for its reassembly, which verifies the whole shard). A mismatch is left to
    the verify that follows, which reports it. Leaving the block waits for the hashing."""

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
    """A hub-sourced worker downloads for itself with the node-side fetcher (stdlib, Range resume):
    exactly the files the plan's listing names."""
    model = ctx.deployment.model
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
    # A shard the Hub gave no sha256 for is checked against the manifest, once it has landed.
    from_manifest = len(expected) < len(reassemble.shards)
    if from_manifest:
        wanted[reassemble.manifest] = 0
    feed = ctx.boards.feed(action, node, wanted)
    if from_manifest:
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
    actual = ctx.ops(node).hash_files(verify.model_dir, sorted(expected), verify.cache, deep=verify.deep)
    missing = sorted(name for name in expected if actual.get(name) is None)
    wrong = sorted(name for name in expected if actual.get(name) not in (None, expected[name]))
    if missing:
        raise NodeCommandError(f"{node}: files missing after the transfer: {shorten(missing)}", _INCOMPLETE_HINT)
    if wrong:
        raise FactsChangedError(
            f"{node}: sha256 differs from the manifest's and the Hub's: {shorten(wrong)}",
            "the next plan fetches exactly these files again: `reconciler apply` (it plans again by itself)",
            node=node,
            files=wrong,
        )
    return f"{len(expected)} files match their sha256"


def _copy(ctx: ApplyContext, action: Action, copy: Copy) -> str:
    _room_for(ctx, action.node, copy.destination_dir, copy.bytes)
    names = copy.files if copy.files is not None else sorted(copy.sizes)
    sizes = {name: copy.sizes.get(name, 0) for name in names}
    node, origin = action.node, copy.source_node
    feed = ctx.boards.feed(action, origin, sizes)
    with Landed(ctx, node, copy.destination_dir, copy.cache, copy.hashes) as landed:
        streams = rsync_streams(ctx, node, copy, sizes, feed, landed.add)
    return f"copied {len(names)} files from {origin} to {node}:{copy.destination_dir} in {streams} rsync streams"


def _stage_plan(ctx: ApplyContext, action: Action, stage: StagePlan) -> str:
    content = stage.content
    if content is None:
        text = ctx.ops(action.node).read_text(stage.source)["text"]
        content = rewritten_plan(text)
        if content is None:
            problem = (
                "is missing; the checkpoint is incomplete" if text is None else "is not an EXL3 plan (JSON with a qdir)"
            )
            raise NodeCommandError(f"{action.node}: {stage.source} {problem}", _INCOMPLETE_HINT)
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
    _update_record(ctx, action.node, switch.record, repo=switch.repo, history=switch.history, serving_since=utc_iso())
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
