"""File facts: the checkpoint's revisions on a node, the staged EXL3 plans, and the API key file.

A node keeps each checkpoint revision in a directory of its own beside the spec's model_dir,
`<model_dir>@<commit>`, and model_dir itself is a symlink to the one the ranks serve. A model_dir
that is a real directory is a checkpoint from before revisions were kept (or one another tool
downloaded): `legacy`, with the commit its download metadata names when it names one.

Hashes come from a hash cache keyed by (path, size, mtime_ns, inode), so `sha256` is None for a
file whose content has not been verified since it last changed. A file hardlinked into another
revision keeps its inode and so its verified hash.
"""

from __future__ import annotations

import re
from ipaddress import IPv4Address
from typing import Annotated, TypeVar

from pydantic import AfterValidator, Field, field_serializer, field_validator

from reconciler.facts.base import FactsModel, KernelCount, SignedKernelCount
from reconciler.repofiles import GIT_ID, SHA256, HubFile, is_inside

V = TypeVar("V")


def _inside_model_dir(files: dict[str, V]) -> dict[str, V]:
    """Every file name must stay inside the model dir: such names become fetch and copy paths."""
    for name in files:
        if not is_inside(name):
            raise ValueError(f"file name {name!r:.80} is not a relative path inside the model dir")
    return files


def _commits(value: dict[str, V]) -> dict[str, V]:
    for commit in value:
        if not re.match(GIT_ID, commit):
            raise ValueError(f"{commit!r:.60} is not a 40-hex commit")
    return value


# Files by name, and revisions or listings by commit.
InsideModelDir = Annotated[dict[str, V], AfterValidator(_inside_model_dir)]
ByCommit = Annotated[dict[str, V], AfterValidator(_commits)]


class FileFacts(FactsModel):
    size: KernelCount
    sha256: str | None = Field(default=None, pattern=SHA256)


class HubFacts(FactsModel):
    """The repo at one commit, as the Hub lists it, with the entries of its manifest (cached in
    STATE_DIR/hub/ on the head, one file per commit)."""

    commit: str = Field(pattern=GIT_ID)
    files: InsideModelDir[HubFile] = Field(default_factory=dict)
    # The manifest's sha256 of every native shard: the Hub lists two of them only as parts.
    manifest: InsideModelDir[str] | None = None

    @field_validator("files", mode="before")
    @classmethod
    def _named_by_key(cls, files: object) -> object:
        # Stored, a file's path is its key only; the key names it, whatever the entry says.
        if not isinstance(files, dict):
            return files
        return {name: {**entry, "path": name} if isinstance(entry, dict) else entry for name, entry in files.items()}

    @field_serializer("files")
    def _stored(self, files: dict[str, HubFile]) -> dict[str, dict[str, object]]:
        # A file as it was always stored: its key names it, and an absent hash is left out.
        fields = ("size", "sha256", "blob_id")
        return {
            name: {key: getattr(item, key) for key in fields if getattr(item, key) is not None}
            for name, item in files.items()
        }


class RevisionFacts(FactsModel):
    """One checkpoint tree on a node: its files, its manifest and EXL3 plan, its staged plan."""

    path: str
    files: InsideModelDir[FileFacts] = Field(default_factory=dict)
    manifest: InsideModelDir[str] | None = None
    # The model's EXL3 plan and the one staged for the ranks (STATE_DIR/plans/<commit>/), as text.
    exl3_plan: str | None = None
    staged_plan: str | None = None


class Resolved(FactsModel):
    """A branch or tag of the spec pinned to the commit it pointed at when first converged."""

    revision: str
    commit: str = Field(pattern=GIT_ID)
    since: str | None = None


class CheckpointRecord(FactsModel):
    """STATE_DIR/checkpoint.json on a node: which commits it served, most recent first, and (on
    the head) what a branch of the spec was pinned to."""

    repo: str
    history: list[str] = Field(default_factory=lambda: [])
    resolved: Resolved | None = None
    serving_since: str | None = None


class CheckpointFacts(FactsModel):
    """The revisions on a node, what model_dir is, free disk, and (on the head) the Hub's view."""

    revisions: ByCommit[RevisionFacts] = Field(default_factory=dict)
    # The commit whose directory model_dir links to; None when it is no such link.
    link: str | None = None
    legacy: RevisionFacts | None = None
    legacy_commit: str | None = Field(default=None, pattern=GIT_ID)
    record: CheckpointRecord | None = None
    disk_free: SignedKernelCount | None = None
    # Listings by commit; on the head only.
    hub: ByCommit[HubFacts] = Field(default_factory=dict)
    # Why a listing that was needed is unknown: the Hub was asked and failed.
    hub_error: str | None = None
    # The commit model.revision points at on the Hub now (asked for a branch or tag).
    upstream: str | None = Field(default=None, pattern=GIT_ID)


# A certificate's SHA-256 fingerprint as browsers and `openssl x509 -fingerprint` show it.
FINGERPRINT_RE = re.compile(r"[0-9A-F]{2}(?::[0-9A-F]{2}){31}")


class KeyFileFacts(FactsModel):
    """The API key file on the head, described without its content."""

    present: bool = False
    empty: bool = True
    mode: int | None = None
    # Changes when the file is rewritten or replaced (mtime, inode, size): the front reloads the key.
    version: str | None = None


class TlsFacts(FactsModel):
    """The front's TLS certificate (with its fingerprint) and key, never the key's content."""

    cert: KeyFileFacts = KeyFileFacts()
    key: KeyFileFacts = KeyFileFacts()
    fingerprint: str | None = Field(default=None, pattern=FINGERPRINT_RE.pattern)
    # The head's own IPv4 addresses: what LAN clients reach the API by, named in a self-signed certificate.
    addresses: list[IPv4Address] = Field(default_factory=lambda: [], max_length=16)
