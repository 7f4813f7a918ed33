"""Where a worker's checkpoint files come from: the head, or the worker before it in a chain
once that one holds the verified revision; over the fabric to a copy daemon, or over SSH."""

from __future__ import annotations

from reconciler.actions import Blocker
from reconciler.components.assessment import NodeView
from reconciler.components.fabric import resolve_fabric
from reconciler.facts.node import Facts
from reconciler.record import Record
from reconciler.spec import Deployment, Node


class PeerSource(Record):
    """Where a peer-sourced worker's files come from: `origin` (the head, or a worker that holds
    the verified revision once `after` is done) over `fabric` (origin's address, the worker's),
    and `why` when that is not the head."""

    origin: NodeView
    after: str
    fabric: tuple[str, str] | None
    head: NodeView
    why: str = ""
    # "ssh" when the spec chose it; "fabric" also when the fabric is not settled (then SSH too).
    transport: str = "fabric"


def peer_source(
    deployment: Deployment,
    facts: Facts,
    head: NodeView,
    head_done: str,
    relay: tuple[NodeView, str] | None,
    node: Node,
) -> PeerSource:
    """A chain: each worker copies from the one before it once that one's copy is verified, so
    every node uploads the checkpoint at most once and the head's upload does not grow with the
    workers. The head serves the first worker, and any worker the fabric cannot reach from the
    one before it (a copy from a worker goes only to a daemon on the fabric). With
    `copy_transport: ssh` the head serves every worker over SSH: workers hold no SSH keys to
    each other."""
    if deployment.model.copy_transport == "ssh":
        return PeerSource(head, head_done, None, head, transport="ssh")
    if relay is not None:
        previous, verified = relay
        fabric = fabric_pair(facts, previous.node, node)
        if fabric is not None:
            why = f"{previous.node.name} holds the verified revision by then: the workers copy in a chain"
            return PeerSource(previous, verified, fabric, head, why)
    return PeerSource(head, head_done, fabric_pair(facts, head.node, node), head)


def fabric_pair(facts: Facts, source: Node, destination: Node) -> tuple[str, str] | None:
    """The fabric addresses a copy connects between, when both are settled."""
    source_end, destination_end = (resolve_fabric(node, facts) for node in (source, destination))
    if isinstance(source_end, Blocker) or isinstance(destination_end, Blocker):
        return None
    return source_end.ip, destination_end.ip


def pipelined_cause(origin: NodeView) -> str:
    name = origin.node.name
    return (
        f"pipelined: starts while {name} still gets the files and sends each one once it is complete and its "
        f"sha256 matches on {name} (a shard once reassembled, never its parts)"
    )


def copy_route(source: PeerSource) -> str:
    if source.transport == "ssh":
        return "over SSH, as model.copy_transport says (parallel rsync streams, encrypted, resumable)"
    if source.fabric is None:
        return "over SSH, fabric addresses not settled (parallel rsync streams, resumable)"
    origin_ip, worker_ip = source.fabric
    return f"over the fabric {origin_ip} -> {worker_ip} (parallel rsync streams to a daemon for this copy, resumable)"
