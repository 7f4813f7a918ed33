"""A worker's copy killed midway, on the testbed: the next apply stops the daemon the killed one
left, sends only what the worker does not hold yet, and the worker's files verify.

The fabric port of the head is throttled (a token bucket on its egress) so the ~29 MB copy
takes about a minute and can be caught in the middle; the head's download from the Hub
stand-in does not cross the fabric and stays fast. The apply is killed as systemd kills a
service's cgroup: every process of it at once, with SIGKILL, its rsync streams included.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import RECONCILER, Bed

pytestmark = pytest.mark.testbed

HEAD, WORKER = "spark-head", "spark-worker"
MODELS = "/srv/spark/models"
MODEL = f"{MODELS}/DeepSeek-V4.1-Flash-Spark"
FABRIC_PORT = "enp1s0f1np1"
RATE = "3mbit"  # ~370 kB/s: the copy lasts over a minute
HELD_BEFORE_KILL = 6_000_000
COPY_TIMEOUT_S = 240


def fabric_tx_bytes(bed: Bed, node: str) -> int:
    links = json.loads(bed.node(node, "ip", "-s", "-j", "link", "show", FABRIC_PORT).stdout)
    return int(links[0]["stats64"]["tx"]["bytes"])


def worker_bytes(bed: Bed) -> int:
    """Bytes under the worker's models directory, hardlinks once (a partial file counts)."""
    return int(bed.node(WORKER, "du", "-sb", MODELS).stdout.split()[0])


def copy_daemons(bed: Bed) -> list[str]:
    found = bed.node(WORKER, "pgrep", "-af", "rsync --daemon", check=False).stdout
    return [line for line in found.splitlines() if "pgrep" not in line]


@pytest.fixture
def throttled(bed: Bed) -> Iterator[None]:
    """Nothing deployed yet (the copy must be the first), and the head's fabric port throttled."""
    bed.fresh()
    bucket = ["tbf", "rate", RATE, "burst", "16kb", "latency", "5s"]
    bed.node(HEAD, "tc", "qdisc", "replace", "dev", FABRIC_PORT, "root", *bucket)
    try:
        yield
    finally:
        bed.node(HEAD, "tc", "qdisc", "del", "dev", FABRIC_PORT, "root", check=False)


def kill_as_systemd_does(bed: Bed, process: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the apply and to every process it started on the head (its cgroup's end)."""
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    bed.node(HEAD, "pkill", "-KILL", "-f", "^rsync .*--info=progress2", check=False)


def apply_until_the_worker_holds(bed: Bed, held: int, log: Path) -> subprocess.Popen[bytes]:
    argv = bed.testbed.exec_argv(HEAD, [RECONCILER, "apply", "--yes", "--spec", str(bed.spec)])
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + COPY_TIMEOUT_S
    while time.monotonic() < deadline and process.poll() is None:
        if copy_daemons(bed) and worker_bytes(bed) >= held:
            return process
        time.sleep(0.5)
    os.killpg(process.pid, signal.SIGKILL)
    raise AssertionError(f"the copy never reached {held} bytes on the worker\n{log.read_text()[-3000:]}")


@pytest.mark.usefixtures("throttled")
def test_a_copy_killed_midway_resumes_without_resending_what_the_worker_holds(bed: Bed, tmp_path: Path) -> None:
    process = apply_until_the_worker_holds(bed, HELD_BEFORE_KILL, tmp_path / "apply.log")
    kill_as_systemd_does(bed, process)
    held = worker_bytes(bed)
    left = copy_daemons(bed)
    print(f"killed with {held} B on the worker; daemons left: {len(left)}")
    assert left, "a killed apply cannot stop the worker's daemon: the next copy must"
    planned = bed.reconciler("plan").stdout
    assert "checkpoint on spark-worker: copy" in planned, planned

    bed.node(HEAD, "tc", "qdisc", "del", "dev", FABRIC_PORT, "root")
    # The revision directory: model_dir links to it only once the group serves it, after the copy.
    size = int(bed.node(HEAD, "sh", "-c", f"du -sb --exclude=.cache {MODEL}@*").stdout.split()[0])
    sent = fabric_tx_bytes(bed, HEAD)
    bed.reconciler("apply", "--yes")
    uploaded = fabric_tx_bytes(bed, HEAD) - sent
    print(f"resumed: {uploaded} B uploaded for a {size} B checkpoint of which the worker held {held} B")
    assert uploaded < size - held // 2, "what the worker held was not sent again"
    assert copy_daemons(bed) == [], "the stale daemon and this copy's own are stopped"
    assert bed.plan_exit() == 0
    deep = bed.reconciler("apply", "--yes", "--deep-verify")
    said = deep.stdout + deep.stderr
    assert "sha256 mismatch" not in said, "every file on the worker is right"
    assert said.count("files match their sha256") == 2, said[-3000:]
    assert bed.plan_exit() == 0


def test_copy_transport_ssh_copies_over_ssh_from_the_head(converged: Bed) -> None:
    bed = converged
    original = bed.spec.read_text(encoding="utf-8")
    assert "copy_transport" not in original
    bed.spec.write_text(original.replace("\nmodel:\n", "\nmodel:\n  copy_transport: ssh\n", 1), encoding="utf-8")
    try:
        shard = "model-00003-of-00006.safetensors"
        revision = bed.node(WORKER, "readlink", "-f", MODEL).stdout.strip()
        bed.node(WORKER, "rm", f"{revision}/{shard}")
        planned = bed.reconciler("plan").stdout
        assert "over SSH, as model.copy_transport says" in planned, planned
        bed.reconciler("apply", "--yes")
        assert copy_daemons(bed) == []
        assert bed.plan_exit() == 0
    finally:
        bed.spec.write_text(original, encoding="utf-8")
    assert bed.plan_exit() == 0, "the transport is not desired state: switching it back changes nothing"
