"""Python API of the testbed: `Testbed(root).up(nodes=2)`, `.exec(...)`, `.link(...)`, `.down()`.

Bring-up runs network, node inits, sshd, dockerd, registry, images, with the independent waits overlapped: the
dockerds boot while the registry starts and the images are built and pushed, and the
pulls run on all nodes in parallel. `up` always starts with the full teardown, so it is
idempotent and recovers from a crashed run.

The Hub stand-in on :5080 serves two commits of the checkpoint, A (`main`) and B (one shard and
`config.json` changed); `services.hub_commits(testbed.layout)` gives (A, B), `$TB_ROOT/hub/commits.json`
the same for shell use, and `StandinControl("http://198.19.0.1:5080").move_branch("main", B)` moves
`main` (see tests/testbed/services.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.testbed import images as img
from tests.testbed import network, proc, services, teardown
from tests.testbed import nodes as node_ops
from tests.testbed.config import (
    CONTAINERD_RUN,
    SRV_SPARK,
    Layout,
    Node,
    TestbedError,
    default_root,
    node_named,
    nodes_for,
)

REQUIRED = ["ip", "nsenter", "unshare", "setsid", "tini", "dockerd", "containerd", "runc", "iptables"]
REQUIRED += [
    "docker-registry",
    "ssh",
    "ssh-keygen",
    "bash",
    "ldd",
    "/usr/sbin/sshd",
    "/usr/bin/python3.11",
    "/bin/busybox",
]


def _parallel(fn: Callable[[Node], None], targets: tuple[Node, ...]) -> None:
    with ThreadPoolExecutor(max_workers=len(targets)) as pool:
        for future in [pool.submit(fn, n) for n in targets]:
            future.result()


class Testbed:
    """One testbed per machine; `root` is $TB_ROOT (default: env TB_ROOT or /tmp/testbed)."""

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, root: Path | str | None = None) -> None:
        self.layout = Layout(Path(root) if root is not None else default_root())

    # ------------------------------------------------------------ state

    @property
    def node_names(self) -> list[str]:
        """Nodes of the current (or last) bring-up, head first; empty before any `up`."""
        try:
            return list(json.loads(self.layout.state_json.read_text())["nodes"])
        except (OSError, ValueError, KeyError):
            return []

    def _nodes(self) -> tuple[Node, ...]:
        return tuple(node_named(n) for n in self.node_names)

    def images(self) -> dict[str, str]:
        """{"pybase": "<registry>/tb/pybase@sha256:…", "engine": "…"} as pulled on the nodes."""
        try:
            return dict(json.loads(self.layout.images_json.read_text()))
        except OSError:
            raise TestbedError(f"no {self.layout.images_json}: run `python3 -m tests.testbed up`") from None

    def docker_host(self, node: str) -> str:
        return f"unix://{self.layout.docker_sock(node_named(node))}"

    # ------------------------------------------------------------ bring-up / teardown

    def up(self, nodes: int = 2) -> float:
        """Full teardown, then bring up `nodes` nodes; prints each step's wall time; returns the total."""
        _check_prerequisites()
        targets = nodes_for(nodes)
        steps = proc.Steps(f"testbed up ({nodes} nodes, TB_ROOT={self.layout.root})")
        with steps.step("teardown of any previous run"):
            self._teardown_or_raise()
        with steps.step("keys, config files"):
            self._write_files(targets)
        with steps.step("network"):
            network.setup(targets)
        with steps.step("node inits"):
            _parallel(lambda n: node_ops.start_init(self.layout, n), targets)
        with steps.step("sshd"):
            _parallel(self._start_sshd, targets)
        with steps.step("dockerd (started)"):
            _parallel(lambda n: node_ops.start_dockerd(self.layout, n), targets)
        with steps.step("registry"):
            services.start_registry(self.layout)
        with steps.step("hub"):
            self._start_hub()
        with steps.step("images: build"):
            built = img.build(self.layout.cache)
        with steps.step("images: push"):
            self._push(built, base_too=True)
        with steps.step("dockerd (ready)"):
            _parallel(lambda n: node_ops.wait_dockerd(self.layout, n), targets)
        with steps.step("images: pull by digest, all nodes"):
            self._pull(built, targets, base_too=True)
        self._write_images(built.refs())
        for name, ref in built.refs().items():
            print(f"  image {name}: {ref}")
        return steps.total()

    def down(self, *, purge: bool = False) -> float:
        """Ordered teardown then leftover check; raises TestbedError listing any leftovers."""
        steps = proc.Steps("testbed down")
        with steps.step("teardown" + (" (purge caches)" if purge else "")):
            self._teardown_or_raise(purge=purge)
        return steps.total()

    def reset(self) -> float:
        """Back to the state `up` leaves, without a new bring-up: what a deployment and its tests
        left on the nodes is removed (containers, processes started over SSH or node-exec, the
        data under /srv/spark and /dev/shm, the homes), links are plugged and unthrottled, each dockerd runs,
        the images are there again, and the Hub stand-in restarts with its default commits.

        Several test modules share one bring-up this way; the namespaces, sshd host keys,
        dockerds and the registry stay as they are, so a reset takes seconds, not a minute."""
        targets = self._nodes()
        if not targets:
            raise TestbedError("testbed is not up")
        steps = proc.Steps("testbed reset")
        with steps.step("processes stopped"):
            # On every node before anything is removed: a loop still running would take a rank's
            # removal for a failure and start repairing on nodes half wiped.
            _parallel(lambda n: node_ops.stop_deployment_processes(self.layout, n), targets)
        with steps.step("hub restarted"):
            self._restart_hub()
        with steps.step("nodes wiped"):
            _parallel(self._wipe_node, targets)
        with steps.step("images present"):
            self._pull_missing(targets)
        return steps.total()

    def _restart_hub(self) -> None:
        for port in services.hub_ports(self.layout):
            services.stop_hub(self.layout, port)
        self._start_hub()

    def _wipe_node(self, node: Node) -> None:
        network.set_fabric_link(node, True)
        network.set_fabric_mtu(node)
        network.clear_qdiscs(node)
        network.cut_services(node, False)
        self._unfake_kernel(node)
        if not node_ops.dockerd_ready(self.layout, node):
            node_ops.start_dockerd(self.layout, node)
            node_ops.wait_dockerd(self.layout, node)
        teardown.remove_containers(str(self.layout.docker_sock(node)))
        self.exec(node.name, ["find", "/dev/shm", "-mindepth", "1", "-delete"])
        data = self.layout.node_dir(node) / "data"
        for entry in data.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        shutil.rmtree(self.layout.home(node), ignore_errors=True)
        node_ops.write_node_files(self.layout, node, self._nodes())

    def _pull_missing(self, targets: tuple[Node, ...]) -> None:
        refs = self.images()
        for node in targets:
            sock = str(self.layout.docker_sock(node))
            for name, ref in refs.items():
                if not img.present(sock, ref):
                    img.pull_ref(sock, ref, f"tb/{name}:latest")

    def _teardown_or_raise(self, *, purge: bool = False) -> None:
        left = teardown.teardown(self.layout, purge=purge)
        if left:
            raise TestbedError("testbed leftovers:\n  " + "\n  ".join(left))

    def _write_files(self, targets: tuple[Node, ...]) -> None:
        self.layout.root.mkdir(parents=True, exist_ok=True)
        self.layout.state_json.write_text(json.dumps({"nodes": [n.name for n in targets]}) + "\n")
        node_ops.ensure_keys(self.layout)
        node_ops.write_bin(self.layout)
        for path in (SRV_SPARK, CONTAINERD_RUN, Path("/run/sshd")):
            path.mkdir(parents=True, exist_ok=True)  # empty mount points / sshd's privsep dir
        for node in targets:
            node_ops.write_node_files(self.layout, node, targets)

    def _start_sshd(self, node: Node) -> None:
        node_ops.start_sshd(self.layout, node)
        node_ops.wait_sshd(self.layout, node)

    def _start_hub(self) -> None:
        if not services.hub_available():
            print("  note: tests/testbed/hub/__main__.py not found; hub stand-in skipped")
            return
        if services.build_hub(self.layout):
            print(f"  hub checkpoint built: commit A into {self.layout.hub}, B into {self.layout.hub_revision}")
        services.start_hub(self.layout)
        a, b = services.hub_commits(self.layout)
        print(f"  hub serves commits A={a} (main) and B={b}")

    # ------------------------------------------------------------ images

    def _push(self, built: img.Images, *, base_too: bool) -> None:
        registry = img.Registry()
        if base_too:
            registry.push(built.pybase)
        registry.push(built.engine, mount_from=built.pybase.repo)
        registry.push(built.front, mount_from=built.pybase.repo)

    def _pull(self, built: img.Images, targets: tuple[Node, ...], *, base_too: bool) -> None:
        pulls = [(built.engine, "tb/engine:latest"), (built.front, "tb/front:latest")]
        if base_too:
            pulls.append((built.pybase, "tb/pybase:latest"))
        img.pull_everywhere([str(self.layout.docker_sock(n)) for n in targets], pulls)

    def _write_images(self, refs: dict[str, str]) -> None:
        self.layout.images_json.write_text(json.dumps(refs, indent=2) + "\n")

    def push_engine_variant(self, note: str) -> str:
        """Push (not pull) the engine image plus one small layer of its own (`note` in
        /etc/variant): an image change that shares every other layer. Returns its ref."""
        built = img.build(self.layout.cache)
        extra = img.write_layer(
            [img.Entry("etc", "dir", 0o755), img.Entry("etc/variant", "file", 0o644, data=note.encode())],
            self.layout.cache / "variants" / f"{hashlib.sha256(note.encode()).hexdigest()[:16]}.tar.gz",
        )
        variant = img.Image(built.engine.repo, (*built.engine.layers, extra))
        img.Registry().push(variant, mount_from=built.pybase.repo)
        return variant.ref

    def rebuild_engine(self) -> str:
        """Push a new engine image from the current engine code, pull it on every node; return its ref."""
        targets = self._nodes()
        if not targets:
            raise TestbedError("testbed is not up")
        steps = proc.Steps("rebuild engine")
        with steps.step("images: build"):
            built = img.build(self.layout.cache)
        with steps.step("images: push engine"):
            self._push(built, base_too=not img.Registry().has_blob(built.pybase.repo, built.pybase.layers[0].digest))
        with steps.step("images: pull engine, all nodes"):
            self._pull(built, targets, base_too=False)
        self._write_images({**self.images(), "engine": built.engine.ref})
        print(f"  image engine: {built.engine.ref}")
        steps.total()
        return built.engine.ref

    # ------------------------------------------------------------ running things on nodes

    def exec_argv(
        self, node: str, argv: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None
    ) -> list[str]:
        """Prefix argv so it runs inside the node (for Popen); HOME, DOCKER_HOST and PATH are the node's."""
        return node_ops.exec_argv(self.layout, node_named(node), argv, env=env, cwd=cwd)

    def exec(
        self,
        node: str,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        check: bool = True,
        timeout: float = 120.0,
        cwd: str | None = None,
        input_text: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run argv inside the node, capturing text output; on timeout the whole command is killed."""
        full = self.exec_argv(node, argv, env=env, cwd=cwd)
        with subprocess.Popen(
            full,
            stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # so a timeout can kill nsenter's child inside the node too
        ) as child:
            try:
                out, err = child.communicate(input_text, timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.communicate()
                raise
        result = subprocess.CompletedProcess(argv, child.returncode, out, err)
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(result.returncode, argv, out, err)
        return result

    def restart_dockerd(self, node: str) -> None:
        """Stop one node's dockerd (SIGTERM, as `systemctl restart docker` does) and start it again."""
        target = node_named(node)
        if target.name not in self.node_names:
            raise TestbedError(f"{target.name} is not part of the running testbed")
        pid_file = self.layout.node_dir(target) / "docker.pid"
        stop = f"kill $(cat {pid_file}); while kill -0 $(cat {pid_file} 2>/dev/null) 2>/dev/null; do sleep 0.2; done"
        self.exec(target.name, ["sh", "-c", stop], timeout=60)
        node_ops.start_dockerd(self.layout, target)
        node_ops.wait_dockerd(self.layout, target)

    def reboot(self, node: str) -> None:
        """A node's power cycle, as far as a namespace can have one: every process in it dies at
        once (its init's PID namespace goes, with sshd, dockerd and the containers), then init
        (with a new boot id), sshd and dockerd start again. Disks stay: data, homes, Docker's
        data root, so Docker finds its containers exited, as after a real reboot."""
        target = node_named(node)
        if target.name not in self.node_names:
            raise TestbedError(f"{target.name} is not part of the running testbed")
        init = node_ops.init_pid(self.layout, target)
        sock = str(self.layout.docker_sock(target))
        dockerd = [p.pid for p in proc.processes() if p.comm == "dockerd" and any(sock in arg for arg in p.argv)]
        proc.kill_now([init])
        if not proc.wait_for(lambda: not any(proc.alive(pid) for pid in [init, *dockerd]), 30.0):
            raise TestbedError(f"{target.name}: processes outlived their init")
        node_ops.start_init(self.layout, target)
        self._start_sshd(target)
        # A real boot empties /run, where dockerd keeps its pid file; this one survives, and its
        # pid now belongs to another process of the new namespace, so dockerd would refuse to start.
        (self.layout.node_dir(target) / "docker.pid").unlink(missing_ok=True)
        node_ops.start_dockerd(self.layout, target)
        node_ops.wait_dockerd(self.layout, target)

    def fabric_mtu(self, node: str, mtu: int) -> None:
        """Set one node's fabric MTU (reset() sets it back)."""
        target = node_named(node)
        if target.name not in self.node_names:
            raise TestbedError(f"{target.name} is not part of the running testbed")
        network.set_fabric_mtu(target, mtu)

    def fake_kernel(self, node: str, release: str | None) -> None:
        """Make one node report another kernel release (/proc/sys/kernel/osrelease, what `uname -r`
        reads); None: its real one again (reset() does that too)."""
        target = node_named(node)
        if target.name not in self.node_names:
            raise TestbedError(f"{target.name} is not part of the running testbed")
        self._unfake_kernel(target)
        if release is not None:
            faked = self.layout.node_dir(target) / "osrelease"
            faked.write_text(f"{release}\n")
            self.exec(target.name, ["mount", "--bind", str(faked), OSRELEASE])

    def _unfake_kernel(self, node: Node) -> None:
        while self.exec(node.name, ["umount", OSRELEASE], check=False).returncode == 0:
            pass  # one bind over another: take them all off

    def link(self, node: str, up: bool) -> None:
        """Plug (up=True) or pull (up=False) one node's fabric cable."""
        target = node_named(node)
        if target.name not in self.node_names:
            raise TestbedError(f"{target.name} is not part of the running testbed")
        network.set_fabric_link(target, up)


OSRELEASE = "/proc/sys/kernel/osrelease"


def _check_prerequisites() -> None:
    if os.geteuid() != 0:
        raise TestbedError("the testbed needs root (namespaces, mounts, dockerd)")
    missing = [c for c in REQUIRED if shutil.which(c) is None]
    if missing:
        raise TestbedError(f"missing commands: {' '.join(missing)}; run `python3 -m tests.testbed install`")
    shadow = Path("/etc/shadow").read_text().splitlines()
    root_pw = next((line.split(":")[1] for line in shadow if line.startswith("root:")), "")
    if root_pw.startswith("!"):
        # With UsePAM no, sshd refuses every login to a locked account, keys included.
        print(
            "  warning: root's password is locked ('!'): sshd refuses root key logins; `usermod -p '*' root` fixes it"
        )
