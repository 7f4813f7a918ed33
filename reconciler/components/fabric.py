"""The fabric each rank binds to: the spec's overrides over what detection found, one subnet.

Binding tensor-parallel traffic to the wrong interface or HCA is the most common two-Spark
failure, so whatever cannot be settled from the facts blocks the rank group with the override
that would settle it. Detection itself (which port is ACTIVE, which address it carries) is
observation and lives in facts/fabric.py; this is the policy the rank component applies.
"""

from __future__ import annotations

from reconciler.actions import Blocker, Component
from reconciler.facts.fabric import subnet_mismatches
from reconciler.facts.node import Facts
from reconciler.serving import NodeContext, ResolvedFabric
from reconciler.spec import Deployment, Node

COMPONENT = Component.RANKS


def resolve_fabric(node: Node, facts: Facts) -> ResolvedFabric | Blocker:
    """Spec overrides win field by field; what is still unknown blocks the group, saying why."""
    detected = facts.nodes[node.name].fabric
    ifname = node.fabric.ifname or detected.ifname
    ip = node.fabric.ip or detected.ip
    hcas = node.fabric.hcas if node.fabric.hcas is not None else detected.hcas
    if ifname is None or ip is None:
        unknown = " and ".join(name for name, value in (("interface", ifname), ("IPv4", ip)) if value is None)
        message = detected.problem or f"fabric {unknown} not detected (no ACTIVE RoCE port with an IPv4 address?)"
        return Blocker(node.name, COMPONENT, message, fabric_hint(node.name, ifname, detected.candidates))
    return ResolvedFabric(ifname=ifname, ip=ip, hcas=tuple(hcas), gid_index=node.fabric.gid_index)


def fabric_hint(node: str, ifname: str | None, candidates: list[str]) -> str:
    """The override that settles it: the interface (its IPv4 and HCAs follow) or, on a known
    interface with several addresses, the IPv4."""
    field = "ifname" if ifname is None else "ip"
    if candidates:
        return (
            f"set nodes[{node}].fabric.{field} to one of {', '.join(candidates)} "
            "(the same QSFP port on every node); the rest is then derived from it"
        )
    return (
        f"check `rdma link` and `ip -br addr` on {node}: give the ACTIVE QSFP port a static IPv4 (netplan), "
        f"or set nodes[{node}].fabric.ifname and .ip"
    )


def subnet_blockers(deployment: Deployment, facts: Facts, contexts: dict[str, NodeContext]) -> list[Blocker]:
    """Every node's fabric address must share a subnet with the head's (prefix lengths from the
    interface that carries the address; unknown for an override on no interface)."""
    addresses: dict[str, tuple[str, int | None]] = {}
    for _, node in deployment.ranked_nodes:
        if node.name in contexts:
            ip = contexts[node.name].fabric.ip
            detected = facts.nodes[node.name].fabric
            addresses[node.name] = (ip, detected.prefixlen if detected.ip == ip else None)
    hint = (
        "give every node's QSFP port an address in one subnet (netplan), or fix nodes[].fabric.ip; "
        "`ip -br addr` shows them"
    )
    return [Blocker(node, COMPONENT, message, hint) for node, message in subnet_mismatches(addresses)]


def node_contexts(deployment: Deployment, facts: Facts) -> tuple[dict[str, NodeContext], list[Blocker]]:
    """What each rank's container is rendered from (home, fabric); whatever is unknown blocks."""
    contexts: dict[str, NodeContext] = {}
    blockers: list[Blocker] = []
    for _, node in deployment.ranked_nodes:
        observed = facts.nodes[node.name]
        if not observed.reachable:
            hint = "the rank group is left as it is until every node answers"
            blockers.append(Blocker(node.name, COMPONENT, f"node unreachable: {observed.error or 'no answer'}", hint))
            continue
        fabric = resolve_fabric(node, facts)
        if isinstance(fabric, Blocker):
            blockers.append(fabric)
        elif observed.home is None:
            blockers.append(
                Blocker(node.name, COMPONENT, "home directory unknown", "facts must include the node's home")
            )
        else:
            contexts[node.name] = NodeContext(home=observed.home, fabric=fabric)
    return contexts, blockers + subnet_blockers(deployment, facts, contexts)
