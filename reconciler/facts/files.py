"""File facts: the checkpoint on a node, the staged EXL3 plan, and the API key file.

Hashes come from a hash cache keyed by (path, size, mtime_ns, inode), so `sha256` is
None for a file whose content has not been verified since it last changed.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator

from reconciler.facts.base import FactsModel


def _inside_model_dir(files: dict[str, Any]) -> dict[str, Any]:
    """Every file name must stay inside the model dir: such names become fetch and copy paths."""
    for name in files:
        if not is_inside(name):
            raise ValueError(f"file name {name!r:.80} is not a relative path inside the model dir")
    return files


class FileFacts(FactsModel):
    size: int = Field(ge=0)
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")


class HubFileFacts(FactsModel):
    size: int = Field(ge=0)
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")


class HubFacts(FactsModel):
    """The repo at the pinned commit, as the Hub lists it (cached in STATE_DIR after a download)."""

    commit: str
    files: dict[str, HubFileFacts] = Field(default_factory=dict)

    @field_validator("files")
    @classmethod
    def _inside(cls, files: dict[str, HubFileFacts]) -> dict[str, HubFileFacts]:
        return _inside_model_dir(files)


class CheckpointFacts(FactsModel):
    """Files under the model dir (relative paths), the manifest found there, free disk, Hub listing."""

    files: dict[str, FileFacts] = Field(default_factory=dict)
    manifest: dict[str, str] | None = None
    # The model's EXL3 plan and the one staged for the ranks, as text (None: not there); the
    # checkpoint component judges whether the staged one is current.
    exl3_plan: str | None = None
    staged_plan: str | None = None

    @field_validator("files", "manifest")
    @classmethod
    def _inside(cls, files: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if files is None else _inside_model_dir(files)

    disk_free: int | None = None
    hub: HubFacts | None = None
    # Why `hub` is unknown when the Hub was asked and failed (down, slow, refusing, wrong).
    hub_error: str | None = None


class KeyFileFacts(FactsModel):
    """The API key file on the head, described without its content."""

    present: bool = False
    empty: bool = True
    mode: int | None = None


def parse_manifest(text: str) -> dict[str, str]:
    """Parse `sha256sum` output ("<hex>  <path>", or "<hex> *<path>" in binary mode).

    Only entries that name a file inside the model dir count: a path with '..', an absolute
    one or a malformed digest is not something to fetch, copy or compare.
    """
    entries: dict[str, str] = {}
    for line in text.splitlines():
        digest, _, path = line.strip().partition(" ")
        path = path.lstrip(" *").removeprefix("./")
        if _SHA256_RE.match(digest.lower()) and is_inside(path):
            entries[path] = digest.lower()
    return entries


_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def is_inside(path: str) -> bool:
    """Relative, '/'-separated, no empty, '.' or '..' component, printable: it cannot leave its root."""
    if not path or path.startswith("/") or len(path) > 1024:
        return False
    if any(not char.isprintable() or char == "\\" for char in path):
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))
