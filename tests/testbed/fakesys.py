"""A Spark-shaped RDMA sysfs tree for each testbed node, which has no RDMA devices (and no Soft-RoCE).

One CX-7 QSFP port's two twins: `rocep1s0f1` -> `enp1s0f1np1` ACTIVE, its GID 3 the node's
fabric address IPv4-mapped (RoCE v2), and `roceP2p1s0f1` -> `enP2p1s0f1np1` DOWN, so fabric
detection selects exactly one HCA. The probe reads the tree through RECONCILER_SYSFS_ROOT and
`rdma -j link` output from rdma-link.json beside it, and combines both with the namespace's
real `ip -j addr`: the whole detection path runs, only the RDMA kernel objects are stand-ins.

Trees are {relative path: file content, or None for a directory}; unit tests write their
fixture trees with `write_tree` too.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

from tests.testbed.config import FAKE_SYSFS_DIR

RDMA_LINK_FILE = "rdma-link.json"
ACTIVE_HCA, ACTIVE_NETDEV = "rocep1s0f1", "enp1s0f1np1"
DOWN_HCA, DOWN_NETDEV = "roceP2p1s0f1", "enP2p1s0f1np1"
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
# The CX-7 firmware of a DGX Spark (what `fw_ver` reads).
FIRMWARE = "28.45.1020"

Tree = dict[str, str | None]


def mapped_gid(ip: str) -> str:
    """A RoCE v2 GID as sysfs prints it: the IPv4-mapped IPv6 address, eight 4-digit groups."""
    return ipaddress.IPv6Address(f"::ffff:{ip}").exploded


def device(hca: str, netdev: str, *, active: bool, gid: str = ZERO_GID, gid_index: int = 3) -> Tree:
    """One single-port RoCE device; an unused GID entry has no readable type (like the kernel's)."""
    port = f"class/infiniband/{hca}/ports/1"
    tree: Tree = {
        f"{port}/state": "4: ACTIVE\n" if active else "1: DOWN\n",
        f"{port}/phys_state": "5: LinkUp\n" if active else "3: Disabled\n",
        f"{port}/rate": "200 Gb/sec (2X NDR)\n" if active else "10 Gb/sec (4X SDR)\n",
        f"{port}/gids/{gid_index}": gid + "\n",
        f"class/infiniband/{hca}/fw_ver": FIRMWARE + "\n",
        f"class/infiniband/{hca}/device/net/{netdev}": None,
        f"class/net/{netdev}/speed": "200000\n" if active else "-1\n",
    }
    if gid != ZERO_GID:
        tree[f"{port}/gid_attrs/types/{gid_index}"] = "RoCE v2\n"
    return tree


def spark_tree(fabric_ip: str) -> Tree:
    return {
        **device(ACTIVE_HCA, ACTIVE_NETDEV, active=True, gid=mapped_gid(fabric_ip)),
        **device(DOWN_HCA, DOWN_NETDEV, active=False),
    }


def rdma_link_json() -> list[dict[str, object]]:
    """What `rdma -j link` prints for `spark_tree` (iproute2's keys)."""
    return [
        _rdma_link(0, ACTIVE_HCA, ACTIVE_NETDEV, "ACTIVE", "LINK_UP"),
        _rdma_link(1, DOWN_HCA, DOWN_NETDEV, "DOWN", "DISABLED"),
    ]


def _rdma_link(index: int, hca: str, netdev: str, state: str, physical: str) -> dict[str, object]:
    return {"ifindex": index, "ifname": hca, "port": 1, "state": state, "physical_state": physical, "netdev": netdev}


def write_tree(root: Path, tree: Tree) -> Path:
    for relative, content in tree.items():
        path = root / relative
        if content is None:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
    return root


def write_node_sysfs(node_dir: Path, fabric_ip: str) -> Path:
    """<node_dir>/fake-sys and <node_dir>/rdma-link.json; returns the value for RECONCILER_SYSFS_ROOT."""
    root = write_tree(node_dir / FAKE_SYSFS_DIR, spark_tree(fabric_ip))
    (node_dir / RDMA_LINK_FILE).write_text(json.dumps(rdma_link_json()) + "\n")
    return root
