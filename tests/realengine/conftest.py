"""The real-engine lane's testbed: two nodes, the tiny model's Hub, tb/vllm in the registry.

One bring-up for the whole lane (`lane`, session scope) and one converge from empty
(`first_converge`, whose record the converge test reads); every other test starts from a
serving group (`serving`: applied only when the plan is not empty) and leaves one behind, so
the tests run in any order. The loop's tests are a module of their own, so the loop runs only
while they do.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.e2e.conftest import ROOT, TB_ROOT, Bed, testbed_available, write_spec
from tests.e2e.conftest import wait_until as e2e_wait_until
from tests.testbed.realengine import lane as lane_setup
from tests.testbed.testbed import Testbed

LANE_START = time.monotonic()
LANE_USED: list[bool] = []  # set by the fixture: only a run that brought the lane up reports its time
HEAD, WORKER = "spark-head", "spark-worker"
R0, R1 = "dsv41-r0", "dsv41-r1"
CLIENT = "tests/realengine/client.py"


@pytest.fixture(scope="session")
def lane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    if not testbed_available():
        pytest.skip("the real-engine lane needs root, dockerd and sshd (run ./make.sh test-real-engine as root)")
    LANE_USED.append(True)
    testbed = Testbed(TB_ROOT)
    started = time.monotonic()
    image = lane_setup.up(testbed)
    sys.stderr.write(f"\nreal-engine lane: testbed up in {time.monotonic() - started:.1f} s\n")
    directory = tmp_path_factory.mktemp("realengine")
    spec = write_spec(ROOT / "specs/testbed-vllm.yaml", directory / "testbed-vllm.yaml", image)
    try:
        yield Bed(testbed, spec)
    finally:
        testbed.down()


@dataclass
class FirstConverge:
    """What the converge from empty left, read right after it: both ranks' inspect and logs."""

    plan_exit_before: int
    plan_exit_after: int
    r0: dict[str, Any]
    r1: dict[str, Any]
    logs: dict[str, str]


@pytest.fixture(scope="session")
def first_converge(lane: Bed) -> FirstConverge:
    before = lane.plan_exit()
    started = time.monotonic()
    lane.reconciler("apply", "--yes", timeout=1500)
    seconds = time.monotonic() - started
    print(f"converge from empty (pull tb/vllm, checkpoint, real vLLM start): {seconds:.0f} s")
    found = {name: logs(lane, node, name) for node, name in ((HEAD, R0), (WORKER, R1))}
    return FirstConverge(before, lane.plan_exit(), inspect(lane, HEAD, R0), inspect(lane, WORKER, R1), found)


@pytest.fixture
def serving(lane: Bed, first_converge: FirstConverge) -> Bed:
    """The group converged and answering (after the first converge, whatever ran since)."""
    del first_converge
    return serve(lane)


def serve(lane: Bed) -> Bed:
    lane.converged(timeout=900)
    wait_until(lambda: answers(lane), 120, "a completion answers")
    return lane


def inspect(bed: Bed, node: str, name: str) -> dict[str, Any]:
    result = bed.node(node, "docker", "inspect", name, check=False)
    if result.returncode != 0:
        return {}
    found: list[dict[str, Any]] = json.loads(result.stdout)
    return found[0]


def container_id(bed: Bed, node: str, name: str) -> str:
    return str(inspect(bed, node, name).get("Id", ""))


def client(bed: Bed, *args: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(bed.node(HEAD, "python3", CLIENT, *args).stdout)
    return loaded


def logs(bed: Bed, node: str, name: str) -> str:
    result = bed.node(node, "docker", "logs", name, check=False)
    return result.stdout + result.stderr


def state(bed: Bed, node: str, name: str) -> tuple[str, int]:
    found = inspect(bed, node, name)["State"]
    return str(found["Status"]), int(found["ExitCode"])


def answers(bed: Bed) -> bool:
    return bool(client(bed, "complete", "2").get("status") == 200)


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """The e2e helper, checking every 2 s (a real engine's answers take longer)."""
    return e2e_wait_until(condition, timeout, what, every=2.0)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    del session, exitstatus
    if LANE_USED:
        print(f"\nreal-engine lane: tests took {time.monotonic() - LANE_START:.0f} s of wall time")
