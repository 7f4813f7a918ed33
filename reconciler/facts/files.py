"""File facts: the checkpoint on a node, the staged EXL3 plan, and the API key file.

Hashes come from a hash cache keyed by (path, size, mtime_ns, inode), so `sha256` is
None for a file whose content has not been verified since it last changed.
"""

from __future__ import annotations

from pydantic import Field

from reconciler.facts.base import FactsModel


class FileFacts(FactsModel):
    size: int
    sha256: str | None = None


class HubFileFacts(FactsModel):
    size: int
    sha256: str | None = None


class HubFacts(FactsModel):
    """The repo at the pinned commit, as the Hub lists it (cached in STATE_DIR after a download)."""

    commit: str
    files: dict[str, HubFileFacts] = Field(default_factory=dict)


class CheckpointFacts(FactsModel):
    """Files under the model dir (relative paths), the manifest found there, free disk, Hub listing."""

    files: dict[str, FileFacts] = Field(default_factory=dict)
    manifest: dict[str, str] | None = None
    plan_staged: bool = False
    disk_free: int | None = None
    hub: HubFacts | None = None


class KeyFileFacts(FactsModel):
    """The API key file on the head, described without its content."""

    present: bool = False
    empty: bool = True
    mode: int | None = None


def parse_manifest(text: str) -> dict[str, str]:
    """Parse `sha256sum` output ("<hex>  <path>", or "<hex> *<path>" in binary mode)."""
    entries: dict[str, str] = {}
    for line in text.splitlines():
        digest, _, path = line.strip().partition(" ")
        path = path.lstrip(" *")
        if len(digest) == 64 and path:
            entries[path] = digest.lower()
    return entries
