"""The Hugging Face Hub client, as the checkpoint component uses it.

The real `huggingface_hub` client with the spec's endpoint (HF_ENDPOINT semantics), pinned
revision and token (from $HF_TOKEN or model.token_file; never printed, never in argv).

Mid-file resume: since huggingface_hub 1.18 (PR #4306) a download goes to a process-unique
`<hash>.<etag>.<uuid8>.incomplete` file that a later process never reuses, so a run killed
in the middle of a 50 GB shard would start that shard from byte 0 — and leave the old
partial behind as garbage. Before handing over to `snapshot_download`, `resume_partials`
finds such leftovers, checks them against the remote file (the etag in the name must be
the file's current etag, the size must be smaller), and finishes them with the client's own
ranged `http_get`, then records the client's download metadata so `snapshot_download` sees
the file as done. Stale or duplicate partials are deleted; model files never are.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import HfApi, hf_hub_url, snapshot_download
from huggingface_hub._local_folder import _short_hash, write_download_metadata
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
from huggingface_hub.file_download import http_get
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.utils._headers import build_hf_headers

from reconciler.errors import ReconcilerError
from reconciler.spec import Model

DOWNLOAD_CACHE = ".cache/huggingface/download"
PART_PATTERN = "*.safetensors.part[0-9][0-9]"


class HubError(ReconcilerError):
    """The Hub refused or failed a request."""


@dataclass(frozen=True)
class HubFile:
    """One file of the repo at the pinned commit, as the Hub lists it."""

    path: str
    size: int
    etag: str
    sha256: str | None


@dataclass(frozen=True)
class HubListing:
    commit: str
    files: list[HubFile]

    def by_path(self) -> dict[str, HubFile]:
        return {item.path: item for item in self.files}


def token(model: Model) -> str | None:
    if model.token_file:
        path = Path(os.path.expanduser(model.token_file))
        try:
            return path.read_text(encoding="utf-8").strip() or None
        except OSError as exc:
            raise HubError(
                f"cannot read model.token_file {path}: {exc.strerror}", "fix the path or remove it"
            ) from None
    return os.environ.get("HF_TOKEN") or None


def endpoint(model: Model) -> str | None:
    return model.endpoint or os.environ.get("HF_ENDPOINT") or None


def _translate(exc: Exception, model: Model) -> HubError:
    where = endpoint(model) or "the Hub"
    if isinstance(exc, RepositoryNotFoundError):
        return HubError(
            f"repository {model.repo} not found or not accessible at {where}",
            "check model.repo, and set $HF_TOKEN or model.token_file if the repo is gated",
        )
    if isinstance(exc, RevisionNotFoundError):
        return HubError(f"revision {model.revision} not found in {model.repo}", "check model.revision")
    if isinstance(exc, OSError) and exc.errno == 28:
        return HubError(
            f"the disk filled up while downloading: {exc}",
            "free space (or point model_dir at a larger disk) and run apply again: the download resumes",
        )
    return HubError(f"Hub request to {where} failed: {exc}", "retry; check the endpoint and your token")


def list_files(model: Model) -> HubListing:
    """The commit the revision points at and every file there, with sizes and LFS sha256."""
    api = HfApi(endpoint=endpoint(model), token=token(model))
    try:
        commit = api.model_info(model.repo, revision=model.revision).sha or model.revision
        entries = api.list_repo_tree(model.repo, revision=commit, recursive=True)
        files = [_hub_file(entry) for entry in entries if isinstance(entry, RepoFile)]
    except (HfHubHTTPError, OSError) as exc:
        raise _translate(exc, model) from None
    return HubListing(commit=commit, files=files)


def _hub_file(entry: RepoFile) -> HubFile:
    sha256 = entry.lfs.sha256 if entry.lfs is not None else None
    return HubFile(path=entry.path, size=entry.size, etag=sha256 or entry.blob_id, sha256=sha256)


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
    headers = build_hf_headers(token=token(model))
    have = partial.stat().st_size
    try:
        with partial.open("ab") as handle:
            http_get(url, handle, resume_size=have, headers=headers, expected_size=item.size)
    except (HfHubHTTPError, OSError) as exc:
        raise _translate(exc, model) from None
    if partial.stat().st_size != item.size:
        partial.unlink(missing_ok=True)
        raise HubError(f"{item.path}: resumed download has the wrong size", "run apply again to fetch it afresh")
    destination = root / item.path
    destination.parent.mkdir(parents=True, exist_ok=True)
    os.replace(partial, destination)
    write_download_metadata(root, item.path, commit, item.etag)


def download_snapshot(
    model: Model, local_dir: str, *, exclude_parts: bool, listing: HubListing, only: list[str] | None = None
) -> str:
    """Fetch what is missing into local_dir at the listed commit (only `only`, if given)."""
    try:
        return snapshot_download(
            repo_id=model.repo,
            revision=listing.commit,
            local_dir=local_dir,
            endpoint=endpoint(model),
            token=token(model),
            allow_patterns=only,
            ignore_patterns=[PART_PATTERN] if exclude_parts else None,
        )
    except (HfHubHTTPError, OSError) as exc:
        raise _translate(exc, model) from None


def fetch(
    model: Model,
    local_dir: str,
    *,
    exclude_parts: bool,
    report: Callable[[str], None],
    only: list[str] | None = None,
) -> HubListing:
    """List, resume what a killed run left, then let the client fetch the rest.

    `only` holds repo paths or glob patterns (e.g. a shard's `.part[0-9][0-9]`): re-fetching
    one corrupt file must not bring back every other file's pruned parts.
    """
    listing = list_files(model)
    wanted = (
        listing if only is None else HubListing(listing.commit, [f for f in listing.files if _matches(f.path, only)])
    )
    resume_partials(model, local_dir, wanted, report)
    download_snapshot(model, local_dir, exclude_parts=exclude_parts, listing=listing, only=only)
    return listing


def _matches(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)
