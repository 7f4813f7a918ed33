"""End-to-end tests on the testbed: the reconciler runs on spark-head, as on a real pair.

The testbed (tests/testbed/) is brought up once for the whole session, with four nodes, and
torn down at its end (the teardown's leftover check fails the session if anything is left
behind). Each module starts from a reset testbed (`Testbed.reset`: nothing deployed, the Hub
stand-in as brought up), so modules run in any order; inside a module each test establishes
what it needs (`Bed.converged`, `Bed.fresh`), so tests run in any order too. A two-node spec
leaves the third and fourth nodes idle. Tests drive the real CLI inside the head node and observe nodes
directly.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.testbed import specfile
from tests.testbed.config import Layout
from tests.testbed.testbed import Testbed

ROOT = Path(__file__).resolve().parents[2]
RECONCILER = str(ROOT / ".venv/bin/reconciler")
TB_ROOT = Path(os.environ.get("TB_ROOT", "/tmp/testbed"))
STATE_DIR = "/srv/spark/state"  # every node's, as specs/testbed.yaml sets it


def testbed_available() -> bool:
    return os.geteuid() == 0 and shutil.which("dockerd") is not None and shutil.which("sshd") is not None


def write_spec(source: Path, target: Path, image: str, extra: str = "") -> Path:
    """The testbed spec with the freshly built engine image digest and $TB_ROOT's SSH key files."""
    return specfile.write(source, target, Layout(TB_ROOT), image, extra)


@dataclass
class Bed:
    testbed: Testbed
    spec: Path

    def reconciler(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        started = time.monotonic()
        result = self.testbed.exec(
            "spark-head", [RECONCILER, *args, "--spec", str(self.spec)], check=False, timeout=timeout
        )
        elapsed = time.monotonic() - started
        sys.stderr.write(f"\n$ reconciler {' '.join(args)}  ({elapsed:.1f} s, exit {result.returncode})\n")
        if check and result.returncode != 0:
            raise AssertionError(f"reconciler {args} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
        return result

    def plan_exit(self) -> int:
        return self.reconciler("plan", "--detailed-exitcode", check=False).returncode

    def converged(self, *, timeout: float = 600) -> None:
        """Serving and converged, whatever ran before: a stopped group (`reconciler stop`, or a
        guard trip) is started, since a held group plans empty; then an apply unless the plan
        already is."""
        listing = f"ls {STATE_DIR}/hold.json {STATE_DIR}/*.trip.json 2>/dev/null"
        if any(self.node(node, "sh", "-c", listing, check=False).stdout.strip() for node in self.testbed.node_names):
            self.reconciler("start", timeout=timeout)
        if self.plan_exit() != 0:
            self.reconciler("apply", "--yes", timeout=timeout)
            assert self.plan_exit() == 0

    def fresh(self) -> None:
        """Nothing deployed on any node (the testbed reset), the spec as the module left it."""
        self.testbed.reset()

    def node(self, node: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.testbed.exec(node, list(argv), check=check)

    def docker_json(self, node: str, *argv: str) -> object:
        return json.loads(self.node(node, "docker", *argv).stdout)

    def container_id(self, node: str, name: str) -> str:
        """The container's ID on the node, or "" when there is none."""
        return self.node(node, "docker", "inspect", "--format", "{{.Id}}", name, check=False).stdout.strip()

    def api_key(self) -> str:
        return self.node("spark-head", "cat", "/srv/spark/state/api_key").stdout.strip()


def wait_until(condition: Callable[[], bool], timeout: float, what: str, *, every: float = 1.0) -> float:
    """Seconds until `condition` held (checked every `every` s, printed with `what`); fails after `timeout`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if condition():
            elapsed = time.monotonic() - started
            print(f"{what}: {elapsed:.1f} s")
            return elapsed
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout} s")


def loop_status(bed: Bed) -> dict[str, Any]:
    """The loop's own status file: readable even while the spec file is invalid."""
    text = bed.node("spark-head", "cat", "/srv/spark/state/loop-status.json", check=False).stdout
    loaded: dict[str, Any] = json.loads(text) if text else {}
    return loaded


@contextlib.contextmanager
def running_loop(bed: Bed, *, stop_timeout_s: float = 30, log_tail: int = 3000) -> Iterator[Path]:
    """`reconciler run` inside the head for the duration; yields its log file, printed at the end.

    The loop gets a session of its own and SIGTERM goes to that whole group: nsenter, which puts
    it in the node, passes no signal on to its child, and a loop that outlived this block would
    go on repairing what the next test breaks on purpose."""
    argv = bed.testbed.exec_argv("spark-head", [RECONCILER, "run", "--spec", str(bed.spec)])
    log_path = bed.spec.parent / "loop.log"
    with log_path.open("w", encoding="utf-8") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield log_path
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=stop_timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            wait_until(lambda: not loop_processes(bed), stop_timeout_s, "the loop's processes gone", every=0.5)
    print(log_path.read_text(encoding="utf-8")[-log_tail:])


def loop_processes(bed: Bed) -> list[str]:
    """`reconciler run` processes in the head node (pgrep's own line left out)."""
    found = bed.node("spark-head", "pgrep", "-af", f"{RECONCILER} run", check=False).stdout
    return [line for line in found.splitlines() if "pgrep" not in line]


# Its key file paths are filled in by specfile.render, as every node's.
THIRD_NODE = """\
  - name: spark-third
    ssh:
      host: 198.18.10.12
      user: root
      identity_file: TESTBED-KEY
      known_hosts: TESTBED-KNOWN-HOSTS
      connect_timeout_s: 5
    model_dir: /srv/spark/models/DeepSeek-V4.1-Flash-Spark
    fabric: {ip: 198.18.10.12, ifname: enp1s0f1np1}

"""
FOURTH_NODE = THIRD_NODE.replace("spark-third", "spark-fourth").replace("198.18.10.12", "198.18.10.14")


@pytest.fixture(scope="session")
def shared_testbed() -> Iterator[Testbed]:
    """One bring-up for every module of the session; torn down (leftovers checked) at its end."""
    if not testbed_available():
        pytest.skip("the testbed needs root, dockerd and sshd (run ./make.sh test as root)")
    testbed = Testbed(TB_ROOT)
    started = time.monotonic()
    try:
        testbed.up(nodes=4)
    except BaseException:
        testbed.down()
        raise
    sys.stderr.write(f"\ntestbed up (4 nodes) in {time.monotonic() - started:.1f} s\n")
    yield testbed
    testbed.down()


# The engine stand-in shuts down as slowly as vLLM (ENGINE_SHUTDOWN_S 11, past Docker's 10 s
# default grace) in the spec a user's demo runs; test_converge.py keeps that and proves the
# ranks' grace outlasts it. Elsewhere a second will do: every group restart waits for two.
SLOW_SHUTDOWN = 'ENGINE_SHUTDOWN_S: "11"'
QUICK_SHUTDOWN = 'ENGINE_SHUTDOWN_S: "1"'


def reset_bed(testbed: Testbed, directory: Path, nodes: int, *, slow_shutdown: bool = False) -> Bed:
    """The testbed reset to nothing deployed, and a fresh copy of the testbed spec for `nodes` nodes."""
    testbed.reset()
    image = testbed.images()["engine"]
    spec = write_spec(ROOT / "specs/testbed.yaml", directory / "testbed.yaml", image)
    text = spec.read_text(encoding="utf-8")
    assert SLOW_SHUTDOWN in text, "specs/testbed.yaml: the engine stand-in's shutdown time moved"
    if not slow_shutdown:
        spec.write_text(text.replace(SLOW_SHUTDOWN, QUICK_SHUTDOWN), encoding="utf-8")
    if nodes > 2:
        added = "".join([THIRD_NODE, FOURTH_NODE][: nodes - 2])
        text = spec.read_text(encoding="utf-8").replace("\nmodel:\n", "\n" + added + "model:\n", 1)
        spec.write_text(specfile.render(text, testbed.layout, image), encoding="utf-8")
    return Bed(testbed, spec)


@pytest.fixture(scope="module")
def bed(shared_testbed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Bed:
    return reset_bed(shared_testbed, tmp_path_factory.mktemp("spec"), nodes=2)


@pytest.fixture
def converged(bed: Bed) -> Bed:
    """The module's deployment, converged (applied only when its plan is not empty)."""
    bed.converged()
    return bed


@pytest.fixture(scope="module")
def bed4(shared_testbed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Bed:
    return reset_bed(shared_testbed, tmp_path_factory.mktemp("spec4"), nodes=4)


def events(bed: Bed, node: str, since: float) -> list[tuple[float, str, str]]:
    """(time, action, container) of our containers' lifecycle events on a node since `since`."""
    argv = ["docker", "events", "--since", f"{since:.3f}", "--until", f"{time.time():.3f}", "--format", "{{json .}}"]
    argv += ["--filter", "type=container", "--filter", "label=io.spark-reconciler.owner=spark-reconciler"]
    found = []
    for line in bed.node(node, *argv).stdout.splitlines():
        event = json.loads(line)
        found.append((event["timeNano"] / 1e9, event["Action"], event["Actor"]["Attributes"]["name"]))
    return found


def first(found: list[tuple[float, str, str]], action: str, name: str) -> float:
    return min(at for at, kind, who in found if kind == action and who == name)


def exit_codes(bed: Bed, node: str, since: float) -> list[int]:
    """The exit codes of our rank containers' `die` events on a node since `since`, in order."""
    argv = ["docker", "events", "--since", f"{since:.3f}", "--until", f"{time.time():.3f}", "--format", "{{json .}}"]
    argv += ["--filter", "type=container", "--filter", "event=die"]
    argv += ["--filter", "label=io.spark-reconciler.owner=spark-reconciler"]
    codes = []
    for line in bed.node(node, *argv).stdout.splitlines():
        attributes = json.loads(line)["Actor"]["Attributes"]
        if attributes.get("name", "").startswith("dsv41-r"):
            codes.append(int(attributes.get("exitCode", -1)))
    return codes
