"""The repo's files at a commit, as the Hub lists them, and the manifest beside them."""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass

from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError
from huggingface_hub.hf_api import RepoFile

from reconciler.errors import HubError
from reconciler.fsutil import read_bounded
from reconciler.hub import client
from reconciler.hub.client import endpoint, token
from reconciler.hub.failures import hub_call
from reconciler.repofiles import BLOB_ID, GIT_ID, MAX_FILE_BYTES, SHA256, HubFile, is_inside, parse_manifest
from reconciler.spec import Model


@dataclass(frozen=True)
class HubListing:
    commit: str
    files: list[HubFile]


def list_files(model: Model, revision: str | None = None) -> HubListing:
    """The commit `revision` (default: the spec's) points at and every file there, with sizes
    and LFS sha256."""
    revision = revision or model.revision
    with hub_call(model, f"listing {model.repo}@{revision}"):
        api = HfApi(endpoint=endpoint(model), token=token(model))
        commit = _commit_of(api, model, revision)
        entries = api.list_repo_tree(model.repo, revision=commit, recursive=True)
        files = [_hub_file(entry) for entry in entries if isinstance(entry, RepoFile)]
    return HubListing(commit=commit, files=files)


def resolve(model: Model) -> str:
    """The commit the spec's revision (a branch or tag) points at on the Hub now."""
    with hub_call(model, f"resolving {model.repo}@{model.revision}"):
        return _commit_of(HfApi(endpoint=endpoint(model), token=token(model)), model, model.revision)


def _commit_of(api: HfApi, model: Model, revision: str) -> str:
    commit = api.model_info(model.repo, revision=revision, timeout=client.READ_TIMEOUT_S).sha
    if not isinstance(commit, str) or not re.match(GIT_ID, commit):
        raise HubError(
            f"the Hub gave no commit for {model.repo}@{revision} (got {commit!r:.60})",
            "check model.endpoint: a mirror must answer the revision call with the commit sha",
            kind="malformed",
        )
    return commit


MANIFEST_LIMIT = 1024 * 1024


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
    if sha256 is not None and not (isinstance(sha256, str) and re.match(SHA256, sha256)):
        raise HubError(f"the Hub lists {path} with a malformed sha256", "retry later", kind="malformed")
    blob_id = entry.blob_id if isinstance(entry.blob_id, str) and re.match(BLOB_ID, entry.blob_id) else None
    if sha256 is None and blob_id is None:
        raise HubError(f"the Hub lists {path} without a usable blob id", "retry later", kind="malformed")
    return HubFile(path=path, size=size, sha256=sha256, blob_id=blob_id)


def _client_download(model: Model, path: str, commit: str, local_dir: str) -> str:
    """One file of the repo at `commit` into `local_dir`, by the client (its resume, its metadata)."""
    return hf_hub_download(
        model.repo, path, revision=commit, local_dir=local_dir, endpoint=endpoint(model), token=token(model)
    )
