"""The Hub goes away under a converged, serving group, with the loop running.

Each test starts from the outage: the loop running, the Hub stand-in stopped and the head's
cached listings removed, so every pass has to ask the Hub (the case that
used to end in `internal error: ConnectError` for `stop` and `status`). While the Hub stand-in
is stopped, then answers 500, then 429: the group keeps serving, is healed when a rank dies,
`stop` and `start` work, and `status` shows the checkpoint blocked with the cause. When the
Hub is back the loop converges.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e.conftest import Bed, running_loop
from tests.testbed import services
from tests.testbed.config import HOST_IP, HUB_PORT
from tests.testbed.hub.control import StandinControl

pytestmark = pytest.mark.testbed

HEAD, WORKER = "spark-head", "spark-worker"
LISTINGS = "/srv/spark/state/hub"  # the head's cached Hub listings, one per commit
LOOP_SETTINGS = """
loop:
  resync_s: 5
  liveness_s: 2
  liveness_timeout_s: 3
  failure_threshold: 2
  max_backoff_s: 10
"""


def status(bed: Bed) -> dict[str, Any]:
    result = bed.reconciler("status", "--json", check=False)
    assert "internal error" not in result.stdout + result.stderr
    loaded: dict[str, Any] = json.loads(result.stdout)
    assert result.returncode == (0 if loaded["converged"] else 2), result.stdout + result.stderr
    return loaded


def wait_for(bed: Bed, condition: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict[str, Any]:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        current = status(bed)
        if condition(current):
            print(f"{what}: {time.monotonic() - started:.1f} s")
            return current
        time.sleep(1)
    raise AssertionError(f"{what}: not within {timeout} s; last status: {json.dumps(status(bed))[:2000]}")


def checkpoint_blocked_by(cause: str) -> Callable[[dict[str, Any]], bool]:
    def check(current: dict[str, Any]) -> bool:
        return current["health"] == 200 and any(
            "cannot check the checkpoint against the Hub" in c and cause in c for c in current["conditions"]
        )

    return check


def serving_blocked_by(cause: str) -> Callable[[dict[str, Any]], bool]:
    """Blocked by the Hub, and the group serving with nothing left to do for its ranks (a
    restart a test before caused has run to its end)."""
    blocked = checkpoint_blocked_by(cause)

    def check(current: dict[str, Any]) -> bool:
        return blocked(current) and current["nodes"][HEAD]["components"]["ranks"].startswith("in sync")

    return check


@pytest.fixture(scope="module")
def looping(bed: Bed) -> Iterator[Bed]:
    bed.spec.write_text(bed.spec.read_text(encoding="utf-8") + LOOP_SETTINGS, encoding="utf-8")
    bed.converged()
    with running_loop(bed):  # the next module's reset starts the Hub again
        yield bed


def hub_gone(bed: Bed) -> None:
    """The Hub stand-in stopped and the head's cached listings removed, so every pass asks."""
    services.stop_hub(bed.testbed.layout)
    bed.node(HEAD, "rm", "-rf", LISTINGS)


@pytest.fixture
def outage(looping: Bed) -> Bed:
    """The group serving under the loop, with the Hub gone (each test starts from there)."""
    hub_gone(looping)
    wait_for(looping, serving_blocked_by("cannot reach"), 120, "blocked by the outage, serving")
    return looping


def test_with_the_hub_stopped_the_group_serves_and_status_names_the_cause(looping: Bed) -> None:
    hub_gone(looping)
    outage = looping
    # The ranks in sync as well: whatever a test before left to the loop (a group restart after
    # a killed rank) goes on without the Hub.
    wait_for(outage, serving_blocked_by(f"cannot reach http://{HOST_IP}:{HUB_PORT}"), 120, "blocked, serving")
    plan = outage.reconciler("plan", check=False)
    assert "cannot check the checkpoint against the Hub" in plan.stdout
    assert "internal error" not in plan.stdout + plan.stderr


def test_a_rank_killed_during_the_outage_is_restarted(outage: Bed) -> None:
    before = outage.node(WORKER, "docker", "inspect", "--format", "{{.Id}}", "dsv41-r1").stdout.strip()
    outage.node(WORKER, "docker", "kill", "dsv41-r1")

    def replaced(current: dict[str, Any]) -> bool:
        now = outage.node(WORKER, "docker", "inspect", "--format", "{{.Id}}", "dsv41-r1", check=False).stdout
        return serving_blocked_by("cannot reach")(current) and now.strip() not in ("", before)

    wait_for(outage, replaced, 120, "serving again after rank 1 was killed")


def test_stop_and_start_work_without_the_hub(outage: Bed) -> None:
    stopped = outage.reconciler("stop", "--json")
    assert json.loads(stopped.stdout)["held"] is True
    state = outage.node(HEAD, "docker", "inspect", "--format", "{{.State.Running}}", "dsv41-r0").stdout.strip()
    assert state == "false"
    started = outage.reconciler("start", "--json", check=False)
    assert "internal error" not in started.stdout + started.stderr
    assert started.returncode == 0, started.stdout + started.stderr
    wait_for(outage, serving_blocked_by("cannot reach"), 120, "serving again after start")


@pytest.mark.parametrize(("status_code", "cause"), [(500, "HTTP 500"), (429, "HTTP 429")])
def test_a_hub_answering_errors_is_named_as_the_cause(outage: Bed, status_code: int, cause: str) -> None:
    services.start_hub(outage.testbed.layout)
    control = StandinControl(f"http://{HOST_IP}:{HUB_PORT}")
    control.fail(count=100_000, status=status_code, path="/api/*")
    try:
        wait_for(outage, checkpoint_blocked_by(cause), 60, f"blocked by {cause}")
    finally:
        services.stop_hub(outage.testbed.layout)


def test_when_the_hub_is_back_the_loop_converges(outage: Bed) -> None:
    services.start_hub(outage.testbed.layout)
    current = wait_for(outage, lambda s: s["converged"] and s["health"] == 200, 60, "converged with the Hub back")
    assert not current["conditions"]
    assert outage.plan_exit() == 0
