"""N nodes, not two: a three-node spec converges with tensor parallel 3 and ordered ranks, and
the checkpoint reaches the third node from the second (a chain), not again from the head.

The session's testbed has three nodes; this module's spec names all three (`bed3`)."""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.e2e.conftest import Bed

pytestmark = pytest.mark.testbed

MODEL = "/srv/spark/models/DeepSeek-V4.1-Flash-Spark"


def fabric_tx_bytes(bed: Bed, node: str) -> int:
    """Bytes the node has sent on its fabric port (netlink counters of its own namespace)."""
    links = json.loads(bed.node(node, "ip", "-s", "-j", "link", "show", "enp1s0f1np1").stdout)
    return int(links[0]["stats64"]["tx"]["bytes"])


def test_three_nodes_converge_and_stay_converged(bed3: Bed) -> None:
    planned = bed3.reconciler("plan").stdout
    third = next(line for line in planned.splitlines() if "checkpoint on spark-third: copy" in line)
    assert "from spark-worker into" in third, "the third node copies from the second: the head uploads once"
    sent = fabric_tx_bytes(bed3, "spark-head")
    started = time.monotonic()
    result = bed3.reconciler("apply", "--yes")
    print(f"three nodes converged in {time.monotonic() - started:.1f} s")
    uploaded = fabric_tx_bytes(bed3, "spark-head") - sent
    size = int(bed3.node("spark-head", "du", "-sbL", "--exclude=.cache", MODEL).stdout.split()[0])
    print(
        f"head fabric upload {uploaded} B for a {size} B checkpoint: {uploaded / size:.2f}x (control traffic included)"
    )
    # The head sends the checkpoint once (to the worker); the third node's copy comes from the worker.
    assert 0.95 * size <= uploaded <= 1.3 * size, f"head uploaded {uploaded} B for a {size} B checkpoint"
    assert re.search(r"copied \d+ files from spark-worker to spark-third:", result.stdout + result.stderr)
    out = result.stdout
    assert out.index("start dsv41-r2") < out.index("start dsv41-r1") < out.index("start dsv41-r0")
    assert bed3.plan_exit() == 0
    for node, rank in (("spark-head", 0), ("spark-worker", 1), ("spark-third", 2)):
        command = bed3.docker_json(node, "inspect", "--format", "{{json .Config.Cmd}}", f"dsv41-r{rank}")
        assert isinstance(command, list)
        assert command[command.index("--tensor-parallel-size") + 1] == "3"
        assert command[command.index("--node-rank") + 1] == str(rank)
        running = bed3.node(node, "docker", "inspect", "--format", "{{.State.Running}}", f"dsv41-r{rank}")
        assert running.stdout.strip() == "true"
