"""The host underneath the group, judged: what breaks the fabric, and what only looks odd.

A group that ran for weeks stops starting after a host update: a kernel that breaks RDMA
memory registration, a reboot that reset one node's fabric MTU, a RoCE GID that moved to
another index. Each is found here from the facts, the same way for `doctor` (FAIL) and for the
plan (one blocker before any start or restart of the group, so a broken fabric is one message
with its fix, never a restart loop). Differences that may be harmless (kernel, driver or
firmware not the same on every node, a port whose RDMA rate is below its link's) are warnings.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from reconciler.actions import Blocker, Component
from reconciler.components.fabric import resolve_fabric
from reconciler.errors import ReconcilerError
from reconciler.facts.fabric import RdmaPort, gid_ipv4
from reconciler.facts.node import Facts
from reconciler.serving import ResolvedFabric
from reconciler.spec import Deployment, Node

ALL_NODES = "all nodes"
ROCE_V2 = "RoCE v2"
Severity = Literal["FAIL", "WARN"]


@dataclass(frozen=True)
class Finding:
    """One problem of the host: where, how bad, what, and how to fix it."""

    node: str
    check: str
    severity: Severity
    message: str
    fix: str


class KnownBadKernel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    release: str
    breaks: str
    works: str
    source: str
    fix: str


class KnownBad(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kernels: list[KnownBadKernel]


@functools.cache
def known_bad() -> KnownBad:
    """The shipped list of host releases known to break the fabric (reconciler/data/known-bad.yaml)."""
    text = (resources.files("reconciler") / "data" / "known-bad.yaml").read_text(encoding="utf-8")
    try:
        return KnownBad.model_validate(yaml.safe_load(text))
    except (yaml.YAMLError, ValidationError) as exc:
        raise ReconcilerError(
            f"reconciler/data/known-bad.yaml cannot be read: {exc}", "reinstall the reconciler"
        ) from None


# ---------------------------------------------------------------- what breaks the fabric


def fabric_faults(deployment: Deployment, facts: Facts) -> list[Finding]:
    """Every fault of the hosts that keeps a group from starting (or from running for long)."""
    nodes = [node for _, node, _ in facts.answering(deployment.ranked_nodes)]
    resolved = _resolved(nodes, facts)
    return [
        *(finding for node in nodes if (finding := _known_bad_kernel(node, facts)) is not None),
        *(finding for node in nodes if (finding := _gid_moved(node, facts, resolved.get(node.name))) is not None),
        *(finding for finding in mtu_findings(resolved, facts) if finding.severity == "FAIL"),
    ]


def fabric_blocker(deployment: Deployment, facts: Facts) -> Blocker | None:
    """The fabric faults as one blocker of the group's start, each with its fix."""
    faults = fabric_faults(deployment, facts)
    if not faults:
        return None
    where = faults[0].node if len({fault.node for fault in faults}) == 1 else deployment.head.name
    message = "the fabric is broken, so the group is not started: " + "; ".join(
        f"{_where(fault)}{fault.message}" for fault in faults
    )
    hint = "; ".join(f"{_where(fault)}{fault.fix}" for fault in faults) + " (then `reconciler doctor` passes)"
    return Blocker(where, Component.RANKS, message, hint)


def _where(finding: Finding) -> str:
    return "" if finding.node == ALL_NODES else f"{finding.node}: "


def _resolved(nodes: list[Node], facts: Facts) -> dict[str, ResolvedFabric]:
    found = {node.name: resolve_fabric(node, facts) for node in nodes}
    return {name: fabric for name, fabric in found.items() if isinstance(fabric, ResolvedFabric)}


def _known_bad_kernel(node: Node, facts: Facts) -> Finding | None:
    kernel = facts.nodes[node.name].host.kernel
    entry = next((item for item in known_bad().kernels if item.release == kernel), None)
    if entry is None:
        return None
    message = f"kernel {kernel} is known to break the fabric: {entry.breaks} ({entry.works} works; {entry.source})"
    return Finding(node.name, "kernel", "FAIL", message, entry.fix)


def _gid_moved(node: Node, facts: Facts, fabric: ResolvedFabric | None) -> Finding | None:
    """The ports NCCL will use must hold a RoCE v2 GID of their address at the spec's index: the
    fabric address on the detected port, any IPv4 address on the spec's HCAs (each CX-7 twin
    carries its own). Another address there, or the right one of another type, is a fault; a
    GID or type nobody could read is doctor's to warn about."""
    if fabric is None:
        return None
    ports = _fabric_ports(node, facts, fabric)
    wrong = [port for port in ports if _gid_wrong(port, None if node.fabric.hcas is not None else fabric.ip)]
    if not ports or not wrong or (node.fabric.hcas is None and len(wrong) < len(ports)):
        return None
    index = node.fabric.gid_index
    held = ", ".join(f"{port.hca} GID {index} = {port.gid} ({port.gid_type or 'type unknown'})" for port in wrong)
    wanted = fabric.ip if node.fabric.hcas is None else None
    moved = sorted({i for port in wrong for i in _roce_v2_indices(port, wanted)})
    address = f"the fabric address {fabric.ip}" if wanted else "the port's IPv4 address"
    message = f"RoCE GID {index} no longer holds {address} as RoCE v2: {held}"
    if moved:
        message += f"; the RoCE v2 GID is at index {' or '.join(str(i) for i in moved)} now"
        fix = f"set nodes[{node.name}].fabric.gid_index: {moved[0]} (NCCL_IB_GID_INDEX)"
    else:
        fix = (
            f"`cat /sys/class/infiniband/*/ports/1/gids/*` and `.../gid_attrs/types/*` on {node.name}: find the "
            f"RoCE v2 GID holding {address} and set nodes[{node.name}].fabric.gid_index to its index"
        )
    return Finding(node.name, "roce gid", "FAIL", message, fix)


def _gid_wrong(port: RdmaPort, ip: str | None) -> bool:
    """Whether the port's GID at the index is not (`ip`'s, or with None any IPv4's) RoCE v2 GID."""
    if port.gid is None:
        return False
    address = port.gid_ipv4
    holds = address is not None and (ip is None or address == ip)
    return not holds or (port.gid_type is not None and port.gid_type != ROCE_V2)


def _roce_v2_indices(port: RdmaPort, ip: str | None) -> list[int]:
    """Where in the port's GID table its address sits as RoCE v2 (the type read, or unknown)."""
    return [
        index
        for index, gid in port.gids.items()
        if (found := gid_ipv4(gid)) is not None
        and (ip is None or found == ip)
        and port.gid_types.get(index, ROCE_V2) == ROCE_V2
    ]


def _fabric_ports(node: Node, facts: Facts, fabric: ResolvedFabric) -> list[RdmaPort]:
    """The ACTIVE ports on the fabric interface (or the spec's HCAs): the ones NCCL will use."""
    ports = [port for port in facts.nodes[node.name].fabric.ports if port.active]
    if node.fabric.hcas is not None:
        return [port for port in ports if port.hca in node.fabric.hcas]
    return [port for port in ports if fabric.ifname in port.netdevs]


def mtu_findings(resolved: dict[str, ResolvedFabric], facts: Facts) -> list[Finding]:
    """The fabric interfaces' MTUs must agree: a mismatch ends in IBV_WC_RETRY_EXC_ERR mid-run.
    The MTUs that could be read are compared; one nobody could read is a warning (doctor's)."""
    mtus = {name: mtu_of(facts, name, fabric.ifname) for name, fabric in resolved.items()}
    listed = ", ".join(
        f"{name} {resolved[name].ifname} {mtu if mtu is not None else '?'}" for name, mtu in mtus.items()
    )
    known = [mtu for mtu in mtus.values() if mtu is not None]
    if len(set(known)) > 1:
        fix = f"set MTU {max(known)} on every fabric interface (netplan `mtu: 9000`, then `sudo netplan apply`)"
        return [Finding(ALL_NODES, "mtu", "FAIL", f"MTU differs: {listed}", fix)]
    if len(known) < len(mtus):
        return [Finding(ALL_NODES, "mtu", "WARN", f"MTU unknown: {listed}", "check `ip link` on every node")]
    return []


def mtu_of(facts: Facts, node: str, ifname: str) -> int | None:
    """The MTU of the interface the rank binds to: the detected one's, or its port's."""
    found = facts.nodes[node].fabric
    if found.ifname == ifname and found.mtu is not None:
        return found.mtu
    return next((port.mtu for port in found.ports if ifname in port.netdevs and port.mtu is not None), None)


# ---------------------------------------------------------------- what only looks odd


def host_warnings(deployment: Deployment, facts: Facts) -> list[Finding]:
    """Differences across nodes that may be harmless, and ports slower than their links."""
    nodes = [node for _, node, _ in facts.answering(deployment.ranked_nodes)]
    findings = [
        *_differs(nodes, "kernel", {node.name: facts.nodes[node.name].host.kernel for node in nodes}),
        *_differs(nodes, "gpu driver", {node.name: facts.nodes[node.name].host.driver for node in nodes}),
        *_differs(nodes, "firmware", {node.name: firmware_of(node, facts) for node in nodes}),
    ]
    resolved = _resolved(nodes, facts)
    for node in nodes:
        fabric = resolved.get(node.name)
        ports = _fabric_ports(node, facts, fabric) if fabric else []
        findings += [_slow(node, port) for port in ports if _below_link(port)]
    return findings


def firmware_of(node: Node, facts: Facts) -> str | None:
    found = sorted({port.firmware for port in facts.nodes[node.name].fabric.ports if port.firmware})
    return ", ".join(found) or None


def _differs(nodes: list[Node], what: str, values: dict[str, str | None]) -> list[Finding]:
    known = {name: value for name, value in values.items() if value is not None}
    if len(nodes) < 2 or len(set(known.values())) < 2:
        return []
    listed = ", ".join(f"{name} {value}" for name, value in known.items())
    fix = f"run the same {what} on every node (one that works everywhere): a mismatch is the first suspect of a fault"
    return [Finding(ALL_NODES, what, "WARN", f"{what} differs: {listed}", fix)]


def _below_link(port: RdmaPort) -> bool:
    return port.rate_gbps is not None and port.link_gbps is not None and port.rate_gbps < port.link_gbps


def _slow(node: Node, port: RdmaPort) -> Finding:
    message = (
        f"{port.hca}/{port.port} carries {port.rate_gbps:g} Gb/s over a link that negotiated {port.link_gbps:g} Gb/s"
    )
    fix = "update the NVIDIA driver and the CX-7 firmware together (driver 580.126 capped the port near 13 Gb/s)"
    return Finding(node.name, "port rate", "WARN", message, fix)
