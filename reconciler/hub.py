"""The Hugging Face Hub client, as the checkpoint component uses it.

The real `huggingface_hub` client with the spec's endpoint (HF_ENDPOINT semantics), pinned
revision and token (from $HF_TOKEN or model.token_file; never printed, never in argv).

Mid-file resume: since huggingface_hub 1.18 (see docs/sources.md) a download goes to a process-unique
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
import errno
import fnmatch
import functools
import os
import re
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

# Two private modules of the client, for what its public API does not offer: where a killed
# download's partial file lies and how a finished one is recorded (`resume_partials`), and the
# shared HTTP client as the client itself builds it (`_bound_client_timeouts`). pyproject.toml
# bounds huggingface_hub above by the newest minor release CI runs; the locked and the lowest
# lanes both run tests/unit/test_download_resume.py and test_hub_failures.py against them.
from huggingface_hub import HfApi, get_token, hf_hub_download, hf_hub_url, set_client_factory
from huggingface_hub._local_folder import _short_hash, write_download_metadata
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]  # public; __all__ is computed
from huggingface_hub.utils._http import default_client_factory
from huggingface_hub.utils.tqdm import are_progress_bars_disabled, disable_progress_bars

from reconciler import hubranges
from reconciler.errors import HubError, RangesIgnoredError, ReconcilerError, UntrustedFileError
from reconciler.facts.files import HubFacts, HubFileFacts, is_inside, parse_manifest
from reconciler.fsutil import read_bounded
from reconciler.progress import Counter
from reconciler.redact import checked_secret, redact
from reconciler.spec import Model

DOWNLOAD_CACHE = ".cache/huggingface/download"


@dataclass(frozen=True)
class HubFile:
    """One file of the repo at the pinned commit, as the Hub lists it."""

    path: str
    size: int
    etag: str
    sha256: str | None
    blob_id: str | None = None


@dataclass(frozen=True)
class HubListing:
    commit: str
    files: list[HubFile]

    def as_facts(self, manifest: dict[str, str] | None = None) -> HubFacts:
        files = {
            item.path: HubFileFacts(size=item.size, sha256=item.sha256, blob_id=item.blob_id) for item in self.files
        }
        return HubFacts(commit=self.commit, files=files, manifest=manifest)


TOKEN_HINT = "write the token alone on one line (as the Hub shows it), or fix $HF_TOKEN"


def token(model: Model) -> str | bool:
    """The Hub token (model.token_file, else $HF_TOKEN, else the client's stored login), checked;
    False when there is none, so the client sends no token instead of reading one unchecked."""
    if model.token_file:
        path = Path(os.path.expanduser(model.token_file))
        return checked_secret(_read_token_file(path), what="the Hub token", source=str(path), hint=TOKEN_HINT)
    if os.environ.get("HF_TOKEN"):
        return checked_secret(os.environ["HF_TOKEN"], what="the Hub token", source="$HF_TOKEN", hint=TOKEN_HINT)
    try:
        stored = get_token()
    except Exception:  # the client's own lookup (a token file, OIDC): without it, no token
        return False
    if not stored:
        return False
    return checked_secret(stored, what="the Hub token", source="the Hub client's stored login", hint=TOKEN_HINT)


def _read_token_file(path: Path) -> str:
    try:
        data = read_bounded(path, limit=4096)
    except UntrustedFileError as exc:
        raise HubError(f"cannot read model.token_file {path}: {exc.reason}", "fix the path or remove it") from None
    return data.decode("utf-8", "surrogateescape")


def endpoint(model: Model) -> str | None:
    return model.endpoint or os.environ.get("HF_ENDPOINT") or None


# The Hub client's default HTTP client has no timeout at all: a Hub that accepts the connection
# and never answers would hold a pass (and `status`) forever.
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
_bounded = False


def _bound_client_timeouts() -> None:
    """Give the client's shared HTTP client timeouts, once: through its factory, because the
    client drops and rebuilds that shared client after a connection error."""
    global _bounded
    if _bounded:
        return
    _bounded = True

    def bounded_client() -> Any:
        client = default_client_factory()
        client.timeout = type(client.timeout)(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        return client

    set_client_factory(bounded_client)


# A whole question to the Hub (resolve a branch, list a commit and read its manifest) must end:
# read timeouts alone never fire on a server that trickles a byte now and then.
QUESTION_DEADLINE_S = 180.0
T = TypeVar("T")


def within_deadline(model: Model, doing: str, ask: Callable[[], T], deadline_s: float | None = None) -> T:
    """Run `ask` (Hub requests) and give up after the deadline with a HubError; the abandoned
    request finishes or fails in the background, on a daemon thread, holding nothing."""
    limit = QUESTION_DEADLINE_S if deadline_s is None else deadline_s
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(ask())
        except BaseException as exc:  # handed to the caller's thread below
            failure.append(exc)

    worker = threading.Thread(target=run, name="hub question", daemon=True)
    worker.start()
    worker.join(limit)
    if worker.is_alive():
        where = endpoint(model) or "https://huggingface.co"
        raise HubError(
            f"{doing} at {where} took longer than {limit:.0f} s",
            "the Hub is slow or stalled: retry later",
            kind="network",
        )
    if failure:
        raise failure[0]
    return outcome[0]


@contextlib.contextmanager
def hub_call(model: Model, doing: str) -> Iterator[None]:
    """Any failure of the Hub client inside becomes a HubError saying what failed and what to do.

    The client is a library over an HTTP stack whose exceptions differ by version (requests,
    httpx, httpx2), and the Hub (or a mirror) can be down, slow or wrong at any time; none of
    that may end as an internal error, or keep commands that do not need the Hub from working.
    """
    _bound_client_timeouts()
    try:
        yield
    except ReconcilerError:  # already says what failed (a bad token file, a refused listing)
        raise
    except Exception as exc:
        raise translate(exc, model, doing) from None


def translate(exc: BaseException, model: Model, doing: str) -> HubError:
    where = endpoint(model) or "https://huggingface.co"
    for kind, check in _CLASSIFIERS:
        error = check(exc, model, where, doing)
        if error is not None:
            return HubError(redact(error[0]), error[1], kind=kind)
    return HubError(
        redact(f"{doing} at {where} failed: {type(exc).__name__}: {_first_line(exc)}"),
        "retry later; if it persists, check model.endpoint and the Hub's status",
        kind="unknown",
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else "no detail"


Classified = tuple[str, str] | None


def _not_found(exc: BaseException, model: Model, where: str, doing: str) -> Classified:
    del doing
    if isinstance(exc, RevisionNotFoundError):
        return f"revision {model.revision} not found in {model.repo} at {where}", "check model.revision"
    if isinstance(exc, RepositoryNotFoundError):
        return (
            f"repository {model.repo} not found or not accessible at {where}",
            "check model.repo, and set $HF_TOKEN or model.token_file if the repo is gated or private",
        )
    if isinstance(exc, LocalEntryNotFoundError):  # before its base class, EntryNotFoundError
        return (
            f"{where} does not answer like a Hugging Face Hub: {_first_line(exc)}",
            "check model.endpoint (a mirror must serve the Hub's API and headers)",
        )
    if isinstance(exc, EntryNotFoundError):
        return f"a file of {model.repo} is not at {where}: {_first_line(exc)}", "check model.revision"
    return None


def _http_status(exc: BaseException, model: Model, where: str, doing: str) -> Classified:
    del model
    if not isinstance(exc, HfHubHTTPError):
        return None
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if status in (401, 403):
        return (
            f"{doing} at {where} was refused (HTTP {status})",
            "check the token ($HF_TOKEN or model.token_file) and that it may read the repo (gated repos "
            "need access granted on the Hub)",
        )
    if status == 429:
        retry = _header(response, "Retry-After")
        later = f"retry after {retry} s" if retry else "retry in a few minutes"
        return f"{doing} at {where} was rate-limited (HTTP 429)", f"{later}; a token raises the Hub's limits"
    if isinstance(status, int) and status >= 500:
        return f"{doing} at {where} failed: the Hub answered HTTP {status}", "the Hub has trouble: retry later"
    return f"{doing} at {where} failed: {_first_line(exc)}", "check model.repo, model.revision and the token"


def _header(response: object, name: str) -> str | None:
    headers = getattr(response, "headers", None)
    try:
        value = headers.get(name) if headers is not None else None
    except Exception:  # a header mapping we do not know: no advice from it
        return None
    return str(value) if value else None


def _network(exc: BaseException, model: Model, where: str, doing: str) -> Classified:
    del model
    if not _is_network_error(exc):
        return None
    names = {cls.__name__ for cls in _chain_types(exc)}
    detail = _first_line(exc)
    if any("Timeout" in name for name in names):
        return f"{doing} at {where} timed out", "the Hub is slow or unreachable: retry later, check the network"
    if any("SSL" in name or "Certificate" in name for name in names) or "CERTIFICATE" in detail.upper():
        return f"{doing} at {where} failed: TLS: {detail}", "check the system clock and CA certificates, or the mirror"
    if socket.gaierror in _chain_types(exc) or "name resolution" in detail.lower() or "not known" in detail:
        return f"{doing}: cannot resolve the host of {where}", "check DNS and model.endpoint"
    return (
        f"{doing}: cannot reach {where}: {detail}",
        "check the network and model.endpoint; commands that do not need the Hub keep working",
    )


def _is_network_error(exc: BaseException) -> bool:
    for cls in _chain_types(exc):
        module = cls.__module__.split(".")[0]
        if module in _HTTP_STACKS or issubclass(cls, ConnectionError | TimeoutError | socket.gaierror):
            return True
    return False


_HTTP_STACKS = {"httpx", "httpx2", "httpcore", "requests", "urllib3", "h11", "h2"}


def _chain_types(exc: BaseException) -> list[type[BaseException]]:
    """Every class of the exception and of its causes (the client wraps transport errors)."""
    found: list[type[BaseException]] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        found += [cls for cls in type(current).__mro__ if issubclass(cls, BaseException)]
        current = current.__cause__ or current.__context__
    return found


def _local(exc: BaseException, model: Model, where: str, doing: str) -> Classified:
    del model, where
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return (
            f"the disk filled up while {doing.lower()}",
            "free space (or point model_dir at a larger disk) and run apply again: the download resumes",
        )
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{doing} failed: {exc.strerror or exc} ({exc.filename})", "check the model dir's permissions and disk"
    return None


def _malformed(exc: BaseException, model: Model, where: str, doing: str) -> Classified:
    del model
    if isinstance(exc, ValueError | KeyError | TypeError | AttributeError | IndexError):
        return (
            f"{doing} at {where}: the answer is not what a Hub sends ({type(exc).__name__}: {_first_line(exc)})",
            "check model.endpoint: a proxy or captive portal may answer instead of the Hub",
        )
    return None


_CLASSIFIERS: tuple[tuple[str, Callable[[BaseException, Model, str, str], Classified]], ...] = (
    ("not-found", _not_found),
    ("http", _http_status),
    ("network", _network),
    ("local", _local),
    ("malformed", _malformed),
)


def list_files(model: Model, revision: str | None = None) -> HubListing:
    """The commit `revision` (default: the spec's) points at and every file there, with sizes
    and LFS sha256."""
    revision = revision or model.revision
    with hub_call(model, f"listing {model.repo}@{revision}"):
        api = HfApi(endpoint=endpoint(model), token=token(model))
        commit = api.model_info(model.repo, revision=revision, timeout=READ_TIMEOUT_S).sha
        if not isinstance(commit, str) or not _COMMIT_RE.match(commit):
            raise HubError(
                f"the Hub gave no commit for {model.repo}@{revision} (got {commit!r:.60})",
                "check model.endpoint: a mirror must answer the revision call with the commit sha",
                kind="malformed",
            )
        entries = api.list_repo_tree(model.repo, revision=commit, recursive=True)
        files = [_hub_file(entry) for entry in entries if isinstance(entry, RepoFile)]
    return HubListing(commit=commit, files=files)


_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
MANIFEST_LIMIT = 1024 * 1024


def resolve(model: Model) -> str:
    """The commit the spec's revision (a branch or tag) points at on the Hub now."""
    with hub_call(model, f"resolving {model.repo}@{model.revision}"):
        api = HfApi(endpoint=endpoint(model), token=token(model))
        commit = api.model_info(model.repo, revision=model.revision, timeout=READ_TIMEOUT_S).sha
    if not isinstance(commit, str) or not _COMMIT_RE.match(commit):
        raise HubError(
            f"the Hub gave no commit for {model.repo}@{model.revision} (got {commit!r:.60})",
            "check model.endpoint: a mirror must answer the revision call with the commit sha",
            kind="malformed",
        )
    return commit


def manifest_entries(model: Model, commit: str) -> dict[str, str] | None:
    """The manifest of `commit` (the sha256 of every native shard), fetched alone; None when the
    repo has none."""
    with (
        hub_call(model, f"reading {model.manifest} of {model.repo}@{commit[:12]}"),
        tempfile.TemporaryDirectory() as scratch,
    ):
        try:
            path = _client_download(model, model.manifest, commit, scratch)
        except EntryNotFoundError as exc:
            if isinstance(exc, LocalEntryNotFoundError):  # no Hub answer at all, not "no such file"
                raise
            return None
        data = read_bounded(path, limit=MANIFEST_LIMIT)
    return parse_manifest(data.decode("utf-8", "replace"))


_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
# The Hub caps one file at 50 GB; anything far beyond is an answer not to trust.
MAX_FILE_BYTES = 1000**4


def _hub_file(entry: RepoFile) -> HubFile:
    """One listed file, refused unless its path stays inside the model dir and its size is sane."""
    path, size = entry.path, entry.size
    if not isinstance(path, str) or not is_inside(path):
        raise HubError(
            f"the Hub lists a file with an unsafe path {path!r:.120}",
            "refusing the listing: a repo path must be relative, without '..', and printable",
            kind="malformed",
        )
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_FILE_BYTES:
        raise HubError(f"the Hub lists {path} with an impossible size {size!r:.40}", "retry later", kind="malformed")
    sha256 = entry.lfs.sha256 if entry.lfs is not None else None
    if sha256 is not None and not (isinstance(sha256, str) and _SHA256_RE.match(sha256)):
        raise HubError(f"the Hub lists {path} with a malformed sha256", "retry later", kind="malformed")
    etag = sha256 or entry.blob_id
    if not isinstance(etag, str) or not re.match(r"^[0-9a-f]{1,64}$", etag):
        raise HubError(f"the Hub lists {path} without a usable blob id", "retry later", kind="malformed")
    blob_id = entry.blob_id if isinstance(entry.blob_id, str) and re.match(r"^[0-9a-f]{40}$", entry.blob_id) else None
    return HubFile(path=path, size=size, etag=etag, sha256=sha256, blob_id=blob_id)


def _partials(local_dir: Path, item: HubFile) -> list[Path]:
    directory = local_dir / DOWNLOAD_CACHE / Path(item.path).parent
    prefix = _short_hash(f"{Path(item.path).name}.metadata") + "."
    if not directory.is_dir():
        return []
    return [path for path in directory.iterdir() if path.name.startswith(prefix) and path.name.endswith(".incomplete")]


def _etag_of(partial: Path) -> str:
    """`<hash>.<etag>.<uuid8>.incomplete` (>= 1.18) or `<hash>.<etag>.incomplete` (older)."""
    parts = partial.name.split(".")
    return parts[1] if len(parts) >= 3 else ""


def resume_partials(
    model: Model, local_dir: str, listing: HubListing, report: Callable[[str], None]
) -> list[tuple[str, int]]:
    """Finish downloads a killed run left behind; return (path, bytes already there) per resumed file."""
    root = Path(local_dir)
    resumed: list[tuple[str, int]] = []
    for item in listing.files:
        if (root / item.path).exists():
            continue
        usable = [p for p in _partials(root, item) if _etag_of(p) == item.etag and p.stat().st_size < item.size]
        keep = max(usable, key=lambda path: path.stat().st_size, default=None)
        for garbage in _partials(root, item):
            if garbage != keep:
                garbage.unlink(missing_ok=True)
        if keep is not None and keep.stat().st_size > 0:
            have = keep.stat().st_size
            report(f"    resuming {item.path} at byte {have} of {item.size}")
            _finish(model, root, listing.commit, item, keep)
            resumed.append((item.path, have))
    return resumed


def _finish(model: Model, root: Path, commit: str, item: HubFile, partial: Path) -> None:
    url = hf_hub_url(model.repo, item.path, revision=commit, endpoint=endpoint(model))
    have = partial.stat().st_size
    with hub_call(model, f"resuming {item.path}"), partial.open("ab") as handle:
        http_get(url, handle, resume_size=have, headers=build_hf_headers(token=token(model)), expected_size=item.size)
    if partial.stat().st_size != item.size:
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
        part = _PART.search(item.path) is not None
        return (not part, 0 if part else -item.size, item.path)

    return sorted(files, key=key)


_PART = re.compile(r"\.safetensors\.part[0-9]{2}$")


def _client_download(model: Model, path: str, commit: str, local_dir: str) -> str:
    """One file of the repo at `commit` into `local_dir`, by the client (its resume, its metadata)."""
    return hf_hub_download(
        model.repo, path, revision=commit, local_dir=local_dir, endpoint=endpoint(model), token=token(model)
    )


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
    every stream on it (reconciler/hubranges.py), so files finish one after another; any other
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
    headers = hubranges.auth_headers(token(model))
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
    target = hubranges.target_of(endpoint(model), model.repo, root, commit, item.path, item.size, item.etag)
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
    only: list[str] | None = None,
    on_bytes: Callable[[Counter], None] | None = None,
    on_file: Callable[[HubFile], None] | None = None,
) -> HubListing:
    """List `commit`, resume what a killed run left, then fetch the rest file by file.

    `only` holds repo paths or glob patterns (e.g. a shard's `.part[0-9][0-9]`): re-fetching
    one corrupt file must not bring back every other file's pruned parts. None: the whole repo.
    `on_bytes` gets what is on disk every few seconds (see `downloaded`); `on_file` each file
    once it is complete on disk (also one that already was), from the download's threads.
    """
    listing = list_files(model, commit)
    wanted = (
        listing if only is None else HubListing(listing.commit, [f for f in listing.files if _matches(f.path, only)])
    )
    with _metered(Path(local_dir), wanted.files, on_bytes):
        resume_partials(model, local_dir, wanted, report)
        download_files(model, local_dir, listing.commit, wanted.files, on_file, report)
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
        if _size(root / path) == item.size:
            done += item.size
            complete += 1
            continue
        started = partial.get((str(path.parent), _short_hash(f"{path.name}.metadata")), 0)
        done += min(started, item.size)
        if started and current is None:
            current = item.path
    return Counter("download", done, sum(item.size for item in files), complete, len(files), current)


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


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
                size = _size(cache / name) or 0
            key = (directory, name.split(".", 1)[0])
            sizes[key] = max(sizes.get(key, 0), size)
    return sizes


def _matches(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)
