"""Downloading the repo's files with the real client, resuming a killed download mid-file.

Since huggingface_hub 1.18 (see docs/sources.md) a download goes to a process-unique
`<hash>.<etag>.<uuid8>.incomplete` file that a later process never reuses, so a run killed
in the middle of a 50 GB shard would start that shard from byte 0 — and leave the old
partial behind as garbage. Before handing over to the client's download, `resume_partials`
finds such leftovers, checks them against the remote file (the etag in the name must be
the file's current etag, the size must be smaller), and finishes them with the client's own
ranged `http_get`, then records the client's download metadata so the client's per-file
download sees the file as done. Stale or duplicate partials are deleted; model files never are.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# A private module of the client, for what its public API does not offer: where a killed
# download's partial file lies and how a finished one is recorded (`resume_partials`).
# pyproject.toml bounds huggingface_hub above by the newest minor release CI runs; the locked and
# the lowest lanes both run tests/unit/test_download_resume.py against it.
from huggingface_hub import hf_hub_url
from huggingface_hub._local_folder import _short_hash, write_download_metadata
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]  # public; __all__ is computed
from huggingface_hub.utils.tqdm import are_progress_bars_disabled, disable_progress_bars

from reconciler.errors import HubError, RangesIgnoredError
from reconciler.hub import ranges as hubranges
from reconciler.hub.client import _bound_client_timeouts, endpoint, token
from reconciler.hub.failures import hub_call
from reconciler.hub.listing import HubListing, _client_download, list_files
from reconciler.nodeside.ops import PART_RE
from reconciler.progress import Counter
from reconciler.repofiles import HubFile
from reconciler.spec import Model

DOWNLOAD_CACHE = hubranges.DOWNLOAD_CACHE


def _etag_of(partial: Path) -> str:
    """`<hash>.<etag>.<uuid8>.incomplete` (>= 1.18) or `<hash>.<etag>.incomplete` (older)."""
    parts = partial.name.split(".")
    return parts[1] if len(parts) >= 3 else ""


def resume_partials(
    model: Model, local_dir: str, commit: str, files: list[HubFile], report: Callable[[str], None]
) -> list[tuple[str, int]]:
    """Finish downloads a killed run left behind; return (path, bytes already there) per resumed file."""
    root = Path(local_dir)
    resumed: list[tuple[str, int]] = []
    for item in files:
        if (root / item.path).exists():
            continue
        found = hubranges.partials(root, item.path, (".incomplete",))
        # A symbolic link (or anything but a regular file) at a partial's name is garbage: removed, never followed.
        sizes = {p: hubranges.regular_size(p) for p in found}
        usable = {
            p: size for p, size in sizes.items() if _etag_of(p) == item.etag and size is not None and size < item.size
        }
        keep = max(usable, key=lambda path: usable[path], default=None)
        for garbage in found:
            if garbage != keep:
                garbage.unlink(missing_ok=True)
        if keep is not None and usable[keep] > 0:
            have = usable[keep]
            report(f"    resuming {item.path} at byte {have} of {item.size}")
            _finish(model, root, commit, item, keep)
            resumed.append((item.path, have))
    return resumed


def _finish(model: Model, root: Path, commit: str, item: HubFile, partial: Path) -> None:
    url = hf_hub_url(model.repo, item.path, revision=commit, endpoint=endpoint(model))
    have = partial.stat().st_size
    # Appended to only if it is still the regular file it was: a link put there since is not followed.
    with hub_call(model, f"resuming {item.path}"):
        appending = os.open(partial, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(appending, "ab") as handle:
            http_get(
                url, handle, resume_size=have, headers=build_hf_headers(token=token(model)), expected_size=item.size
            )
    if hubranges.regular_size(partial) != item.size:
        partial.unlink(missing_ok=True)
        raise HubError(f"{item.path}: resumed download has the wrong size", "run apply again to fetch it afresh")
    destination = root / item.path
    destination.parent.mkdir(parents=True, exist_ok=True)
    os.replace(partial, destination)
    write_download_metadata(root, item.path, commit, item.etag)


def fetch_order(files: list[HubFile]) -> list[HubFile]:
    """Parts first, shard by shard (each is reassembled while the rest downloads), then biggest
    first: the many small files come last, so what is left to copy after the download is small."""

    def key(item: HubFile) -> tuple[bool, int, str]:
        part = PART_RE.match(item.path) is not None
        return (not part, 0 if part else -item.size, item.path)

    return sorted(files, key=key)


def download_files(
    model: Model,
    local_dir: str,
    commit: str,
    files: list[HubFile],
    on_file: Callable[[HubFile], None] | None = None,
    report: Callable[[str], None] | None = None,
) -> None:
    """Fetch each file (a complete one is only checked), `on_file` as each is done.

    `model.download_streams` requests at once, in `fetch_order`: a big file in byte ranges with
    every stream on it (reconciler/hub/ranges.py), so files finish one after another; any other
    by the client's own per-file download, as `snapshot_download` runs it (its resume, its
    download metadata).
    """
    _bound_client_timeouts()
    failures: list[BaseException] = []
    ranged: list[hubranges.RangedFile] = []

    def one(task: Callable[[], None]) -> None:
        if failures:  # one failed: the apply stops, the partial files stay for a resume
            return
        try:
            task()
        except BaseException as exc:  # handed to the caller's thread below
            failures.append(exc)

    try:
        with hub_call(model, f"downloading {model.repo}@{commit[:12]}"):
            tasks = _download_tasks(model, Path(local_dir), commit, files, on_file, ranged, report)
        with ThreadPoolExecutor(max_workers=model.download_streams, thread_name_prefix="download") as pool:
            list(pool.map(one, tasks))
    finally:
        for partial in ranged:
            partial.close()
    if failures:
        with hub_call(model, f"downloading {model.repo}@{commit[:12]}"):
            raise failures[0]


def _download_tasks(
    model: Model,
    root: Path,
    commit: str,
    files: list[HubFile],
    on_file: Callable[[HubFile], None] | None,
    ranged: list[hubranges.RangedFile],
    report: Callable[[str], None] | None,
) -> list[Callable[[], None]]:
    """The download as tasks for the streams, in `fetch_order`: one per file fetched whole, one
    per missing range of a ranged file (`ranged` gets each ranged file, to be closed after)."""
    done = on_file or (lambda _item: None)
    headers: dict[str, str] = build_hf_headers(token=token(model))
    ignored = threading.Event()  # the Hub answered a Range with the whole file: it does not do ranges
    tasks: list[Callable[[], None]] = []
    for item in fetch_order(files):
        partial = _ranged(model, root, commit, item)
        if partial is None:
            tasks.append(functools.partial(_whole, model, item, commit, str(root), done))
            continue
        ranged.append(partial)
        have = hubranges.resumed_bytes(partial)
        if have and report is not None:
            report(f"    resuming {item.path} at byte {have} of {item.size} (in ranges)")
        spans = [(start, end) for start, end in partial.ranges if partial.done[start] < end - start]
        spans = spans or partial.ranges[:1]  # all in: one task only puts the file in place
        partial.tasks = len(spans)
        for span in spans:
            tasks.append(functools.partial(_range, model, item, commit, partial, span, headers, ignored, done))
    return tasks


def _ranged(model: Model, root: Path, commit: str, item: HubFile) -> hubranges.RangedFile | None:
    """The file's ranged download, or None to fetch it whole (small, already there, one stream)."""
    if item.size < 2 * hubranges.MIN_RANGE_BYTES:
        return None  # never split, so never left partial in ranges: no need to look
    if (root / item.path).exists():
        hubranges.discard_partials(root, item.path)  # what a run killed while putting it in place left
        return None
    url = hf_hub_url(model.repo, item.path, revision=commit, endpoint=endpoint(model))
    target = hubranges.Target(url=url, root=root, path=item.path, size=item.size, etag=item.etag, commit=commit)
    return hubranges.open_ranged(target, model.download_streams)


def _whole(model: Model, item: HubFile, commit: str, local_dir: str, done: Callable[[HubFile], None]) -> None:
    _client_download(model, item.path, commit, local_dir)
    done(item)


def _range(
    model: Model,
    item: HubFile,
    commit: str,
    partial: hubranges.RangedFile,
    span: tuple[int, int],
    headers: dict[str, str],
    ignored: threading.Event,
    done: Callable[[HubFile], None],
) -> None:
    """One range of a ranged file; whoever brings in its last range puts the file in place."""
    try:
        if partial.whole:
            return
        if not _fetched(partial, span, headers, ignored):
            if partial.claim_whole():  # the Hub sends whole files only: the client fetches this one
                hubranges.discard_partials(partial.target.root, item.path)
                _whole(model, item, commit, str(partial.target.root), done)
            return
        if partial.claim_finish():
            partial.finish()
            done(item)
    finally:
        partial.task_ended()


def _fetched(
    partial: hubranges.RangedFile, span: tuple[int, int], headers: dict[str, str], ignored: threading.Event
) -> bool:
    """The span is in; False when the Hub answers ranges with whole files (`ignored` says so to all)."""
    if ignored.is_set() and not partial.complete():
        return False
    try:
        hubranges.fetch_range(partial, span[0], span[1], headers)
    except RangesIgnoredError:
        ignored.set()
        return False
    return True


def fetch(
    model: Model,
    local_dir: str,
    *,
    commit: str,
    report: Callable[[str], None],
    files: list[HubFile] | None = None,
    on_bytes: Callable[[Counter], None] | None = None,
    on_file: Callable[[HubFile], None] | None = None,
) -> HubListing:
    """Resume what a killed run left, then fetch the rest file by file: `files` of `commit` as a
    plan's listing named them, or (None) every file the Hub lists there now. A plan names exact
    files: re-fetching one corrupt file must not bring back every other file's pruned parts.

    `on_bytes` gets what is on disk every few seconds (see `downloaded`); `on_file` each file
    once it is complete on disk (also one that already was), from the download's threads.
    """
    listing = list_files(model, commit) if files is None else HubListing(commit, files)
    with _metered(Path(local_dir), listing.files, on_bytes):
        resume_partials(model, local_dir, listing.commit, listing.files, report)
        download_files(model, local_dir, listing.commit, listing.files, on_file, report)
    return listing


METER_EVERY_S = 2.0


@contextlib.contextmanager
def _metered(root: Path, files: list[HubFile], on_bytes: Callable[[Counter], None] | None) -> Iterator[None]:
    """Count the download from the disk while the block runs, on a thread of its own: the client's
    bars are off without a terminal and differ between its versions; its files do not."""
    if on_bytes is None:
        yield
        return
    # Ours are the bars now: two drawing on one terminal garble each other.
    if not are_progress_bars_disabled():
        disable_progress_bars()
    stop = threading.Event()

    def meter() -> None:
        while not stop.wait(METER_EVERY_S):
            on_bytes(downloaded(root, files))

    thread = threading.Thread(target=meter, name="download meter", daemon=True)
    on_bytes(downloaded(root, files))
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
        on_bytes(downloaded(root, files))


def downloaded(root: Path, files: list[HubFile]) -> Counter:
    """How much of `files` is in `root`: complete files whole, unfinished ones by the client's
    partial files (`.cache/huggingface/download/<dir>/<hash>.<etag>[.<uuid>].incomplete`), which
    grow by the client's 10 MB chunks (a file smaller than that counts when it is done)."""
    partial = _partial_sizes(root, {str(Path(item.path).parent) for item in files})
    done = complete = 0
    current = None
    for item in files:
        path = Path(item.path)
        if hubranges.file_size(root / path) == item.size:
            done += item.size
            complete += 1
            continue
        started = partial.get((str(path.parent), _short_hash(f"{path.name}.metadata")), 0)
        done += min(started, item.size)
        if started and current is None:
            current = item.path
    return Counter("download", done, sum(item.size for item in files), complete, len(files), current)


_PARTIAL_ENDINGS = (".incomplete", hubranges.PROGRESS_SUFFIX)


def _partial_sizes(root: Path, directories: set[str]) -> dict[tuple[str, str], int]:
    """Bytes of the partial files by (directory, file hash), the client's and the ranged ones: one
    listing per directory (files vanish while it runs: each is renamed when done)."""
    sizes: dict[tuple[str, str], int] = {}
    for directory in directories:
        cache = root / DOWNLOAD_CACHE / directory
        try:
            names = [entry.name for entry in os.scandir(cache) if entry.name.endswith(_PARTIAL_ENDINGS)]
        except OSError:
            continue
        for name in names:
            if name.endswith(hubranges.PROGRESS_SUFFIX):  # a ranged partial: sparse, its progress says
                size = hubranges.ranged_bytes(cache / name)
            else:
                size = hubranges.file_size(cache / name) or 0
            key = (directory, name.split(".", 1)[0])
            sizes[key] = max(sizes.get(key, 0), size)
    return sizes
