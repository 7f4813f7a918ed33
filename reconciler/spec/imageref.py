"""An image's identity: its pinned digest, whatever name or local image ID a node knows it by.

A node that took the image from a peer knows it under the peer relay's name
(127.0.0.1:<port>/<path>@sha256:<digest>), and its local image ID depends on the node's image
store (overlay2 names an image by its config, the containerd store by its manifest). The
digest of the manifest or index the registry sent is the same everywhere: that is the image.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_DIGEST = re.compile(r"@(sha256:[0-9a-f]{64})$")
# Docker's name for its public registry, and the host its API answers on.
DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"


def digest_of(ref: str) -> str | None:
    """`sha256:<hex>` of a pinned ref; None for a tag."""
    found = _DIGEST.search(ref)
    return found.group(1) if found else None


def same_image(one: str, other: str) -> bool:
    """Two refs name the same image: the same pinned digest, or (a tag) the same text."""
    digest = digest_of(one)
    return digest == digest_of(other) if digest is not None else one == other


def local_name(known: list[str], ref: str) -> str | None:
    """The name a node knows `ref`'s image by, among the refs its Docker lists: `ref` itself
    when listed, else any listed name with the same pinned digest; None when absent."""
    if ref in known:
        return ref
    digest = digest_of(ref)
    if digest is None:
        return None
    return next((name for name in known if digest_of(name) == digest), None)


@dataclass(frozen=True)
class Registry:
    """Where a ref's registry answers: `host` (with a port when it has one) and the repository
    `path` in it, as Docker resolves a name."""

    host: str
    path: str

    @property
    def api_host(self) -> str:
        return DOCKER_HUB_API if self.host == DOCKER_HUB else self.host

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) to connect to: 443 unless the name says otherwise; an IPv6 host comes in
        brackets ([fd00::1]:5000) and leaves without them."""
        host = self.api_host
        name, colon, port = host.rpartition(":")
        bracketed = host.startswith("[")
        if colon and port.isdigit() and (not bracketed or name.endswith("]")):
            host, number = name, int(port)
        else:
            number = 443
        return (host[1:-1] if host.startswith("[") and host.endswith("]") else host), number


def registry_of(ref: str) -> Registry:
    """Docker's rule: the first component is a registry host when it has a '.' or ':' or is
    localhost; otherwise the name is on Docker Hub, a one-part name under library/."""
    name = ref.split("@", 1)[0]
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        host, path = first, rest
    else:
        host, path = DOCKER_HUB, name if slash else f"library/{name}"
    path = path.rsplit(":", 1)[0] if ":" in path.rsplit("/", 1)[-1] else path
    return Registry(host, path)
