"""Ranged downloads: one big file fetched by all the download streams at once, a byte range each.

The Hub client fetches a file over one connection. With eight big files in flight at once,
each gets an eighth of the link (or of a Hub that caps each connection, one capped connection),
so they all finish together near the end of the download, and the pipelined copy to the
workers can only start then. Fetched range by range, all streams on the same file, the files
finish one after another at the full rate: each is copied on while the next downloads, and what
is left after the last byte is one file's copy.

On disk, beside the client's own partial files (`.cache/huggingface/download/<dir>/`):
`<hash>.<etag>.ranges` is the file, written at each range's offsets, and `<hash>.<etag>.ranges.json`
the split and the bytes done in each range, rewritten only after those bytes are on disk, so a
killed run resumes every range where it stopped. Once the last range is in, the file takes its
place and is recorded in the client's download metadata, as the client records its own.

A file smaller than two ranges, or one the Hub serves without honouring `Range`, is left to the
client's own download.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx2
from huggingface_hub._local_folder import _short_hash, write_download_metadata
from huggingface_hub.utils import get_session, hf_raise_for_status  # type: ignore[attr-defined]  # public; __all__ is computed

from reconciler.errors import HubError, RangesIgnoredError, UntrustedFileError
from reconciler.fsutil import atomic_write, human_bytes, read_bounded
from reconciler.nodeside.common import MIN_RATE_BPS, RATE_WINDOW_S, RateFloor

MIB = 1024 * 1024
# No range under this: below it a request's round trips (a redirect to the CDN on the real Hub)
# cost more than the parallelism gains.
MIN_RANGE_BYTES = 16 * MIB
# A range's progress is made durable (fdatasync, then the progress file) every this many bytes:
# what a killed run loses per stream.
DURABLE_EVERY_BYTES = 8 * MIB
# A range is asked for again this many times in a row without a byte gained (the client's own
# budget for its downloads) before the download fails.
RETRIES = 5
RANGES_SUFFIX = ".ranges"
DOWNLOAD_CACHE = ".cache/huggingface/download"
PROGRESS_SUFFIX = ".ranges.json"
# The progress file is written to `<base>.ranges.json.tmp-<random>` and renamed into place.
_PROGRESS_TEMPORARY = f"{PROGRESS_SUFFIX}.tmp-"
_PROGRESS_LIMIT = 1024 * 1024


def split(size: int, streams: int) -> list[tuple[int, int]] | None:
    """(start, end) byte ranges, end exclusive, one per stream; None: fetch the file whole."""
    if streams < 2 or size < 2 * MIN_RANGE_BYTES:
        return None
    count = min(streams, size // MIN_RANGE_BYTES)
    step = -(-size // count)
    return [(start, min(start + step, size)) for start in range(0, size, step)]


@dataclass(frozen=True)
class Target:
    """Where a ranged file comes from and goes to."""

    url: str
    root: Path
    path: str
    size: int
    etag: str
    commit: str


class RangedFile:
    """One file being fetched in ranges: its partial file, and the bytes done per range.

    The partial file is opened by the first range that writes and closed when the file's last
    task ends, so a repo of many big files holds a descriptor only for the files in flight."""

    def __init__(self, target: Target, ranges: list[tuple[int, int]], done: dict[int, int]) -> None:
        self.target = target
        self.ranges = ranges
        self.done = done
        self.lock = threading.Lock()
        self.whole = False  # the Hub ignores Range: one stream fetches it whole instead
        self.finished = False
        self.tasks = 0  # the file's tasks not yet ended
        self.base = partial_base(target.root, target.path, target.etag)
        self._fd = -1

    def descriptor(self) -> int:
        with self.lock:
            if self._fd < 0 and self.whole:  # its partial files are gone: not to be made again
                raise RangesIgnoredError("the Hub answered a byte range with the whole file")
            if self._fd < 0:
                self._fd = _open_own(f"{self.base}{RANGES_SUFFIX}")
                if os.fstat(self._fd).st_size != self.target.size:
                    os.ftruncate(self._fd, self.target.size)  # sparse: ranges land at their offsets
            return self._fd

    def write(self, offset: int, chunk: bytes) -> None:
        fd, view = self.descriptor(), memoryview(chunk)
        while view:
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written

    def advance(self, start: int, offset: int) -> None:
        """The range at `start` holds every byte up to `offset`: on disk first, then recorded."""
        os.fdatasync(self.descriptor())
        with self.lock:
            if self.whole:  # given up on: its partial files are gone, and stay gone
                return
            self.done[start] = max(self.done[start], offset - start)
            _write_progress(self.base, self.target, self.ranges, self.done)

    def _all_in(self) -> bool:
        return all(self.done[start] >= end - start for start, end in self.ranges)

    def complete(self) -> bool:
        with self.lock:
            return self._all_in()

    def claim_finish(self) -> bool:
        """True for exactly one caller once every range is in: that caller puts the file in place."""
        with self.lock:
            if self.finished or self.whole or not self._all_in():
                return False
            self.finished = True
            return True

    def claim_whole(self) -> bool:
        """True for the first caller to find the Hub ignoring Range: it fetches the file whole."""
        with self.lock:
            if self.whole or self.finished:
                return False
            self.whole = True
            return True

    def finish(self) -> None:
        """Every range is in: the file takes its place, recorded as the client records its own."""
        os.fsync(self.descriptor())
        destination = self.target.root / self.target.path
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.replace(f"{self.base}{RANGES_SUFFIX}", destination)
        write_download_metadata(self.target.root, self.target.path, self.target.commit, self.target.etag)
        # Every range is in, so no progress is written any more: its file and any temporary go.
        discard_partials(self.target.root, self.target.path)

    def task_ended(self) -> None:
        """One of the file's tasks ended: after the last one, its descriptor is closed."""
        with self.lock:
            self.tasks -= 1
            last = self.tasks <= 0
        if last:
            self.close()

    def close(self) -> None:
        """Idempotent; the download closes every file again once its pool is done."""
        with self.lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def _open_own(path: str) -> int:
    """The ranged partial at `path`, opened if it is there, else created: never through a symbolic
    link, never another kind of file (`open_ranged` removed any such thing before the download)."""
    try:
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.EEXIST):
            raise
        raise _not_ours(path) from None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise _not_ours(path)
    return descriptor


def _not_ours(path: str) -> HubError:
    return HubError(
        f"{path} turned into a symbolic link or a special file while the download wrote it",
        "only the download writes there: find what else does, remove the file and run apply again",
        kind="local",
    )


def _partial_prefix(root: Path, path: str) -> Path:
    """`<model dir>/.cache/huggingface/download/<dir>/<hash>.`: how the client names the partial
    files of `path` (the etag and an ending follow)."""
    return root / DOWNLOAD_CACHE / Path(path).parent / f"{_short_hash(f'{Path(path).name}.metadata')}."


def partial_base(root: Path, path: str, etag: str) -> str:
    """`<model dir>/.cache/huggingface/download/<dir>/<hash>.<etag>`, the client's naming."""
    return f"{_partial_prefix(root, path)}{etag}"


def partials(root: Path, path: str, endings: tuple[str, ...]) -> list[Path]:
    """The partial files of `path` whose names end in one of `endings`."""
    prefix = _partial_prefix(root, path)
    if not prefix.parent.is_dir():
        return []
    return [p for p in prefix.parent.iterdir() if p.name.startswith(prefix.name) and _ends(p.name, endings)]


def _ends(name: str, endings: tuple[str, ...]) -> bool:
    """`name` ends in one of `endings`; an ending of `.ranges.json.tmp-` takes the random suffix after it."""
    stem = name[: name.rfind(_PROGRESS_TEMPORARY) + len(_PROGRESS_TEMPORARY)] if _PROGRESS_TEMPORARY in name else name
    return stem.endswith(endings)


# `.ranges.json.tmp`: what a run of an older version left.
_ENDINGS = (RANGES_SUFFIX, PROGRESS_SUFFIX, f"{PROGRESS_SUFFIX}.tmp", _PROGRESS_TEMPORARY)


def discard_partials(root: Path, path: str, keep_etag: str | None = None) -> None:
    """Every ranged partial of `path` (but the one for `keep_etag`): another revision's bytes, a
    file fetched whole instead, or what a run killed while putting the file in place left."""
    for entry in partials(root, path, _ENDINGS):
        if keep_etag is None or entry.name.split(".")[1] != keep_etag:
            entry.unlink(missing_ok=True)


def open_ranged(target: Target, streams: int) -> RangedFile | None:
    """The file's ranged download, resumed where a killed run left it; None: fetch it whole
    (and anything a ranged run left of it is dropped: `download_streams: 1` means whole).

    A run killed with another stream count (but more than one) resumes with the split it started with."""
    fresh = split(target.size, streams)
    if fresh is None:
        discard_partials(target.root, target.path)
        return None
    discard_partials(target.root, target.path, keep_etag=target.etag)
    base = partial_base(target.root, target.path, target.etag)
    resumed = _read_progress(base, target)
    if resumed is not None:
        return RangedFile(target, *resumed)
    # Afresh: the old progress goes first, so no kill in between can pair it with new zeros.
    Path(f"{base}{PROGRESS_SUFFIX}").unlink(missing_ok=True)
    Path(f"{base}{RANGES_SUFFIX}").unlink(missing_ok=True)
    Path(base).parent.mkdir(parents=True, exist_ok=True)
    done = {start: 0 for start, _ in fresh}
    _write_progress(base, target, fresh, done)
    return RangedFile(target, fresh, done)


def resumed_bytes(ranged: RangedFile) -> int:
    with ranged.lock:
        return sum(ranged.done.values())


def _write_progress(base: str, target: Target, ranges: list[tuple[int, int]], done: dict[int, int]) -> None:
    document = {"size": target.size, "ranges": [[start, end, done[start]] for start, end in ranges]}
    # An exclusive temporary of a random name, renamed over the progress file: nothing is written
    # through a link planted at a name known in advance. Not fsynced, as before: the ranges' bytes
    # are, and a progress file lost to a power cut only costs a fresh start of the file.
    atomic_write(f"{base}{PROGRESS_SUFFIX}", json.dumps(document).encode("utf-8"), 0o644, durable=False)


def _read_progress(base: str, target: Target) -> tuple[list[tuple[int, int]], dict[int, int]] | None:
    """A killed run's split and progress, if both files are there and agree with the file; else
    None (anything unreadable starts the file afresh: its bytes cannot be trusted)."""
    if regular_size(Path(f"{base}{RANGES_SUFFIX}")) != target.size:  # a link there is not resumed
        return None
    return progress_of(_load_progress(Path(f"{base}{PROGRESS_SUFFIX}")), target.size)


def _load_progress(path: Path) -> object:
    """A progress document; None when it cannot be read (gone, or replaced while read)."""
    try:
        return json.loads(read_bounded(path, limit=_PROGRESS_LIMIT))
    except (OSError, ValueError, UntrustedFileError):
        return None


def file_size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def regular_size(path: Path) -> int | None:
    """The size of the regular file at `path` itself; None for a symbolic link or anything else."""
    try:
        status = path.lstat()
    except OSError:
        return None
    return status.st_size if stat.S_ISREG(status.st_mode) else None


def progress_of(document: object, size: int) -> tuple[list[tuple[int, int]], dict[int, int]] | None:
    """The split and bytes done of a progress document, None unless it covers [0, size) exactly."""
    if not isinstance(document, dict) or document.get("size") != size:
        return None
    rows = document.get("ranges")
    if not isinstance(rows, list) or not rows:
        return None
    ranges: list[tuple[int, int]] = []
    done: dict[int, int] = {}
    expected_start = 0
    for row in rows:
        if not (isinstance(row, list) and len(row) == 3 and all(type(v) is int for v in row)):
            return None
        start, end, have = row
        if start != expected_start or end <= start or not 0 <= have <= end - start:
            return None
        ranges.append((start, end))
        done[start] = have
        expected_start = end
    return (ranges, done) if expected_start == size else None


def ranged_bytes(progress_path: Path) -> int:
    """Bytes done of a ranged partial, from its progress file (0 when it is unreadable)."""
    document = _load_progress(progress_path)  # None when replaced while read, or gone: the meter reads again
    if not isinstance(document, dict):
        return 0
    parsed = progress_of(document, document.get("size", -1))
    return sum(parsed[1].values()) if parsed is not None else 0


def fetch_range(ranged: RangedFile, start: int, end: int, headers: dict[str, str]) -> None:
    """Fetch what is missing of the range at `start`, going on from its last byte after a cut or a
    passing refusal (408, 429, 5xx: after its Retry-After, bounded), as the client retries its own
    downloads. A refusal that lasts is raised as the Hub's error."""
    failures = 0
    while start + ranged.done[start] < end and not ranged.whole:
        before = ranged.done[start]
        try:
            _stream_range(ranged, start, end, headers)
        except (
            httpx2.TimeoutException,
            httpx2.NetworkError,
            httpx2.RemoteProtocolError,
            _PassingRefusalError,
            _TooSlowError,
        ) as exc:
            failures = 0 if ranged.done[start] - before >= _progress_that_counts(exc) else failures + 1
            if failures > RETRIES:
                if isinstance(exc, _PassingRefusalError):
                    hf_raise_for_status(exc.response)
                if isinstance(exc, _TooSlowError):
                    raise _too_slow(ranged.target.path, failures) from None
                raise
            time.sleep(_pause(exc, failures))


class _TooSlowError(Exception):
    """The range came under MIN_RATE_BPS for a whole RATE_WINDOW_S: cut, to go on from its last byte."""


def _progress_that_counts(exc: BaseException) -> float:
    """Bytes a failed request must have brought for its failure not to count towards RETRIES: a
    trickle brings a few bytes each time, and must not be resumed forever for them."""
    return MIN_RATE_BPS * RATE_WINDOW_S if isinstance(exc, _TooSlowError) else 1


def _too_slow(path: str, failures: int) -> HubError:
    return HubError(
        f"the Hub sent {path} at under {human_bytes(MIN_RATE_BPS)}/s for {RATE_WINDOW_S:g} s, "
        f"{failures} times in a row",
        "the Hub or the network is slow: retry later (the download resumes where it stopped)",
        kind="network",
    )


class _PassingRefusalError(Exception):
    """An answer the client retries (408, 429, 5xx), its body read."""

    def __init__(self, response: httpx2.Response) -> None:
        super().__init__(response.status_code)
        self.response = response


_RETRIED_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
MAX_PAUSE_S = 60.0


def _pause(exc: BaseException, failures: int) -> float:
    backoff = min(8.0, 2.0 ** max(0, failures - 1))
    if isinstance(exc, _PassingRefusalError):
        asked = exc.response.headers.get("retry-after", "")
        if asked.strip().isdigit():
            return min(MAX_PAUSE_S, max(backoff, float(asked.strip())))
    return backoff


def _stream_range(ranged: RangedFile, start: int, end: int, headers: dict[str, str]) -> None:
    """One request for what is missing of the range; what came before a cut is kept."""
    offset = durable = start + ranged.done[start]
    # Identity: the offsets are the file's bytes, not a compressor's.
    asked = {**headers, "Range": f"bytes={offset}-{end - 1}", "Accept-Encoding": "identity"}
    rate = RateFloor(MIN_RATE_BPS, RATE_WINDOW_S)
    with get_session().stream("GET", ranged.target.url, headers=asked) as response:
        _check_answer(response, ranged.target, offset, end)
        try:
            # Each read as it arrives (not gathered into chunks): the rate is judged as bytes come.
            for chunk in response.iter_raw():
                if ranged.whole:  # another stream found the Hub ignoring Range: fetched whole
                    return
                if offset + len(chunk) > end:
                    raise _too_much(ranged.target.path, offset, end)
                ranged.write(offset, chunk)
                offset += len(chunk)
                if offset - durable >= DURABLE_EVERY_BYTES:
                    ranged.advance(start, offset)
                    durable = offset
                if rate.too_slow(len(chunk)):
                    raise _TooSlowError
        finally:  # a cut keeps what came: the next request asks for the rest
            if offset > durable:
                ranged.advance(start, offset)
    if offset < end:
        raise httpx2.RemoteProtocolError(f"the range ended at byte {offset} of {end}")


def _check_answer(response: httpx2.Response, target: Target, offset: int, end: int) -> None:
    """A 206 with exactly the bytes asked for, unencoded; a whole-file 200 means no ranges here."""
    if response.status_code in _RETRIED_STATUSES or response.status_code >= 400:
        response.read()  # the Hub's error text, for the error
        if response.status_code in _RETRIED_STATUSES:
            raise _PassingRefusalError(response)
        hf_raise_for_status(response)
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise _mangled(target.path, f"came compressed ({encoding:.40}) although identity was asked for")
    if response.status_code == 200:
        if response.headers.get("content-length") == str(target.size):
            raise RangesIgnoredError("the Hub answered a byte range with the whole file")
        raise _mangled(target.path, f"came as a 200 of {response.headers.get('content-length')!r:.40} bytes")
    expected = f"bytes {offset}-{end - 1}/{target.size}"
    header = response.headers.get("content-range")
    if response.status_code != 206 or header is None or header.strip() != expected:
        raise _mangled(
            target.path, f"came as HTTP {response.status_code}, Content-Range {header!r:.80}, not {expected!r}"
        )


_MANGLING = "if it persists, the Hub or a proxy in between mangles Range answers: set model.download_streams: 1"


def _mangled(path: str, what: str) -> HubError:
    changed = "retry later (the file may have changed on the Hub: run `reconciler plan`)"
    return HubError(f"a range of {path} {what}", f"{changed}; {_MANGLING}", kind="malformed")


def _too_much(path: str, offset: int, end: int) -> HubError:
    message = f"the Hub sent more of {path} than the range asked for ({offset}-{end - 1})"
    return HubError(message, f"retry later; {_MANGLING}", kind="malformed")
