"""The stand-in Hub's view of one model repo: files, hashes and the JSON the real Hub returns for them.

TEST STAND-IN, not part of the product. A `RepoInfo` is what the checkpoint builder records next to the files
it writes (`standin-index.json`) and what the server loads to answer the Hub API. Everything the real
Hugging Face Hub derives from git is derived here from file contents:

- a file's `blob_id` is its git blob id (`sha1("blob <size>\\0" + content)`); for an LFS file it is the blob id
  of its LFS *pointer* file, as on the Hub, and the content hash is `lfs.sha256`;
- the ETag is the sha256 for LFS files and the git blob id otherwise;
- the commit sha is a sha1 over the sorted file list, so it is pinned and reproducible from content.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

INDEX_NAME = "standin-index.json"
FILES_DIR = "repo"
DEFAULT_REPO_ID = "0xSero/DeepSeek-V4.1-Flash-Spark"
# A fixed date keeps the builder's output (and so the commit sha) reproducible.
COMMIT_DATE = "2026-01-01T00:00:00.000Z"
COMMIT_TITLE = "Upload checkpoint (test stand-in)"


def git_blob_prefix(size: int) -> bytes:
    return b"blob %d\x00" % size


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The LFS pointer file git stores in place of a large file; the Hub reports its size as `pointerSize`."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def blob_id_of(data: bytes) -> str:
    return hashlib.sha1(git_blob_prefix(len(data)) + data, usedforsecurity=False).hexdigest()


def describe_file(files_dir: Path, path: str, *, lfs: bool) -> RepoFile:
    """Hash one file on disk (streaming: shards are large) into the `RepoFile` the Hub would report."""
    local = files_dir / path
    size = local.stat().st_size
    sha1 = hashlib.sha1(git_blob_prefix(size), usedforsecurity=False)
    sha256 = hashlib.sha256()
    with local.open("rb") as stream:
        while block := stream.read(1 << 20):
            sha1.update(block)
            sha256.update(block)
    content_sha256 = sha256.hexdigest()
    blob_id = blob_id_of(lfs_pointer(content_sha256, size)) if lfs else sha1.hexdigest()
    return RepoFile(path=path, size=size, blob_id=blob_id, sha256=content_sha256, lfs=lfs)


@dataclass(frozen=True)
class RepoFile:
    """One file of the repo as the Hub describes it."""

    path: str
    size: int
    blob_id: str
    sha256: str
    lfs: bool

    @property
    def etag(self) -> str:
        # The Hub's ETag for a resolve URL: content sha256 for LFS files, git blob id otherwise.
        return self.sha256 if self.lfs else self.blob_id

    @property
    def pointer_size(self) -> int:
        return len(lfs_pointer(self.sha256, self.size))

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "blob_id": self.blob_id, "sha256": self.sha256, "lfs": self.lfs}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RepoFile:
        return cls(
            path=str(data["path"]),
            size=int(data["size"]),
            blob_id=str(data["blob_id"]),
            sha256=str(data["sha256"]),
            lfs=bool(data["lfs"]),
        )


@dataclass(frozen=True)
class RepoInfo:
    """A built repo: id, pinned commit and files, plus where the files live on disk."""

    repo_id: str
    commit: str
    files: tuple[RepoFile, ...]
    files_dir: Path

    def file(self, path: str) -> RepoFile | None:
        return next((f for f in self.files if f.path == path), None)

    def by_sha256(self, sha256: str) -> RepoFile | None:
        return next((f for f in self.files if f.lfs and f.sha256 == sha256), None)

    def local_path(self, file: RepoFile) -> Path:
        return self.files_dir / file.path

    def directories(self) -> list[str]:
        dirs = {str(parent) for f in self.files for parent in PurePosixPath(f.path).parents if str(parent) != "."}
        return sorted(dirs)

    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {
            "repo_id": self.repo_id,
            "commit": self.commit,
            "files_dir": FILES_DIR,
            "files": [f.to_json() for f in self.files],
        }


def compute_commit(repo_id: str, files: list[RepoFile]) -> str:
    """A 40-hex commit id that changes whenever any path or content changes."""
    digest = hashlib.sha1(f"standin-commit {repo_id}\n".encode(), usedforsecurity=False)
    for f in sorted(files, key=lambda f: f.path):
        digest.update(f"{f.path}\x00{f.blob_id}\x00{f.sha256}\n".encode())
    return digest.hexdigest()


def tree_id(info: RepoInfo, directory: str) -> str:
    """A stable id for a directory, standing in for its git tree id."""
    prefix = directory + "/"
    digest = hashlib.sha1(f"standin-tree {directory}\n".encode(), usedforsecurity=False)
    for f in info.files:
        if f.path.startswith(prefix):
            digest.update(f"{f.path}\x00{f.blob_id}\n".encode())
    return digest.hexdigest()


def save_repo_info(out: Path, info: RepoInfo) -> Path:
    index = out / INDEX_NAME
    index.write_text(json.dumps(info.to_json(), indent=2) + "\n", encoding="utf-8")
    return index


def load_repo_info(root: Path) -> RepoInfo:
    """Load the index a build wrote into `root`; the files are under `root/<files_dir>`."""
    index = root / INDEX_NAME
    if not index.is_file():
        raise FileNotFoundError(f"{index} not found: build a checkpoint first (python3 -m tests.testbed.hub build)")
    data = json.loads(index.read_text(encoding="utf-8"))
    return RepoInfo(
        repo_id=str(data["repo_id"]),
        commit=str(data["commit"]),
        files=tuple(RepoFile.from_json(f) for f in data["files"]),
        files_dir=root / str(data.get("files_dir", FILES_DIR)),
    )
