"""Namespaces and links: the management switch, the fabric switch and each node's two ports.

Both switches are bridges in namespaces of their own (tb-mgmt, tb-fabric): a bridge in
the root netns would send bridged frames through the root FORWARD chain when
br_netfilter is loaded, where a host dockerd's DROP policy kills ssh. A fabric bridge rather than one veth
per node pair lets 2 and 3 nodes share one code path, and its per-node port f-<short>
is the "cable" a test can pull.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from tests.testbed import proc
from tests.testbed.config import (
    ALL_NETNS,
    FABRIC_IF,
    FABRIC_MTU,
    FABRIC_NETNS,
    HOST_IP,
    HOST_LINK,
    MGMT_IF,
    MGMT_NETNS,
    PREFIX,
    Node,
    TestbedError,
)

NO_IPV6 = ["net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]


def _ip_batch(netns: str | None, commands: list[str]) -> None:
    """Run many `ip` commands in one process (inside netns when given)."""
    prefix = ["ip", "-n", netns] if netns else ["ip"]
    proc.run([*prefix, "-batch", "-"], input_text="\n".join(commands) + "\n")


def _sysctl(netns: str | None, settings: list[str]) -> None:
    # nsenter --net only: `ip netns exec` would also remount /sys, which sysctl does not need.
    prefix = ["nsenter", f"--net=/run/netns/{netns}"] if netns else []
    proc.run([*prefix, "sysctl", "-qw", *settings])


def existing_netns() -> list[str]:
    names = {p.name for p in Path("/run/netns").glob("*")} if Path("/run/netns").is_dir() else set()
    return [n for n in ALL_NETNS if n in names]


def host_link_exists() -> bool:
    return Path(f"/sys/class/net/{HOST_LINK}").exists()


def setup(nodes: tuple[Node, ...]) -> None:
    """Create all namespaces, switches and links, addressed and up; wait until every node link is UP."""
    netns = [MGMT_NETNS, FABRIC_NETNS, *(n.name for n in nodes)]
    _ip_batch(None, [f"netns add {ns}" for ns in netns])
    for ns in netns:
        _sysctl(ns, NO_IPV6)
    _ip_batch(
        None,
        [
            f"link add {HOST_LINK} type veth peer name uplink netns {MGMT_NETNS}",
            f"addr add {HOST_IP}/{PREFIX} dev {HOST_LINK}",
        ],
    )
    # No forwarding and no IPv6 on the host side: nothing from a node can be routed beyond 198.19.0.1.
    _sysctl(None, [f"net.ipv4.conf.{HOST_LINK}.forwarding=0", f"net.ipv6.conf.{HOST_LINK}.disable_ipv6=1"])
    _ip_batch(None, [f"link set {HOST_LINK} up"])
    _ip_batch(MGMT_NETNS, _switch_commands(nodes, fabric=False))
    _ip_batch(FABRIC_NETNS, _switch_commands(nodes, fabric=True))
    for node in nodes:
        _ip_batch(node.name, _node_commands(node))
    for node in nodes:
        if not proc.wait_for(functools.partial(_links_up, node.name), 10.0):
            raise TestbedError(f"{node.name}: links not UP after 10 s: {_link_states(node.name)}")


def _switch_commands(nodes: tuple[Node, ...], *, fabric: bool) -> list[str]:
    """Bridge br0 with one veth port per node; the node end gets the Spark interface name."""
    cmds = ["link set lo up", "link add br0 type bridge"]
    if not fabric:
        cmds.append("link set uplink master br0 up")
    for node in nodes:
        if fabric:
            port = f"f-{node.short}"
            cmds.append(f"link add {port} mtu {FABRIC_MTU} type veth peer name {FABRIC_IF} netns {node.name}")
        else:
            port = f"p-{node.short}"
            cmds.append(f"link add {port} type veth peer name {MGMT_IF} netns {node.name}")
        cmds.append(f"link set {port} master br0 up")
    if fabric:
        cmds.append(f"link set br0 mtu {FABRIC_MTU}")
    cmds.append("link set br0 up")
    return cmds


def _node_commands(node: Node) -> list[str]:
    # No default route on purpose: anything not on a testbed subnet fails at once (pitfall 3).
    return [
        "link set lo up",
        f"addr add {node.mgmt_ip}/{PREFIX} dev {MGMT_IF}",
        f"addr add {node.fabric_ip}/{PREFIX} dev {FABRIC_IF}",
        f"link set {MGMT_IF} up",
        f"link set {FABRIC_IF} mtu {FABRIC_MTU} up",
    ]


def _link_states(netns: str) -> dict[str, str]:
    out = proc.run(["ip", "-n", netns, "-j", "link", "show"]).stdout
    return {link["ifname"]: link.get("operstate", "") for link in json.loads(out) if link["ifname"] != "lo"}


def _links_up(netns: str) -> bool:
    return all(state == "UP" for state in _link_states(netns).values())


def set_fabric_link(node: Node, up: bool) -> None:
    """Pull or plug one node's fabric cable: the switch-side port, so the node sees carrier loss."""
    _ip_batch(FABRIC_NETNS, [f"link set f-{node.short} {'up' if up else 'down'}"])


def set_fabric_mtu(node: Node, mtu: int = FABRIC_MTU) -> None:
    """The node's own side of the fabric link (what a reboot after a firmware update resets)."""
    proc.run(["ip", "-n", node.name, "link", "set", "dev", FABRIC_IF, "mtu", str(mtu)])


def clear_qdiscs(node: Node) -> None:
    """Drop any queueing discipline a test put on the node's links (a throttle), back to the default."""
    for ifname in (MGMT_IF, FABRIC_IF):
        proc.run(["tc", "-n", node.name, "qdisc", "del", "dev", ifname, "root"], check=False)


def cut_services(node: Node, cut: bool) -> None:
    """Take away (or give back) the node's route to the registry and the Hub stand-in on the
    host: a Spark without internet, still reachable by its peers over SSH and the fabric."""
    verb = "replace" if cut else "del"
    proc.run(["ip", "-n", node.name, "route", verb, "unreachable", f"{HOST_IP}/32"], check=cut)


def netns_pids(netns: str) -> list[int]:
    out = proc.run(["ip", "netns", "pids", netns], check=False).stdout
    return [int(p) for p in out.split()]


def delete_all() -> None:
    """Delete every testbed namespace (their veths go with them) and the host link."""
    for ns in existing_netns():
        proc.run(["ip", "netns", "del", ns], check=False)
    if host_link_exists():
        proc.run(["ip", "link", "del", HOST_LINK], check=False)
