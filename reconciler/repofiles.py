"""A model repo's files at one commit, as the Hub lists them: the one Hub-file type, the
manifest beside them, and which names may be file paths in a model dir at all."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field

from reconciler.record import KeywordRecord

# A git commit or blob id, and a sha256, as the Hub and sha256sum spell them; a repository in
# git's SHA-256 object format names its blobs with 64 hex digits.
GIT_ID = r"^[0-9a-f]{40}$"
SHA256 = r"^[0-9a-f]{64}$"
# The Hub caps one file at 50 GB; a size far beyond is an answer (or a cached listing) not to trust.
MAX_FILE_BYTES = 1000**4
BLOB_ID = r"^[0-9a-f]{40}(?:[0-9a-f]{24})?$"


class HubFile(KeywordRecord):
    """A file of the repo at one commit (a shard's `.partNN` too), as the Hub lists it: the
    listing, a download's payload and the download itself all hold this one type."""

    path: str
    size: Annotated[int, Field(ge=0, le=MAX_FILE_BYTES)]
    # The LFS sha256 of a large file; None for a small file kept in git itself.
    sha256: Annotated[str, Field(pattern=SHA256)] | None = None
    # The git blob id: what tells two versions of a small (non-LFS) file apart.
    blob_id: Annotated[str, Field(pattern=BLOB_ID)] | None = None

    @property
    def etag(self) -> str:
        """What the Hub's ETag for the file holds, and the client names a partial download by."""
        return self.sha256 or self.blob_id or ""


def parse_manifest(text: str) -> dict[str, str]:
    """Parse `sha256sum` output ("<hex>  <path>", or "<hex> *<path>" in binary mode).

    Only entries that name a file inside the model dir count: a path with '..', an absolute
    one or a malformed digest is not something to fetch, copy or compare.
    """
    entries: dict[str, str] = {}
    for line in text.splitlines():
        digest, _, path = line.strip().partition(" ")
        path = path.lstrip(" *").removeprefix("./")
        if re.match(SHA256, digest.lower()) and is_inside(path):
            entries[path] = digest.lower()
    return entries


def is_inside(path: str) -> bool:
    """Relative, '/'-separated, no empty, '.' or '..' component, printable: it cannot leave its root."""
    if not path or path.startswith("/") or len(path) > 1024:
        return False
    if any(not char.isprintable() or char == "\\" for char in path):
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))
