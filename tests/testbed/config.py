"""Fixed names, addresses and file layout of the testbed.

There is one testbed per machine: namespace, link and cgroup names are fixed. Every address
lies in 198.18.0.0/15, the range reserved for benchmarking (see docs/sources.md), so testbed
traffic can never be mistaken for, or leak to, a real network.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MGMT_NETNS = "tb-mgmt"
FABRIC_NETNS = "tb-fabric"
HOST_LINK = "tb-mgmt0"
HOST_IP = "198.19.0.1"
PREFIX = 24
REGISTRY = f"{HOST_IP}:5000"
HUB_PORT = 5080
MGMT_IF = "enP7s7"
FABRIC_IF = "enp1s0f1np1"
FABRIC_MTU = 9000
SHM_SIZE = "2g"
# Each node's Spark-shaped RDMA sysfs tree (tests/testbed/fakesys.py), named by RECONCILER_SYSFS_ROOT.
FAKE_SYSFS_DIR = "fake-sys"
SRV_SPARK = Path("/srv/spark")
# Hidden per node by a private tmpfs, so a host containerd can never be picked up by a node's dockerd.
CONTAINERD_RUN = Path("/run/containerd")
REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Node:
    """One simulated Spark: its netns/hostname and its addresses."""

    name: str
    short: str  # suffix of its bridge ports (p-<short> on mgmt, f-<short> on the fabric)
    mgmt_ip: str
    fabric_ip: str
    bip: str
    pool: str

    @property
    def cgroup_parent(self) -> str:
        return f"testbed-{self.name}"


ALL_NODES = (
    Node("spark-head", "head", "198.19.0.13", "198.18.10.13", "198.18.21.1/24", "198.18.128.0/20"),
    Node("spark-worker", "worker", "198.19.0.11", "198.18.10.11", "198.18.22.1/24", "198.18.144.0/20"),
    Node("spark-third", "third", "198.19.0.12", "198.18.10.12", "198.18.23.1/24", "198.18.160.0/20"),
    Node("spark-fourth", "fourth", "198.19.0.14", "198.18.10.14", "198.18.24.1/24", "198.18.176.0/20"),
)
ALL_NETNS = (MGMT_NETNS, FABRIC_NETNS, *(n.name for n in ALL_NODES))


class TestbedError(RuntimeError):
    """A testbed step failed; the message says which and why."""


def nodes_for(count: int) -> tuple[Node, ...]:
    if count not in (2, 3, 4):
        raise TestbedError(f"--nodes must be 2, 3 or 4, not {count}")
    return ALL_NODES[:count]


def node_named(name: str) -> Node:
    """Accept the full name (spark-worker) or the short one (worker)."""
    for node in ALL_NODES:
        if name in (node.name, node.short):
            return node
    raise TestbedError(f"unknown node {name!r}; expected one of {', '.join(n.name for n in ALL_NODES)}")


def default_root() -> Path:
    return Path(os.environ.get("TB_ROOT", "/tmp/testbed"))


@dataclass(frozen=True)
class Layout:
    """Where everything lives under $TB_ROOT. Caches and keys survive `down`; node state does not."""

    root: Path

    def __post_init__(self) -> None:
        # Teardown deletes inside root, so refuse anything that is not a dedicated absolute directory.
        if not self.root.is_absolute() or len(self.root.parts) < 3:
            raise TestbedError(f"TB_ROOT must be an absolute path at least two levels deep, not {self.root}")

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def keys(self) -> Path:
        return self.root / "keys"

    @property
    def client_key(self) -> Path:
        return self.keys / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.keys / "known_hosts"

    def host_key(self, node: Node) -> Path:
        return self.keys / f"ssh_host_{node.name}_ed25519"

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def hub(self) -> Path:
        """The Hub stand-in's build of commit A (`main` at start): `standin-index.json` and `repo/`."""
        return self.root / "hub"

    @property
    def hub_revision(self) -> Path:
        """The build of commit B, the revision after A (its unchanged files are hardlinks into A's build)."""
        return self.hub / "revision-B"

    @property
    def hub_commits_json(self) -> Path:
        """`{"repo_id", "commits": {"A": sha, "B": sha}, "differs": [repo paths]}`, written by the hub build."""
        return self.hub / "commits.json"

    @property
    def registry(self) -> Path:
        return self.root / "registry"

    @property
    def images_json(self) -> Path:
        return self.root / "images.json"

    @property
    def state_json(self) -> Path:
        return self.root / "state.json"

    @property
    def specs(self) -> Path:
        """Specs rendered for this testbed (tests/testbed/specfile.py), e.g. the one `make demo` converges."""
        return self.root / "specs"

    def node_dir(self, node: Node) -> Path:
        return self.root / node.name

    def home(self, node: Node) -> Path:
        return self.node_dir(node) / "home"

    def docker_sock(self, node: Node) -> Path:
        return self.node_dir(node) / "docker.sock"

    def sysfs_root(self, node: Node) -> Path:
        return self.node_dir(node) / FAKE_SYSFS_DIR

    def init_pid(self, node: Node) -> Path:
        return self.node_dir(node) / "init.pid"

    def sshd_config(self, node: Node) -> Path:
        return self.node_dir(node) / "ssh" / "sshd_config"

    def hub_log(self, port: int) -> Path:
        return self.root / ("hub.log" if port == HUB_PORT else f"hub-{port}.log")

    def state_paths(self) -> list[Path]:
        """Everything `down` deletes (caches, keys and the hub build are kept)."""
        fixed = [self.bin, self.registry, self.images_json, self.state_json, self.specs, *self.root.glob("hub*.log")]
        return fixed + [self.node_dir(n) for n in ALL_NODES]

    def cache_paths(self) -> list[Path]:
        """What `down --purge` deletes on top of the state."""
        return [self.cache, self.keys, self.hub]
