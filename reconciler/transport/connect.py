"""Choose and open the transport of each node."""

from __future__ import annotations

from reconciler.spec import Deployment, Node
from reconciler.transport.base import Transport
from reconciler.transport.local import LocalTransport
from reconciler.transport.ssh import SshTransport


def transport_for(node: Node) -> Transport:
    """No `ssh:` in the spec means the machine running the reconciler."""
    if node.ssh is None:
        return LocalTransport(node.name)
    return SshTransport(node.name, node.ssh)


def connect_all(deployment: Deployment) -> dict[str, Transport]:
    """Transports connect lazily; errors surface when a node is first used."""
    return {node.name: transport_for(node) for node in deployment.nodes}


def close_all(transports: dict[str, Transport]) -> None:
    for transport in transports.values():
        transport.close()
