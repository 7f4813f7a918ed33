"""`reconciler run` on the testbed: the deployment heals itself.

The loop runs inside spark-head for the whole module. Each test injects one fault, waits for
the loop to repair it (printing the time to converge), and then checks what must hold after
any repair: `plan --detailed-exitcode` is 0, the API key is unchanged, and no checkpoint
file was rewritten.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import ROOT, Bed, events, exit_codes, first, loop_status, running_loop, wait_until
from tests.e2e.prometheus import Prometheus, dashboard_expressions, real_prometheus

pytestmark = pytest.mark.testbed

HEAD, WORKER = "spark-head", "spark-worker"
MODEL = "/srv/spark/models/DeepSeek-V4.1-Flash-Spark"
FAULT_FILE = "/srv/spark/state/cache/engine-fault.json"
LOOP_SETTINGS = """
loop:
  resync_s: 20
  liveness_s: 2
  liveness_timeout_s: 3
  failure_threshold: 2
  max_backoff_s: 20
  # The module breaks the group on purpose, one fault a test: only the breaker's own test counts.
  max_restarts: 50
"""

GUARD_RECORD = "  interval_s: 0.2\n  record_s: 24\n"
# The owner's notify command: it appends each event it is given to a file beside the spec.
NOTIFY_SCRIPT = '#!/bin/sh\ncat >> "$(dirname "$0")/notified.jsonl"\n'


@pytest.fixture(scope="module")
def looping(bed: Bed) -> Iterator[Bed]:
    text = bed.spec.read_text(encoding="utf-8")
    text = text.replace(
        "  extra_env:\n", f"  extra_env:\n    ENGINE_FAULT_FILE: {FAULT_FILE.replace('/srv/spark/state', '')}\n"
    )
    # The guard's memory record in 12 s windows (60 samples), trusted after two of them.
    text = text.replace("memguard:\n  floor_gib: 0.5\n", "memguard:\n  floor_gib: 0.5\n" + GUARD_RECORD)
    notify = bed.spec.parent / "notify.sh"
    notify.write_text(NOTIFY_SCRIPT, encoding="utf-8")
    notify.chmod(0o755)
    (bed.spec.parent / "notified.jsonl").unlink(missing_ok=True)
    bed.spec.write_text(text + LOOP_SETTINGS + f"  notify: [{notify}]\n", encoding="utf-8")
    with running_loop(bed):
        wait_for(bed, lambda s: s["converged"] and s["health"] == 200, 180, "first convergence")
        yield bed


@pytest.fixture
def settled(looping: Bed) -> Bed:
    """The loop idle on a converged, live group: what a test before may have left (a spec edit
    restored, a restart under way) has been repaired before this test breaks something."""
    wait_for(looping, lambda s: not s["loop"]["spec_error"] and healthy(looping)(s), 240, "settled")
    return looping


def status(bed: Bed) -> dict[str, Any]:
    """`status --json`: exit 0 converged, 2 not; {} when it cannot say (1, e.g. an invalid spec)."""
    result = bed.reconciler("status", "--json", check=False)
    if result.returncode == 1:
        return {}
    loaded: dict[str, Any] = json.loads(result.stdout)
    assert result.returncode == (0 if loaded["converged"] else 2), result.returncode
    return loaded


def wait_for(bed: Bed, condition: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        current = status(bed)
        if current and condition(current):
            elapsed = time.monotonic() - started
            print(f"{what}: {elapsed:.1f} s")
            return elapsed
        time.sleep(1)
    raise AssertionError(f"{what}: not within {timeout} s; last status: {json.dumps(status(bed))[:2000]}")


def serving_again(bed: Bed, old_r0: str, old_r1: str) -> Callable[[dict[str, Any]], bool]:
    """Both ranks replaced (a group restart), running, and the API healthy."""

    def check(current: dict[str, Any]) -> bool:
        if not current["converged"] or current["health"] != 200:
            return False
        return bed.container_id(HEAD, "dsv41-r0") != old_r0 and bed.container_id(WORKER, "dsv41-r1") != old_r1

    return check


def model_state(bed: Bed) -> dict[str, str]:
    script = f"cd {MODEL} && find . -path ./.cache -prune -o -type f -printf '%P %i %T@\\n' | sort"
    return {node: bed.node(node, "sh", "-c", script).stdout for node in (HEAD, WORKER)}


def assert_settled(bed: Bed, key: str, checkpoint: dict[str, str]) -> None:
    assert bed.plan_exit() == 0
    assert bed.api_key() == key
    assert model_state(bed) == checkpoint


def repaired_after(
    bed: Bed, fault: Callable[[], object], what: str, timeout: float = 180, *, restart: bool = True
) -> None:
    """Inject a fault, wait for the loop to serve again (after a group restart, if `restart`)."""
    key, checkpoint = bed.api_key(), model_state(bed)
    old_r0, old_r1 = bed.container_id(HEAD, "dsv41-r0"), bed.container_id(WORKER, "dsv41-r1")
    fault()
    condition = serving_again(bed, old_r0, old_r1) if restart else healthy(bed)
    wait_for(bed, condition, timeout, f"time to converge after {what}")
    assert_settled(bed, key, checkpoint)


def healthy(bed: Bed) -> Callable[[dict[str, Any]], bool]:
    """Converged, and a one-token completion answers (not just /health)."""

    def check(current: dict[str, Any]) -> bool:
        if not current["converged"] or current["health"] != 200:
            return False
        loop = loop_status(bed)
        return loop.get("condition") == "converged" and loop.get("liveness_failures") == 0

    return check


def test_kill_rank1_is_repaired_at_once_on_the_workers_docker_event(settled: Bed) -> None:
    looping = settled
    """Rank 1's exit, as the worker's Docker event stream reports it, starts the repairing pass
    before the liveness probe could: the probe (every 2 s) may fail once by then, but a pass on
    it alone needs two failures in a row. (Rank 0 killed, and the real engine's orphaned rank 1,
    is the real-engine lane's.)"""
    log = looping.spec.parent / "loop.log"
    seen = len(log.read_text(encoding="utf-8"))
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with real_prometheus(looping, status(looping)["api"]) as prometheus:
        wait_until(lambda: prometheus.targets_up() == SCRAPED, 60, "Prometheus scraping the loop and vLLM")
        before = (prometheus.value(RANK_EXIT_RESTARTS) or 0, prometheus.value(RANK_EXIT_STARTS) or 0)
        repaired_after(looping, lambda: looping.node(WORKER, "docker", "kill", "dsv41-r1"), "killing rank 1")
        assert_prometheus_saw_the_repair(prometheus, *before)
    assert_the_last_two_starts_are_shown(looping, since)
    history = json.loads(looping.reconciler("events", "--since", since, "--json").stdout)["events"]
    repairing = [e for e in history if e["kind"] == "pass" and "spark-worker: dsv41-r1 die" in e["trigger"]]
    assert repairing, history
    assert repairing[0]["outcome"] == "converged", repairing
    assert any(e["kind"] == "restart" and "dsv41-r1 on spark-worker" in e["cause"] for e in history), history
    started = [(e["node"], e["outcome"]) for e in history if e["kind"] == "step" and e["step"] == "ranks.start"]
    assert started[:2] == [(WORKER, "done"), (HEAD, "done")], started
    lines = log.read_text(encoding="utf-8")[seen:].splitlines()
    # A pass names every event that came in while it was being started: on a loaded machine
    # rank 0 may have exited on its lost peer by then too (listed first, in node order).
    causes = [line.split(": ", 1)[1].split(", ") if line.startswith("[loop] pass: ") else [] for line in lines]
    by_the_event = next((n for n, names in enumerate(causes) if "spark-worker: dsv41-r1 die" in names), None)
    assert by_the_event is not None, lines
    assert not any("liveness probe failed (2x)" in line for line in lines[:by_the_event]), lines


SCRAPED = {"spark-reconciler": 1.0, "spark-vllm": 1.0}
RANK_EXIT_RESTARTS = 'spark_reconciler_group_restarts_total{cause="rank_exit"}'
RANK_EXIT_STARTS = 'spark_reconciler_group_starts_total{cause="rank_exit"}'


def alert_held(name: str) -> str:
    """A query that is 1 when the alert's own expression (monitoring/alerts.yml, read here) held
    at any moment of the last 10 minutes, evaluated every 250 ms over the stored samples. The
    firing of ALERTS itself depends on where a one-second rule evaluation falls in an outage of a
    few seconds (a scrape that times out stores its sample late): the rule's mechanics, `for:`
    included, are promtool's tests; this asks whether Prometheus saw what the rule looks for."""
    rules = yaml.safe_load((ROOT / "monitoring/alerts.yml").read_text(encoding="utf-8"))
    expr = next(r["expr"] for group in rules["groups"] for r in group["rules"] if r.get("alert") == name)
    # Both of the alert's eyes may see the outage (one series each): any of them is enough.
    return f"clamp_max(count(max_over_time(({expr})[10m:250ms])), 1)"


def assert_prometheus_saw_the_repair(prometheus: Prometheus, restarts_before: float, starts_before: float) -> None:
    """The restart counter moved, the liveness alert's condition held while the API was down
    (vLLM's scrape through the front failed, or the loop's probe), and the loop's pass and vLLM's
    own metrics are there again."""
    wait_until(lambda: (prometheus.value(RANK_EXIT_RESTARTS) or 0) > restarts_before, 30, "the restart counted")
    held = alert_held("SparkLivenessFailing")
    wait_until(lambda: prometheus.value(held) == 1, 30, "the liveness alert's condition seen")
    wait_until(lambda: prometheus.targets_up() == SCRAPED, 60, "both scrapes answering again")
    assert prometheus.value('spark_reconciler_reconcile_total{trigger="container_event", result="converged"}')
    assert prometheus.value('sum(spark_reconciler_drift{node="spark-worker"})') == 0
    assert prometheus.value('sum(vllm:num_requests_running{job="spark-vllm"})') is not None
    wait_until(lambda: (prometheus.value(RANK_EXIT_STARTS) or 0) > starts_before, 60, "the repair's start timed")
    refused = {expr: why for expr in dashboard_expressions() if (why := prometheus.refused(expr))}
    assert not refused, refused


def assert_the_last_two_starts_are_shown(bed: Bed, since: str) -> None:
    """The repair's start beside the one before it (the module's first, or another test's), phase
    by phase, in `status`."""
    # The start is recorded after the smoke, which `serving_again` may have seen begin.
    wait_until(lambda: status(bed)["starts"][-1]["at"] >= since, 60, "the repair's start recorded")
    current = status(bed)
    previous, last = current["starts"]
    assert previous["at"] <= since <= last["at"], current["starts"]
    assert last["cause_kind"] == "rank_exit", last
    assert {"container_start", "engine_load", "smoke"} <= set(last["phases"]), last
    assert 0 < last["phases"]["engine_load"] <= last["ready_s"], last
    text = bed.reconciler("status", check=False).stdout
    assert re.search(r"last start: ready \S+ after start \(.*engine_load.*\).*; previous \S+", text), text


def test_invalid_spec_edit_keeps_the_last_good_spec(settled: Bed) -> None:
    looping = settled
    good = looping.spec.read_text(encoding="utf-8")
    r0 = looping.container_id(HEAD, "dsv41-r0")
    looping.spec.write_text(good.replace("serving:\n", "serving:\n  port: 99999\n", 1), encoding="utf-8")
    try:
        started = time.monotonic()
        while not loop_status(looping).get("spec_error") and time.monotonic() - started < 60:
            time.sleep(1)
        assert "serving.port" in str(loop_status(looping).get("spec_error"))
        assert loop_status(looping)["condition"] == "converged"
        assert looping.container_id(HEAD, "dsv41-r0") == r0, "the group keeps running on the last good spec"
        invalid = looping.reconciler("status", check=False)
        assert invalid.returncode == 1
        assert "serving.port" in invalid.stderr
    finally:
        looping.spec.write_text(good, encoding="utf-8")
    wait_for(looping, lambda s: not s["loop"]["spec_error"] and s["converged"], 60, "spec error cleared")
    assert looping.container_id(HEAD, "dsv41-r0") == r0


def test_kv_bytes_edit_drains_a_long_stream_then_restarts_the_group(settled: Bed) -> None:
    """A planned restart (a spec edit) lets the stream in flight finish: while it runs, the front
    answers new requests 503 with Retry-After; then the group restarts onto the new setting."""
    looping = settled
    good = looping.spec.read_text(encoding="utf-8")
    streamed: dict[str, Any] = {}
    stream = threading.Thread(target=lambda: streamed.update(client(looping, "stream", "3000")))

    def edit() -> None:
        stream.start()
        wait_until(lambda: client(looping, "load")["requests"] >= 1, 10, "the stream under way", every=0.2)
        looping.spec.write_text(good.replace("serving:\n", "serving:\n  kv_bytes: 2500000000\n", 1), encoding="utf-8")
        refused: dict[str, Any] = {}
        wait_until(lambda: refused.update(client(looping, "models")) or refused["status"] == 503, 20, "draining")
        assert refused["retry_after"] == "30", refused
        assert "restarting" in refused["body"], refused
        stream.join(90)
        assert streamed["status"] == 200, streamed
        assert streamed["last"] == "data: [DONE]", streamed
        assert streamed["events"] >= 3000, "the whole stream, through the drain"

    since = time.time()
    try:
        repaired_after(looping, edit, "a kv_bytes edit with a stream in flight")
        command = json.loads(
            looping.node(HEAD, "docker", "inspect", "--format", "{{json .Config.Cmd}}", "dsv41-r0").stdout
        )
        assert command[command.index("--kv-cache-memory-bytes") + 1] == "2500000000"
        head_events, worker_events = events(looping, HEAD, since), events(looping, WORKER, since)
        assert first(head_events, "die", "dsv41-r0") < first(worker_events, "die", "dsv41-r1"), "rank 0 stops first"
        assert first(worker_events, "start", "dsv41-r1") < first(head_events, "start", "dsv41-r0"), (
            "rank 1 starts first"
        )
        for node in (HEAD, WORKER):  # a planned stop lets the engine finish its shutdown (11 s, past Docker's 10 s)
            assert exit_codes(looping, node, since) == [0], exit_codes(looping, node, since)
        log = (looping.spec.parent / "loop.log").read_text(encoding="utf-8")
        assert "front.drain" in log or "drain:" in log, log[-3000:]
        assert "drained in" in log, log[-3000:]
    finally:
        looping.spec.write_text(good, encoding="utf-8")


# A client inside the head, the key read from its file (never argv): `stream N` (a completion of N
# tokens, streamed), `models` (a keyed GET /v1/models) or `load` (rank 0's requests, past the front).
CLIENT = r"""
import json, sys, urllib.error, urllib.request
key = open("/srv/spark/state/api_key").read().strip()
what = sys.argv[1]
headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
if what == "load":
    text = urllib.request.urlopen("http://127.0.0.1:18000/metrics", timeout=10).read().decode()
    running = [line for line in text.splitlines() if line.startswith("vllm:num_requests_running")]
    print(json.dumps({"requests": int(float(running[0].rsplit(" ", 1)[1]))}))
    raise SystemExit(0)
if what == "stream":
    body = {"model": "deepseek-v4.1-flash", "prompt": "Once upon a time", "max_tokens": int(sys.argv[2]),
            "ignore_eos": True, "stream": True}
    request = urllib.request.Request("http://127.0.0.1:8000/v1/completions", json.dumps(body).encode(), headers)
else:
    request = urllib.request.Request("http://127.0.0.1:8000/v1/models", headers=headers)
try:
    with urllib.request.urlopen(request, timeout=120) as answer:
        events = [line.strip() for line in answer if line.startswith(b"data: ")]
        last = events[-1].decode() if events else None
        print(json.dumps({"status": answer.status, "events": len(events), "last": last}))
except urllib.error.HTTPError as error:
    body = error.read().decode()
    print(json.dumps({"status": error.code, "retry_after": error.headers.get("Retry-After"), "body": body}))
"""


def client(bed: Bed, *args: str) -> dict[str, Any]:
    answer: dict[str, Any] = json.loads(bed.node(HEAD, "python3", "-c", CLIENT, *args).stdout)
    return answer


def notified(bed: Bed, after: int = 0) -> list[dict[str, Any]]:
    """The events the notify command was given, from the `after`-th on."""
    path = bed.spec.parent / "notified.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [json.loads(line) for line in lines[after:]]


def test_guard_trip_holds_the_group_instead_of_restarting_it(settled: Bed) -> None:
    """...and the owner's notify command is told: the trip, then the recovery."""
    looping = settled
    told_before = len(notified(looping))
    good = looping.spec.read_text(encoding="utf-8")
    available = status(looping)["nodes"][HEAD]["mem_available_gib"]
    floor = max(available - 1.5, 0.5)
    hold = 'echo \'{"ENGINE_FAULT_HOLD_MIB": "4096"}\' > ' + FAULT_FILE
    looping.spec.write_text(
        good.replace("memguard:\n  floor_gib: 0.5\n", f"memguard:\n  floor_gib: {floor:.2f}\n"), encoding="utf-8"
    )
    try:
        wait_for(looping, lambda s: s["converged"], 120, "guard restarted with the higher floor")
        looping.node(HEAD, "sh", "-c", hold)
        wait_for(looping, lambda s: str(s["loop"]["condition"]).startswith("held"), 120, "guard trip -> held")
        current = status(looping)
        assert "lower serving.kv_bytes or serving.gpu_util" in current["loop"]["condition"].lower()
        running = looping.node(HEAD, "docker", "inspect", "--format", "{{.State.Running}}", "dsv41-r0").stdout.strip()
        assert running == "false", "held, not restarted"
        time.sleep(5)
        assert str(status(looping)["loop"]["condition"]).startswith("held")
    finally:
        looping.node(HEAD, "rm", "-f", FAULT_FILE)
        looping.spec.write_text(good, encoding="utf-8")
    wait_for(looping, lambda s: s["converged"] and s["health"] == 200, 180, "spec change clears the trip")
    assert looping.plan_exit() == 0
    wait_until(lambda: "recovery" in [e["event"] for e in notified(looping, told_before)], 60, "recovery told")
    told = notified(looping, told_before)
    # The testbed's nodes share one machine's memory: the worker's guard may trip as well.
    trips = {e["node"]: e for e in told if e["event"] == "trip"}
    assert HEAD in trips, told
    assert {(e["what"], e["deployment"]) for e in trips.values()} == {("memguard", "dsv41")}
    assert "the memory guard on spark-head stopped the ranks" in trips[HEAD]["summary"]
    assert {"guard_trip"} <= {e["reason"] for e in told if e["event"] == "hold"}, told
    events_in_order = [e["event"] for e in told]
    assert events_in_order.index("trip") < events_in_order.index("recovery"), events_in_order
    assert looping.api_key() not in (looping.spec.parent / "notified.jsonl").read_text(encoding="utf-8")


def test_restart_of_the_workers_dockerd(settled: Bed) -> None:
    looping = settled
    repaired_after(looping, lambda: looping.testbed.restart_dockerd(WORKER), "restarting the worker's dockerd")


def test_fabric_link_down_then_up(settled: Bed) -> None:
    looping = settled

    def pull_and_replug() -> None:
        looping.testbed.link(WORKER, up=False)
        try:
            # With the cable out the worker cannot even be reached over SSH (its fabric address):
            # the loop must notice (liveness), say so, and not tear anything down half-way.
            wait_for(looping, lambda s: not s["converged"], 90, "link down noticed")
            shown = looping.reconciler("status", check=False)
            assert shown.returncode == 2
            assert "UNKNOWN: spark-worker not answering" in shown.stdout, shown.stdout
            table = shown.stdout.split("\n\n")[1].splitlines()
            assert table[0].startswith("NODE")
            assert "UNKNOWN" in table[2]
            assert max(map(len, table)) <= 100, shown.stdout
        finally:
            looping.testbed.link(WORKER, up=True)
        # Long enough for the loop's probes to see what the outage did (liveness every 2 s, two
        # failures of 3 s each call for a pass): "healthy" before that would be the old status.
        time.sleep(12)

    # A short outage may heal without a restart (the ranks' connection survives); a long one
    # ends in rank 0 exiting, which restarts the group. Either way the loop must get back to
    # a converged, live deployment without a human, and never act while the worker is away.
    repaired_after(looping, pull_and_replug, "a fabric link down and up", timeout=360, restart=False)
    answer = looping.node(HEAD, "python3", "tests/testbed/ask.py", "What is 17 * 23?").stdout
    assert "391" in answer


def test_an_engine_that_dies_after_ready_trips_the_breaker_and_start_releases_it(settled: Bed) -> None:
    """Rank 1 exits 20 s after every start (the stand-in's startup is 1 s): with
    `loop.max_restarts: 1` the loop restarts the group once, then holds it on the second death,
    saying so with the restart's time; every death leaves an incident with both ranks' logs;
    `reconciler start` releases it and the count starts again."""
    looping = settled
    good = looping.spec.read_text(encoding="utf-8")
    dying = 'echo \'{"ENGINE_FAULT_EXIT_AFTER_S": "21"}\' > ' + FAULT_FILE
    looping.spec.write_text(good.replace("  max_restarts: 50\n", "  max_restarts: 1\n"), encoding="utf-8")
    before = {item["id"] for item in incidents(looping)}
    try:
        looping.node(WORKER, "sh", "-c", dying)
        wait_for(looping, lambda s: "crash loop" in str(s["loop"]["condition"]), 300, "two deaths -> held")
        condition = status(looping)["loop"]["condition"]
        assert "1 unplanned group restart within 6 h" in condition, condition
        assert "reconciler start" in condition
        for node, name in ((HEAD, "dsv41-r0"), (WORKER, "dsv41-r1")):
            state = looping.node(node, "docker", "inspect", "--format", "{{.State.Running}}", name).stdout.strip()
            assert state == "false", f"{name}: held, not restarted"
        time.sleep(5)
        assert "crash loop" in str(status(looping)["loop"]["condition"]), "still held"
        recorded = [item for item in incidents(looping) if item["id"] not in before]
        assert [item["kind"] for item in recorded] == ["rank exit"] * 2, recorded
        for item in recorded:
            shown = json.loads(looping.reconciler("incidents", "show", item["id"], "--json").stdout)
            assert {"r0.log", "r1.log", "facts.json", "plan.json"} <= set(shown["files"]), item
            worker = next(rank for rank in shown["incident"]["ranks"] if rank["rank"] == 1)
            assert worker["exit_code"] == 1, worker
            assert "fault injection" in shown["files"]["r1.log"]
        assert status(looping)["last_incident"]["id"] == recorded[0]["id"]
        looping.node(WORKER, "rm", "-f", FAULT_FILE)
        looping.reconciler("start", "--wait", "120")
        wait_for(looping, healthy(looping), 120, "released by start")
        assert looping.node(HEAD, "test", "-e", "/srv/spark/state/restarts.json", check=False).returncode == 1
    finally:
        looping.node(WORKER, "rm", "-f", FAULT_FILE)
        looping.spec.write_text(good, encoding="utf-8")


def incidents(bed: Bed) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = json.loads(bed.reconciler("incidents", "--json").stdout)["incidents"]
    return listed


def test_a_worker_mtu_reset_to_1500_is_one_blocker_and_no_restart(settled: Bed) -> None:
    """A firmware update's reboot left the worker's fabric at MTU 1500 while the head stays at
    9000: a rank that dies then is not restarted into a fabric that cannot carry it (and again,
    and again); the loop holds one blocker with the fix until the MTU agrees."""
    looping = settled
    log = looping.spec.parent / "loop.log"
    looping.testbed.fabric_mtu(WORKER, 1500)
    try:
        looping.node(WORKER, "docker", "kill", "dsv41-r1")
        r1 = looping.container_id(WORKER, "dsv41-r1")
        seen = len(log.read_text(encoding="utf-8"))

        def blocked_twice(current: dict[str, Any]) -> bool:
            passes = log.read_text(encoding="utf-8")[seen:].count("[loop] pass: ")
            return passes >= 2 and any("MTU differs" in item for item in current["conditions"])

        wait_for(looping, blocked_twice, 90, "two passes blocked on the MTU")
        current = status(looping)
        fabric = [item for item in current["conditions"] if "MTU differs" in item]
        assert len(fabric) == 1, current["conditions"]
        assert "spark-head enp1s0f1np1 9000, spark-worker enp1s0f1np1 1500" in fabric[0]
        planned = json.loads(looping.reconciler("plan", "--json", check=False).stdout)
        hint = next(b for b in planned["blockers"] if b["component"] == "ranks")["hint"]
        assert "set MTU 9000 on every fabric interface" in hint, hint
        assert "ranks.start" not in {action["step"] for action in planned["actions"]}
        assert looping.container_id(WORKER, "dsv41-r1") == r1, "not restarted"
        assert "fabric is broken" in str(current["loop"]["condition"]), current["loop"]
    finally:
        looping.testbed.fabric_mtu(WORKER, 9000)
    wait_for(looping, healthy(looping), 180, "the MTU agrees again -> serving")
    assert looping.plan_exit() == 0


def test_a_reboot_of_the_worker_is_named_as_the_cause_of_the_repair(settled: Bed) -> None:
    """Every process of the worker dies at once (dockerd and the rank with it) and comes back
    with a new boot id: the loop says the worker rebooted, files the incident as a reboot, and
    serves again."""
    looping = settled
    log = looping.spec.parent / "loop.log"
    seen = len(log.read_text(encoding="utf-8"))
    before = {item["id"] for item in incidents(looping)}
    repaired_after(looping, lambda: looping.testbed.reboot(WORKER), "a reboot of the worker", timeout=240)
    lines = log.read_text(encoding="utf-8")[seen:]
    assert "spark-worker rebooted since the last pass (boot id" in lines, lines[-3000:]
    assert "cause: dsv41-r1 on spark-worker: spark-worker rebooted since it started (boot id" in lines, lines[-3000:]
    recorded = [item for item in incidents(looping) if item["id"] not in before]
    assert [item["kind"] for item in recorded] == ["reboot"], recorded


def test_a_kv_bytes_increase_beyond_the_recorded_headroom_is_blocked_with_the_numbers(settled: Bed) -> None:
    """Both guards have recorded the running config for longer than memguard.record_s: an edit
    that adds 64 GiB of KV cache per rank is predicted far under the floor, and held as one
    blocker per node with the numbers; `--accept-memory-risk` would restart."""
    looping = settled
    good = looping.spec.read_text(encoding="utf-8")
    wait_until(lambda: all(recorded_s(looping, node) >= 24 for node in (HEAD, WORKER)), 60, "24 s recorded")
    r0 = looping.container_id(HEAD, "dsv41-r0")
    command = json.loads(looping.node(HEAD, "docker", "inspect", "--format", "{{json .Config.Cmd}}", "dsv41-r0").stdout)
    old = int(command[command.index("--kv-cache-memory-bytes") + 1])
    new = old + 64 * 1024**3
    looping.spec.write_text(good.replace("serving:\n", f"serving:\n  kv_bytes: {new}\n", 1), encoding="utf-8")
    try:
        wait_for(looping, lambda s: "predicted" in str(s["loop"]["condition"]), 60, "the edit blocked on memory")
        planned = json.loads(looping.reconciler("plan", "--json", check=False).stdout)
        memory = [b for b in planned["blockers"] if b["message"].startswith("memory on")]
        assert {b["node"] for b in memory} == {HEAD, WORKER}, planned["blockers"]
        for blocker in memory:
            assert f"kv_bytes {old} -> {new}; lowest MemAvailable under the running config" in blocker["message"]
            assert "(-64.0 GiB): under the guard's floor 0.5 GiB + 1 GiB margin" in blocker["message"], blocker
            assert "--accept-memory-risk" in blocker["hint"]
        assert "ranks.start" not in {action["step"] for action in planned["actions"]}
        risky = json.loads(looping.reconciler("plan", "--json", "--accept-memory-risk", check=False).stdout)
        assert "ranks.start" in {action["step"] for action in risky["actions"]}
        assert looping.container_id(HEAD, "dsv41-r0") == r0, "held, not restarted"
    finally:
        looping.spec.write_text(good, encoding="utf-8")
    wait_for(looping, healthy(looping), 120, "the edit undone")
    assert looping.container_id(HEAD, "dsv41-r0") == r0


def recorded_s(bed: Bed, node: str) -> float:
    """How long the node's guard has recorded its running rank (memguard.record.json)."""
    rank = "dsv41-r0" if node == HEAD else "dsv41-r1"
    label = '{{index .Config.Labels "io.spark-reconciler.config-hash"}}'
    config = bed.node(node, "docker", "inspect", "--format", label, rank).stdout.strip()
    found = bed.node(node, "cat", "/srv/spark/state/memguard.record.json", check=False)
    if found.returncode != 0:
        return 0.0
    record = json.loads(found.stdout)
    window = float(record["window_samples"] * record["interval_s"])
    windows: list[dict[str, Any]] = record["windows"]
    return window * sum(1 for entry in windows if entry["ranks"] == [config])
