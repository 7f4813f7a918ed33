"""N nodes, not two: a three-node spec converges with tensor parallel 3 and ordered ranks."""

from __future__ import annotations

import time

import pytest

from tests.e2e.conftest import Bed

pytestmark = pytest.mark.testbed


def test_three_nodes_converge_and_stay_converged(bed3: Bed) -> None:
    started = time.monotonic()
    result = bed3.reconciler("apply")
    print(f"three nodes converged in {time.monotonic() - started:.1f} s")
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
