"""The reconcile loop against the real engine's failure modes: a rank 1 killed in the middle of
a request, a rank 1 frozen while Docker and /health say all is well, and rank 0 killed, which
leaves a headless rank 1 behind that must be replaced, not reused.

The loop runs for this module only (`looping`); each test injects one fault into a serving
group and waits until the loop has replaced the group, so the tests run in any order. (A rank
killed without traffic, repaired on the worker's Docker event, is the end-to-end lane's, with
the engine stand-in.) Times are printed, not asserted.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest

from tests.e2e.conftest import Bed, running_loop
from tests.realengine.conftest import (
    CLIENT,
    HEAD,
    R0,
    R1,
    WORKER,
    FirstConverge,
    answers,
    client,
    container_id,
    inspect,
    serve,
    state,
    wait_until,
)

pytestmark = pytest.mark.realengine


@pytest.fixture(scope="module")
def looping(lane: Bed, first_converge: FirstConverge) -> Iterator[Bed]:
    del first_converge  # the converge from empty is the converge test's, not the loop's
    serve(lane)
    with running_loop(lane, stop_timeout_s=60, log_tail=4000):
        wait_until(lambda: loop_idle(lane) and answers(lane), 600, "loop's first pass done, group serving")
        yield lane


def loop_log(bed: Bed) -> str:
    return (bed.spec.parent / "loop.log").read_text(encoding="utf-8")


def loop_idle(bed: Bed) -> bool:
    """The loop's last word is a published status (no pass running), and it says converged.

    A pass that started before a fault can end after it with "converged"; the status file
    alone cannot tell, its log can: every pass ends with a `status:` line.
    """
    lines = [line for line in loop_log(bed).splitlines() if line.startswith("[loop] ")]
    return bool(lines) and lines[-1] == "[loop] status: converged"


def group_replaced(bed: Bed, old_r0: str, old_r1: str) -> Callable[[], bool]:
    """Both ranks are new containers, rank 1 started first, a completion works, and the loop is
    idle again (the repairing pass, its smoke step included, has finished)."""

    def check() -> bool:
        if not loop_idle(bed):
            return False
        r0, r1 = inspect(bed, HEAD, R0), inspect(bed, WORKER, R1)
        if not r0 or not r1 or r0["Id"] == old_r0 or r1["Id"] == old_r1:
            return False
        if not (r0["State"]["Running"] and r1["State"]["Running"]):
            return False
        return r1["State"]["StartedAt"] < r0["State"]["StartedAt"] and answers(bed)

    return check


def settled(bed: Bed, key: str) -> None:
    wait_until(lambda: bed.plan_exit() == 0, 60, "plan empty")
    assert bed.api_key() == key


def test_rank1_killed_during_a_request_restarts_the_group_in_order(looping: Bed) -> None:
    bed, key = looping, looping.api_key()
    old_r0, old_r1 = container_id(bed, HEAD, R0), container_id(bed, WORKER, R1)
    request = subprocess.Popen(
        bed.testbed.exec_argv(HEAD, ["python3", CLIENT, "stream", "3000"]), stdout=subprocess.PIPE, text=True
    )
    assert request.stdout is not None
    assert json.loads(request.stdout.readline()) == {"event": "first"}
    killed = time.monotonic()
    bed.node(WORKER, "docker", "kill", R1)
    end = json.loads(request.stdout.readline())
    request.wait(timeout=30)
    print(f"in-flight request after rank 1 died: {end}")
    assert end["error"] is not None or end["tokens"] < 3000
    wait_until(group_replaced(bed, old_r0, old_r1), 400, "rank 1 killed in flight -> serving again")
    print(f"kill -> serving again: {time.monotonic() - killed:.0f} s")
    settled(bed, key)


def test_a_silent_rank1_is_caught_by_the_liveness_probe_although_health_stays_200(looping: Bed) -> None:
    """A rank 1 that stops answering without exiting (frozen worker process): Docker sees a
    running container and /health stays 200; only the keyed one-token completion notices."""
    bed, key = looping, looping.api_key()
    old_r0, old_r1 = container_id(bed, HEAD, R0), container_id(bed, WORKER, R1)
    top = bed.node(WORKER, "docker", "top", R1, "-o", "pid,args").stdout.splitlines()[1:]
    worker_pids = [line.split()[0] for line in top if "Worker_TP" in line]
    assert worker_pids, top
    seen = len(loop_log(bed))
    frozen = time.monotonic()
    bed.node(WORKER, "kill", "-STOP", *worker_pids)
    time.sleep(3)
    assert client(bed, "health")["status"] == 200
    assert state(bed, WORKER, R1)[0] == "running"
    wait_until(group_replaced(bed, old_r0, old_r1), 400, "rank 1 frozen -> serving again")
    print(f"freeze -> serving again: {time.monotonic() - frozen:.0f} s")
    log = loop_log(bed)[seen:]
    assert "liveness probe failed (2x)" in log
    assert "pass: liveness probe failed" in log
    settled(bed, key)


def test_rank0_killed_replaces_the_orphaned_rank1(looping: Bed) -> None:
    bed, key = looping, looping.api_key()
    old_r0, old_r1 = container_id(bed, HEAD, R0), container_id(bed, WORKER, R1)
    killed = time.monotonic()
    bed.node(HEAD, "docker", "kill", R0)
    wait_until(group_replaced(bed, old_r0, old_r1), 400, "rank 0 killed -> serving again")
    print(f"kill -> serving again: {time.monotonic() - killed:.0f} s")
    assert container_id(bed, WORKER, R1) != old_r1  # the orphan was replaced, not reused
    settled(bed, key)
