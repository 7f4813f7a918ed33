"""Ordered teardown (containers and dockerd, sshd and registry, node inits, leftovers, then
network and files) and the leftover check.

Processes are found from the process table (their argv names paths under $TB_ROOT), not
only from PID files, so a crashed or half-finished run is cleaned up just the same. The
order matters: deleting a netns that still has processes leaves them running unnamed
(pitfall 9), and dockerd must go before the node's PID namespace so containers are
removed cleanly (pitfall 10).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.testbed import network, proc, services
from tests.testbed.config import ALL_NETNS, ALL_NODES, CONTAINERD_RUN, HOST_LINK, SRV_SPARK, Layout, Node
from tests.testbed.web import docker_json

CGROUP_ROOT = Path("/sys/fs/cgroup")
DOCKERD_GRACE = 20.0
SERVICE_GRACE = 5.0
# Things the testbed starts; only these are killed when found outside a node namespace.
OUR_COMMANDS = {"dockerd", "containerd", "containerd-shim", "containerd-shim-runc-v2", "sshd", "docker-registry"}
OUR_COMMANDS |= {"unshare", "nsenter", "tini"}


def teardown(layout: Layout, *, purge: bool = False) -> list[str]:
    """Stop and delete everything the testbed created; return the leftovers (empty when clean)."""
    with ThreadPoolExecutor(max_workers=len(ALL_NODES)) as pool:
        list(pool.map(lambda n: _stop_dockerd(layout, n), ALL_NODES))
    _stop_services(layout)
    _kill_inits(layout)
    _stop_stragglers(layout)
    _unmount_under([layout.root, SRV_SPARK])
    network.delete_all()
    for node in ALL_NODES:
        _remove_cgroups(node.cgroup_parent)
    _delete_files(layout, purge=purge)
    return leftovers(layout)


def _marked(info: proc.ProcInfo, marker: str) -> bool:
    return any(marker in arg for arg in info.argv)


def _stop_dockerd(layout: Layout, node: Node) -> None:
    """Remove every container, SIGTERM dockerd (SIGKILL after 20 s), remove its socket and cgroups."""
    sock = str(layout.docker_sock(node))
    pids = [p.pid for p in proc.processes() if p.comm == "dockerd" and _marked(p, sock)]
    if pids and os.path.exists(sock):
        remove_containers(sock)
    proc.stop(pids, DOCKERD_GRACE)
    with contextlib.suppress(OSError):
        os.unlink(sock)
    _remove_cgroups(node.cgroup_parent)


def remove_containers(sock: str) -> None:
    # Best effort: a daemon that no longer answers is simply killed.
    with contextlib.suppress(OSError, ValueError):
        for container in docker_json(sock, "GET", "/containers/json?all=1"):
            docker_json(sock, "DELETE", f"/containers/{container['Id']}?force=1&v=1", timeout=30.0)


def _stop_services(layout: Layout) -> None:
    """sshd of every node, the registry and the hub, all at once."""
    proc.stop([p.pid for p in proc.processes() if _is_service(layout, p)], SERVICE_GRACE)


def _is_service(layout: Layout, info: proc.ProcInfo) -> bool:
    if info.comm == "sshd":
        return any(_marked(info, str(layout.sshd_config(n))) for n in ALL_NODES)
    if info.comm == "docker-registry":
        return _marked(info, str(layout.registry / "config.yml"))
    return services.is_hub_process(info.argv) and _marked(info, str(layout.hub))


def _kill_inits(layout: Layout) -> None:
    """SIGKILL each node's tini: the kernel then kills its whole PID namespace."""
    tinis = set()
    for node in ALL_NODES:
        with contextlib.suppress(OSError, ValueError):
            tinis.add(int(layout.init_pid(node).read_text()))
    # Also inits whose init.pid is gone: the children of our `unshare` processes.
    marker = f"{layout.root}/"
    for info in proc.processes():
        if info.comm == "unshare" and _marked(info, marker):
            tinis.update(proc.children(info.pid))
    proc.kill_now([p for p in tinis if proc.comm_of(p) == "tini"])


def _stop_stragglers(layout: Layout) -> None:
    """Anything still in a testbed netns, and our own daemons that escaped one (e.g. a netns deleted by hand)."""
    pids = {pid for ns in network.existing_netns() for pid in network.netns_pids(ns)}
    marker = f"{layout.root}/"
    for info in proc.processes():
        ours = info.comm in OUR_COMMANDS or services.is_hub_process(info.argv)
        if ours and _marked(info, marker):
            pids.add(info.pid)
    proc.stop(sorted(pids - _ancestors()), SERVICE_GRACE)


def _ancestors() -> set[int]:
    """This process and its parents: never targets, even if their argv names $TB_ROOT."""
    found, pid = set(), os.getpid()
    while pid > 1:
        found.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat[stat.rindex(")") + 2 :].split()[1])
    return found


def _mounts_under(roots: list[Path]) -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == str(r) or point.startswith(f"{r}/") for r in roots):
            points.append(point)
    return points


def _unmount_under(roots: list[Path]) -> None:
    # Only a crashed run leaves any: node mounts live in the node mount namespaces.
    for point in sorted(_mounts_under(roots), key=len, reverse=True):
        proc.run(["umount", "-l", point], check=False)


def _cgroups(prefix: str) -> list[Path]:
    found = [p for p in CGROUP_ROOT.glob(f"*/{prefix}") if p.is_dir()]
    return found + [p for p in CGROUP_ROOT.glob(prefix) if p.is_dir()]


def _remove_cgroups(prefix: str) -> None:
    """rmdir depth-first (cgroup dirs cannot be removed with their files)."""
    for top in _cgroups(prefix):
        for dirpath, _, _ in os.walk(top, topdown=False):  # children before parents
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)


def _delete_files(layout: Layout, *, purge: bool) -> None:
    paths = layout.state_paths() + (layout.cache_paths() if purge else [])
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    for empty in [SRV_SPARK, CONTAINERD_RUN] + ([layout.root] if purge else []):
        with contextlib.suppress(OSError):
            empty.rmdir()


def _of_the_testbed(layout: Layout, info: proc.ProcInfo) -> bool:
    """Whether a process names the testbed's files; one that names only its caches (building the
    real-engine lane's venv or image layers beside a running suite) is not the testbed's."""
    named = [arg for arg in info.argv if f"{layout.root}/" in arg]
    return any(f"{layout.cache}/" not in arg for arg in named)


def leftovers(layout: Layout) -> list[str]:
    """Everything of the testbed still present; empty when the machine is clean."""
    found = [f"netns {ns}" for ns in network.existing_netns() if ns in ALL_NETNS]
    if network.host_link_exists():
        found.append(f"link {HOST_LINK}")
    mine = _ancestors()
    found += [
        f"process {p.pid} {' '.join(p.argv)[:160]}"
        for p in proc.processes()
        if _of_the_testbed(layout, p) and p.pid not in mine
    ]
    found += [f"mount {m}" for m in _mounts_under([layout.root, SRV_SPARK])]
    found += [f"cgroup {c}" for c in _cgroups("testbed-*")]
    return found
