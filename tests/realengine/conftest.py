"""The real-engine lane's testbed: two nodes, the tiny model's Hub, tb/vllm in the registry.

One bring-up for the whole lane (`lane` fixture, session scope); the tests then build on
each other in file order, as one deployment's life: converge, smoke, bench, faults.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import pytest

from tests.e2e.conftest import ROOT, TB_ROOT, Bed, testbed_available, write_spec
from tests.testbed.realengine import lane as lane_setup
from tests.testbed.testbed import Testbed

LANE_START = time.monotonic()
LANE_USED: list[bool] = []  # set by the fixture: only a run that brought the lane up reports its time


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


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    del session, exitstatus
    if LANE_USED:
        print(f"\nreal-engine lane: tests took {time.monotonic() - LANE_START:.0f} s of wall time")
