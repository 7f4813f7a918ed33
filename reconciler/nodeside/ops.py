"""Runs ON a node (stdlib only): the small file operations `apply` needs there.

Each operation takes one dict of arguments and returns one result, both declared below as
TypedDicts: the head's typed client (reconciler/nodeops.py) calls each operation through its
declaration, so mypy checks the head's arguments and its reading of the result against this
file, and the head validates what a node answers against the same declaration. `run` is the
entry point: it prints the result as one line of JSON. Every write is
atomic (temporary file in the same directory, fsync, rename) so an interrupted apply never
leaves a half-written key, plan or shard behind. The temporary file is created exclusively and
never through a symlink, so nothing placed beforehand can redirect what is written (the key).
The state dir is private (0700) and what is written there is 0600 unless the ranks must read
it. Progress goes to stderr as structured lines (`Meter`), which the head renders.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import sys
from collections.abc import Callable
from typing import Any, TypedDict

from reconciler.nodeside.common import (
    CHUNK,
    Meter,
    admin_command,
    child_environment,
    free_bytes,
    is_commit,
    key_file_state,
    pid_of,
    reply,
    runs_command,
    stop_pid,
)
from reconciler.nodeside.statedir import StateDir

# Hashing, thread pools, processes and rmtree import their modules where they are used: the head
# imports this module for atomic_write on every command, and every call on a node pays for what
# its program imports, while most calls need none of them.

PART_RE = re.compile(r"^(?P<shard>.+\.safetensors)\.part(?P<index>[0-9]{2})$")


# --- the operations' arguments and results -------------------------------------------------
# Optional arguments live in a `total=False` subclass (nodes may run a python3 older than the
# head's, and NotRequired is 3.11's).


# The arguments most operations share, declared once.
class PathArgs(TypedDict):
    path: str


class ModelDirArgs(TypedDict):
    model_dir: str


class StateDirArgs(TypedDict):
    state_dir: str


class WriteFileRequired(PathArgs):
    content: str


class WriteFileArgs(WriteFileRequired, total=False):
    mode: int
    keep_existing: bool


class WriteFileResult(TypedDict):
    written: bool


class ChmodArgs(PathArgs):
    mode: int


class Done(TypedDict):
    ok: bool


class ReadTextArgs(PathArgs, total=False):
    limit: int
    errors: str


class ReadTextResult(TypedDict):
    text: str | None
    error: str | None


class MkdirsArgs(TypedDict):
    paths: list[str]


class HashFilesRequired(ModelDirArgs):
    cache: str
    files: list[str]


class HashFilesArgs(HashFilesRequired, total=False):
    deep: bool


class ReassembleRequired(ModelDirArgs):
    shards: list[str]


class ReassembleArgs(ReassembleRequired, total=False):
    expected: dict[str, str]
    cache: str | None
    keep_parts: bool


class Removed(TypedDict):
    removed: list[str]


class GuardStartRequired(StateDirArgs):
    program: str
    config: dict[str, Any]


class GuardStartArgs(GuardStartRequired, total=False):
    clear_trip: bool


class GuardStarted(TypedDict):
    pid: int


class GuardStopped(TypedDict):
    stopped: bool


class DiskFree(TypedDict):
    free: int | None


class LinkFilesArgs(TypedDict):
    target_dir: str
    files: dict[str, str]


class Linked(TypedDict):
    linked: int


class Switched(ModelDirArgs):
    target: str


class SwitchArgs(Switched, total=False):
    legacy_to: str | None


class RemoveRevisionsRequired(ModelDirArgs):
    remove: list[str]


class RemoveRevisionsArgs(RemoveRevisionsRequired, total=False):
    shared_only: list[str]


class KeyFileState(TypedDict, total=False):
    present: bool
    size: int
    mode: int
    uid: int
    gid: int
    version: str


class RevisionsRemoved(Removed):
    kept: list[str]


class FootprintArgs(StateDirArgs):
    model_dir: str


class TreeUsage(TypedDict):
    path: str
    # Every file under it, each inode once; what removing it frees (files with no link outside
    # it: a revision staged beside another shares its unchanged files by hard links).
    bytes: int
    freed: int


class RevisionUsage(TreeUsage):
    serving: bool
    # Unfinished downloads (`<file>.<etag>.partial`) and split parts (`.partNN`) in it.
    partial_bytes: int


class PulledImage(TypedDict):
    ref: str
    id: str


class TreesRemoved(Removed):
    left: list[str]


class Footprint(TypedDict):
    """What the reconciler left on a node: its state dir, the guard, the checkpoint, its pulls."""

    state_dir: TreeUsage | None
    engine_cache_bytes: int
    # The image as its registry sent it, on nodes that pass it on (image_source: peer).
    image_store_bytes: int
    guard_running: bool
    model_dir: str
    # "link" (to a revision dir), "dir" (from before revisions), "absent"
    model_dir_kind: str
    revisions: list[RevisionUsage]
    pulled: list[PulledImage]


class RemoveTreesArgs(TypedDict):
    state_dir: str
    model_dir: str
    # What to remove: "state" (the state dir), "checkpoint" (model_dir and every revision dir).
    remove: list[str]


def _token(size: int) -> str:
    """A random part for a temporary name (os.urandom, the source `secrets` uses)."""
    return os.urandom(size).hex()


PRIVATE = 0o600
_EXCLUSIVE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def atomic_write(path: str, data: bytes, mode: int = PRIVATE, *, durable: bool = True) -> None:
    """Write `data` to `path` whole or not at all; `path` itself is replaced, never followed.

    Without `durable` nothing is fsynced: readers still see the old or the new file whole, but a
    power cut may lose the write (for a status file rewritten every few seconds, next to a disk
    busy with a download, where an fsync can wait behind gigabytes of dirty pages)."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    descriptor, temporary = _exclusive_temporary(path, mode)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            if durable:
                os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    if durable:
        _fsync_directory(directory)


def _exclusive_temporary(path: str, mode: int) -> tuple[int, str]:
    for _ in range(100):
        temporary = f"{path}.tmp-{_token(8)}"
        try:
            return os.open(temporary, _EXCLUSIVE, mode), temporary
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def _fsync_directory(directory: str) -> None:
    """Make the rename itself durable (a power cut must not bring back the old key or plan)."""
    with contextlib.suppress(OSError):
        descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def private_dir(path: str) -> None:
    """Create the state dir 0700, or take group and other access away from ours."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.stat(path)
    if info.st_uid == os.getuid() and info.st_mode & 0o077:
        os.chmod(path, 0o700)


def write_file(args: WriteFileArgs) -> WriteFileResult:
    """Write a file atomically; with `keep_existing`, a non-empty file is never replaced."""
    path = os.path.expanduser(args["path"])
    if args.get("keep_existing") and os.path.exists(path) and os.path.getsize(path) > 0:
        return {"written": False}
    atomic_write(path, args["content"].encode(), int(args.get("mode", PRIVATE)))
    return {"written": True}


def chmod(args: ChmodArgs) -> Done:
    os.chmod(os.path.expanduser(args["path"]), int(args["mode"]))
    return {"ok": True}


READ_LIMIT = 64 * 1024 * 1024


def read_text(args: ReadTextArgs) -> ReadTextResult:
    """A regular file's text (`errors` as for bytes.decode), or None and why: never a FIFO or a
    device (they would block or never end), never more than `limit` bytes."""
    limit = int(args.get("limit", READ_LIMIT))
    try:
        descriptor = os.open(os.path.expanduser(args["path"]), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return {"text": None, "error": exc.strerror}
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        return {"text": None, "error": "not a regular file"}
    with os.fdopen(descriptor, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        return {"text": None, "error": f"larger than {limit} bytes"}
    try:
        return {"text": data.decode("utf-8", args.get("errors", "strict")), "error": None}
    except UnicodeDecodeError as exc:
        return {"text": None, "error": f"not UTF-8 (byte {exc.start})"}


def mkdirs(args: MkdirsArgs) -> Done:
    for path in args["paths"]:
        os.makedirs(os.path.expanduser(path), exist_ok=True)
    return {"ok": True}


def _load_cache(path: str) -> dict[str, list[Any]]:
    """The hash cache's entries of the one shape it holds, [size, mtime_ns, inode, sha256]; any
    other (a damaged or hand-edited file) is left out, so its file is hashed again."""
    try:
        with open(path, encoding="utf-8") as handle:
            loaded = json.load(handle)
    except (OSError, ValueError):
        return {}
    if not isinstance(loaded, dict):
        return {}
    return {path: entry for path, entry in loaded.items() if _cache_entry(entry)}


def _cache_entry(entry: object) -> bool:
    return (
        isinstance(entry, list)
        and len(entry) == 4
        and all(isinstance(number, int) and not isinstance(number, bool) for number in entry[:3])
        and isinstance(entry[3], str)
    )


def _sha256(path: str, meter: Meter) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
            meter.add(len(block))
    meter.file_done()
    return digest.hexdigest()


def hash_files(args: HashFilesArgs) -> dict[str, str | None]:
    """sha256 of each file, from the cache when (size, mtime_ns, inode) still match.

    Files are hashed in parallel (hashlib releases the GIL on large blocks), so first-time
    verification runs at the speed of the disk or of all cores, like parallel `sha256sum`.
    """
    import concurrent.futures

    root = os.path.expanduser(args["model_dir"]).rstrip("/")
    cache_path = os.path.expanduser(args["cache"])
    cache = _load_cache(cache_path)
    deep = bool(args.get("deep"))
    keys: dict[str, list[int]] = {}
    for relative in args["files"]:
        try:
            info = os.stat(f"{root}/{relative}")
        except OSError:
            continue
        keys[relative] = [info.st_size, info.st_mtime_ns, info.st_ino]
    by_inode = {tuple(entry[:3]): entry[3] for entry in cache.values()}  # _load_cache kept only whole entries
    for name, key in keys.items():
        # A file hardlinked into another revision: same inode, size and mtime, so the same bytes.
        if not deep and (cache.get(f"{root}/{name}") or [])[:3] != key and tuple(key) in by_inode:
            cache[f"{root}/{name}"] = [*key, by_inode[tuple(key)]]
    stale = [name for name, key in keys.items() if deep or (cache.get(f"{root}/{name}") or [])[:3] != key]
    meter = Meter("hash", sum(keys[name][0] for name in stale), len(stale))
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        digests = dict(zip(stale, pool.map(lambda name: _sha256(f"{root}/{name}", meter), stale), strict=True))
    for name, digest in digests.items():
        cache[f"{root}/{name}"] = [*keys[name], digest]
    if digests:
        atomic_write(cache_path, json.dumps(cache, sort_keys=True).encode())
    return {name: (cache[f"{root}/{name}"][3] if name in keys else None) for name in args["files"]}


def reassemble(args: ReassembleArgs) -> dict[str, int]:
    """Concatenate each shard's .partNN files into the shard, one shard at a time.

    The shard is hashed as it is written; when it matches `expected` it goes into the hash
    cache and, unless `keep_parts`, its parts are deleted before the next shard starts, so
    the disk never holds more than one shard beyond the parts. A mismatch deletes the new
    shard, keeps the parts, and fails.
    """
    import functools

    root = os.path.expanduser(args["model_dir"])
    expected: dict[str, str] = args.get("expected") or {}
    cache = args.get("cache")
    cache_path = os.path.expanduser(cache) if cache else None
    names = sorted(os.listdir(root))
    parts_of = {
        shard: [name for name in names if (match := PART_RE.match(name)) and match.group("shard") == shard]
        for shard in args["shards"]
    }
    total = sum(os.path.getsize(os.path.join(root, part)) for parts in parts_of.values() for part in parts)
    meter = Meter("reassemble", total, len(parts_of))
    built = {}
    for shard, parts in parts_of.items():
        if not parts:
            raise SystemExit(f"no .partNN files for {shard} in {root}")
        target = os.path.join(root, shard)
        digest = _assemble(root, parts, f"{target}.assembling", functools.partial(meter.add, name=shard))
        if shard in expected and digest != expected[shard]:
            os.unlink(f"{target}.assembling")
            raise SystemExit(f"{shard}: reassembled sha256 {digest} does not match the manifest; parts kept")
        os.replace(f"{target}.assembling", target)
        if cache_path is not None:
            _remember(cache_path, target, digest)
        if shard in expected and not args.get("keep_parts"):
            for part in parts:
                os.unlink(os.path.join(root, part))
        built[shard] = os.path.getsize(target)
        meter.file_done()
    return built


def _assemble(root: str, parts: list[str], temporary: str, count: Callable[[int], None]) -> str:
    import hashlib

    digest = hashlib.sha256()
    # Never through a symlink planted at the temporary name.
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(descriptor, "wb") as out:
        for part in parts:
            with open(os.path.join(root, part), "rb") as source:
                while block := source.read(CHUNK):
                    out.write(block)
                    digest.update(block)
                    count(len(block))
        out.flush()
        os.fsync(out.fileno())
    return digest.hexdigest()


def _remember(cache_path: str, path: str, digest: str) -> None:
    cache = _load_cache(cache_path)
    info = os.stat(path)
    cache[path] = [info.st_size, info.st_mtime_ns, info.st_ino, digest]
    atomic_write(cache_path, json.dumps(cache, sort_keys=True).encode())


def prune_parts(args: ModelDirArgs) -> Removed:
    """Delete .partNN files whose native shard exists; nothing else is ever deleted."""
    root = os.path.expanduser(args["model_dir"])
    removed = []
    for name in sorted(os.listdir(root)):
        match = PART_RE.match(name)
        if match and os.path.exists(os.path.join(root, match.group("shard"))):
            os.unlink(os.path.join(root, name))
            removed.append(name)
    return {"removed": removed}


def guard_start(args: GuardStartArgs) -> GuardStarted:
    """Install the guard program and its config in the state dir, then (re)start it detached."""
    import subprocess

    state_dir = os.path.expanduser(args["state_dir"])
    layout = StateDir(state_dir)
    private_dir(state_dir)
    stop_pid(layout.guard_pid, _guard_command(layout))
    atomic_write(layout.guard_program, args["program"].encode())
    atomic_write(layout.guard_config, json.dumps(args["config"]).encode())
    if args.get("clear_trip"):
        remove_file({"path": layout.guard_trip})
    process = subprocess.Popen(
        [sys.executable, layout.guard_program, state_dir],
        env=child_environment(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    atomic_write(layout.guard_pid, f"{process.pid}\n".encode())
    return {"pid": process.pid}


def _guard_command(layout: StateDir) -> list[str]:
    """What the guard's command line holds: its program in the private state dir, which nothing
    else runs. How its pid file is told from a pid the kernel has since given to another program."""
    return [layout.guard_program]


def guard_stop(args: StateDirArgs) -> GuardStopped:
    layout = StateDir(os.path.expanduser(args["state_dir"]))
    stopped = stop_pid(layout.guard_pid, _guard_command(layout))
    remove_file({"path": layout.guard_pid})
    return {"stopped": stopped}


def disk_free(args: PathArgs) -> DiskFree:
    """Free bytes where `path` is, or would be once created."""
    return {"free": free_bytes(os.path.expanduser(args["path"]))}


def key_file(args: PathArgs) -> KeyFileState:
    """The key file's owner and version, never its content."""
    state: KeyFileState = key_file_state(os.path.expanduser(args["path"]))  # type: ignore[assignment]
    return state


def remove_file(args: PathArgs) -> Done:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.expanduser(args["path"]))
    return {"ok": True}


def _inside(root: str, relative: str) -> str:
    path = os.path.normpath(os.path.join(root, relative))
    if not path.startswith(root.rstrip("/") + "/"):
        raise SystemExit(f"refusing {relative!r}: it would land outside {root}")
    return path


def link_files(args: LinkFilesArgs) -> Linked:
    """Hardlink existing files into a new revision dir: {relative name: existing path}.

    A link adds a name and changes nothing of the file (its inode, bytes and mtime stay), so the
    revision being served is untouched; an existing name is replaced by a rename, never written.
    """
    root = os.path.expanduser(args["target_dir"]).rstrip("/")
    linked = 0
    for relative, source in sorted(args["files"].items()):
        target = _inside(root, relative)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.exists(target) and os.stat(target).st_ino == os.stat(source).st_ino:
            continue
        temporary = f"{target}.link-{_token(6)}"
        os.link(source, temporary)
        os.replace(temporary, target)
        linked += 1
    return {"linked": linked}


def _is_revision_of(model_dir: str, path: str) -> bool:
    base = model_dir.rstrip("/")
    head, at, commit = path.rstrip("/").partition("@")
    return (head == base and bool(at) and is_commit(commit)) or path == f"{base}.pre-revisions"


def switch_model_dir(args: SwitchArgs) -> Switched:
    """Point model_dir at a revision dir: a symlink swapped in by rename. A model_dir that is a
    real directory (from before revisions) is first moved to `legacy_to`."""
    model_dir = os.path.expanduser(args["model_dir"]).rstrip("/")
    target = os.path.expanduser(args["target"]).rstrip("/")
    if not _is_revision_of(model_dir, target) or not os.path.isdir(target):
        raise SystemExit(f"refusing to point {model_dir} at {target}: not one of its revision directories")
    if os.path.isdir(model_dir) and not os.path.islink(model_dir):
        legacy_to = args.get("legacy_to")
        if not legacy_to or not _is_revision_of(model_dir, legacy_to) or os.path.exists(legacy_to):
            raise SystemExit(f"{model_dir} is a directory and there is no free place to move it to ({legacy_to})")
        os.rename(model_dir, legacy_to)
    temporary = f"{model_dir}.link-{_token(6)}"
    os.symlink(os.path.basename(target), temporary)
    os.replace(temporary, model_dir)
    _fsync_directory(os.path.dirname(model_dir))
    return {"model_dir": model_dir, "target": target}


def _remove_shared(root: str) -> list[str]:
    """Remove the files of a tree that live on in another revision (more than one link); what is
    left (files found nowhere else) stays, and is returned."""
    kept: list[str] = []
    for directory, _, names in os.walk(root, topdown=False):
        for name in names:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode) and info.st_nlink < 2:
                kept.append(os.path.relpath(path, root))
            else:
                os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(directory)
    return kept


def remove_revisions(args: RemoveRevisionsArgs) -> RevisionsRemoved:
    """Remove revision dirs of model_dir (never the one it links to, never anything else)."""
    import shutil

    model_dir = os.path.expanduser(args["model_dir"]).rstrip("/")
    serving = os.path.realpath(model_dir)
    removed, kept = [], []
    for path in args["remove"]:
        path = os.path.expanduser(path).rstrip("/")
        if not _is_revision_of(model_dir, path) or os.path.realpath(path) == serving or not os.path.isdir(path):
            continue
        shutil.rmtree(path)
        removed.append(path)
    for path in args.get("shared_only") or []:
        path = os.path.expanduser(path).rstrip("/")
        if _is_revision_of(model_dir, path) and os.path.isdir(path) and os.path.realpath(path) != serving:
            kept += _remove_shared(path)
            if not os.path.exists(path):
                removed.append(path)
    return {"removed": removed, "kept": kept}


def _usage(root: str) -> tuple[int, int]:
    """Bytes under `root` (each inode once) and the bytes removing it frees."""
    sizes: dict[tuple[int, int], int] = {}
    links_inside: dict[tuple[int, int], int] = {}
    links_total: dict[tuple[int, int], int] = {}
    for directory, _, names in os.walk(root):
        for name in names:
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(directory, name))
                if not stat.S_ISREG(info.st_mode):
                    continue
                inode = (info.st_dev, info.st_ino)
                sizes[inode] = info.st_blocks * 512 if info.st_blocks else info.st_size
                links_inside[inode] = links_inside.get(inode, 0) + 1
                links_total[inode] = info.st_nlink
    freed = sum(size for inode, size in sizes.items() if links_inside[inode] >= links_total[inode])
    return sum(sizes.values()), freed


def _partial_bytes(root: str) -> int:
    total = 0
    for directory, _, names in os.walk(root):
        for name in names:
            if name.endswith(".partial") or PART_RE.match(name):
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(directory, name)).st_size
    return total


def _revision_dirs(model_dir: str) -> list[str]:
    parent = os.path.dirname(model_dir) or "."
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return []
    found = [os.path.join(parent, name) for name in names]
    return [path for path in found if _is_revision_of(model_dir, path) and os.path.isdir(path)]


def _pulled(layout: StateDir) -> list[PulledImage]:
    """The images this node's pull records name (one small JSON file a pull): the ref and the
    image id it pulled, so a ref the owner pulled again later (another id) is not ours."""
    found: list[PulledImage] = []
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(layout.pulled_images)):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                with open(os.path.join(layout.pulled_images, name), encoding="utf-8") as handle:
                    record = json.loads(handle.read(4096))
                ref, image_id = record.get("ref"), record.get("id")
                if isinstance(ref, str) and isinstance(image_id, str):
                    found.append({"ref": ref, "id": image_id})
    return found


def footprint(args: FootprintArgs) -> Footprint:
    """Everything of ours on this node, measured; nothing is created or changed (no state dir
    is made for it: an uninstalled node stays clean)."""
    layout = StateDir(os.path.expanduser(args["state_dir"]))
    model_dir = os.path.expanduser(args["model_dir"]).rstrip("/")
    state: TreeUsage | None = None
    if os.path.isdir(layout.root):
        size, freed = _usage(layout.root)
        state = {"path": layout.root, "bytes": size, "freed": freed}
    kind = "link" if os.path.islink(model_dir) else "dir" if os.path.isdir(model_dir) else "absent"
    serving = os.path.realpath(model_dir) if kind != "absent" else None
    revisions: list[RevisionUsage] = []
    for path in _revision_dirs(model_dir) + ([model_dir] if kind == "dir" else []):
        size, freed = _usage(path)
        revisions.append(
            {
                "path": path,
                "bytes": size,
                "freed": freed,
                # Both sides resolved: a model dir whose parent is a link is still the one served.
                "serving": os.path.realpath(path) == serving,
                "partial_bytes": _partial_bytes(path),
            }
        )
    return {
        "state_dir": state,
        "engine_cache_bytes": _usage(layout.engine_cache)[0] if os.path.isdir(layout.engine_cache) else 0,
        "image_store_bytes": _usage(layout.image_store)[0] if os.path.isdir(layout.image_store) else 0,
        "guard_running": _guard_running(layout),
        "model_dir": model_dir,
        "model_dir_kind": kind,
        "revisions": revisions,
        "pulled": _pulled(layout),
    }


def _guard_running(layout: StateDir) -> bool:
    pid = pid_of(layout.guard_pid)
    return pid is not None and runs_command(pid, _guard_command(layout))


# Files the reconciler writes in a state dir besides those StateDir names: the event history (and
# its rotations) and the start records on the reconciler's machine, an atomic write's leftover.
_OTHER_STATE_FILES = re.compile(r"^(events\.jsonl(\.[0-9]+)?|starts\.json|.+\.tmp-[0-9a-f]{16})$")


def _ours_in_state_dir(layout: StateDir, name: str) -> bool:
    named = {os.path.basename(path) for path in vars(layout).values() if isinstance(path, str)}
    return name in named - {os.path.basename(layout.root)} or _OTHER_STATE_FILES.match(name) is not None


def _unsafe_root(path: str) -> str | None:
    """Why a directory must never be removed whole: the root, the home or a parent of it."""
    real = os.path.realpath(path)
    home = os.path.realpath(os.path.expanduser("~"))
    if real == "/" or real == home or home.startswith(real.rstrip("/") + "/"):
        return f"{path} is the root, the home or a directory above the home"
    if os.path.islink(path):
        return f"{path} is a symbolic link (its target is left as it is)"
    return None


def remove_state_dir(root: str) -> tuple[list[str], list[str]]:
    """The entries of a state dir the reconciler wrote, then the dir if nothing else is left:
    (removed, left with the reason). A file of the owner's in it is never touched."""
    import shutil

    root = os.path.expanduser(root).rstrip("/") or "/"
    if not os.path.isdir(root):
        return [], []
    unsafe = _unsafe_root(root)
    if unsafe is not None:
        return [], [unsafe]
    layout = StateDir(root)
    removed, left = [], []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if not _ours_in_state_dir(layout, name):
            left.append(f"{path}: not written by the reconciler")
            continue
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
            removed.append(path)
        except OSError as exc:
            left.append(f"{path}: {exc.strerror or exc}")
    if not left:
        with contextlib.suppress(OSError):
            os.rmdir(root)
            removed.append(root)
    return removed, left


def _remove_checkpoint(model_dir: str) -> tuple[list[str], list[str]]:
    """model_dir (its link, or a directory from before revisions) and every revision dir beside it."""
    import shutil

    removed, left = [], []
    targets = _revision_dirs(model_dir)
    if os.path.isdir(model_dir) and not os.path.islink(model_dir):
        targets.append(model_dir)
    for path in targets:
        unsafe = _unsafe_root(path)
        if unsafe is not None:
            left.append(unsafe)
            continue
        try:
            shutil.rmtree(path)
            removed.append(path)
        except OSError as exc:
            left.append(f"{path}: {exc.strerror or exc}")
    if os.path.islink(model_dir):
        os.unlink(model_dir)
        removed.append(model_dir)
    return removed, left


def remove_trees(args: RemoveTreesArgs) -> TreesRemoved:
    """Uninstall's last steps on a node: with "state", the entries of the state dir that the
    reconciler wrote (then the dir, if nothing of the owner's is in it); with "checkpoint", the
    model dir link and every revision dir beside it. The root, the home and the directories above
    it are never removed; what could not be removed is returned with the reason."""
    removed: list[str] = []
    left: list[str] = []
    if "checkpoint" in args["remove"]:
        gone, kept = _remove_checkpoint(os.path.expanduser(args["model_dir"]).rstrip("/"))
        removed, left = removed + gone, left + kept
    if "state" in args["remove"]:
        gone, kept = remove_state_dir(args["state_dir"])
        removed, left = removed + gone, left + kept
    return {"removed": removed, "left": left}


class FrontCommandArgs(TypedDict):
    socket: str
    command: str


class FrontAnswer(TypedDict):
    # None: no front answers on that socket.
    answer: str | None


def front_command(args: FrontCommandArgs) -> FrontAnswer:
    """One command to the front's admin socket (its drain switch); the spec's state dir may
    start with `~`, which only the node can expand."""
    return {"answer": admin_command(os.path.expanduser(args["socket"]), args["command"])}


class EngineLoadArgs(TypedDict):
    url: str


class EngineLoad(TypedDict):
    # Requests running or waiting in rank 0's engine; None when it does not answer.
    requests: int | None


# vLLM's gauges of the requests it holds (0.32's names on /metrics).
_REQUEST_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def engine_load(args: EngineLoadArgs) -> EngineLoad:
    """The requests rank 0 holds now, from its Prometheus metrics on loopback (the node's own
    port, past the front): what a drain waits on."""
    import urllib.request

    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
    try:
        with direct.open(args["url"], timeout=5) as answer:
            text = answer.read(4 * 1024 * 1024).decode("utf-8", "replace")
    except (OSError, ValueError):
        return {"requests": None}
    total = 0.0
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in _REQUEST_GAUGES:
            with contextlib.suppress(ValueError, IndexError):
                total += float(line.rsplit(" ", 1)[1])
    return {"requests": int(total)}


def run(request: dict[str, Any]) -> None:
    """Entry point: make the state dir private (every call names it), run one operation, print
    its result."""
    if request.get("private_dir"):
        private_dir(os.path.expanduser(request["private_dir"]))
    reply(OPERATIONS[request["call"]](request["args"]))


OPERATIONS: dict[str, Callable[[Any], object]] = {
    function.__name__: function
    for function in (
        write_file,
        chmod,
        read_text,
        mkdirs,
        hash_files,
        reassemble,
        prune_parts,
        guard_start,
        guard_stop,
        remove_file,
        key_file,
        disk_free,
        link_files,
        switch_model_dir,
        remove_revisions,
        footprint,
        remove_trees,
        front_command,
        engine_load,
    )
}
