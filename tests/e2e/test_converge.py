"""Converge a two-node deployment on the testbed for real, then change it, stop it, start it.

Tests in this module build on each other in file order (one testbed, one deployment), the
way an operator's day goes: bring-up, idempotence, an edit, a stop and a start.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from tests.e2e.conftest import Bed

pytestmark = pytest.mark.testbed

HEAD, WORKER = "spark-head", "spark-worker"


def chat(bed: Bed, key: str, prompt: str) -> Any:
    """A completion through the API, sent from inside the head like a local client."""
    body = json.dumps({"model": "deepseek-v4.1-flash", "messages": [{"role": "user", "content": prompt}]})
    script = (
        "import sys, urllib.request\n"
        "req = urllib.request.Request('http://127.0.0.1:8000/v1/chat/completions', data=sys.argv[1].encode(),"
        " headers={'Authorization': 'Bearer ' + sys.stdin.read().strip(), 'Content-Type': 'application/json'})\n"
        "print(urllib.request.urlopen(req, timeout=30).read().decode())\n"
    )
    result = bed.testbed.exec(HEAD, ["python3", "-c", script, body], input_text=key, check=True)
    return json.loads(result.stdout)


def events(bed: Bed, node: str, since: float) -> list[tuple[float, str, str]]:
    """(time, action, container) of our containers' lifecycle events on a node since `since`."""
    argv = ["docker", "events", "--since", f"{since:.3f}", "--until", f"{time.time():.3f}", "--format", "{{json .}}"]
    argv += ["--filter", "type=container", "--filter", "label=io.spark-reconciler.owner=spark-reconciler"]
    found = []
    for line in bed.node(node, *argv).stdout.splitlines():
        event = json.loads(line)
        found.append((event["timeNano"] / 1e9, event["Action"], event["Actor"]["Attributes"]["name"]))
    return found


def first(found: list[tuple[float, str, str]], action: str, name: str) -> float:
    return min(at for at, kind, who in found if kind == action and who == name)


def test_converges_from_empty(bed: Bed) -> None:
    # The testbed pre-pulls the engine image; remove it on the worker so the pull is ours.
    image_id = bed.node(WORKER, "docker", "image", "inspect", "--format", "{{.Id}}", engine_ref(bed)).stdout.strip()
    bed.node(WORKER, "docker", "rmi", "-f", image_id)
    planned = bed.reconciler("plan").stdout
    assert "image on spark-worker: pull" in planned
    assert "image on spark-head" not in planned
    started = time.monotonic()
    result = bed.reconciler("apply")
    print(f"converged from empty in {time.monotonic() - started:.1f} s")
    assert "Apply complete" in result.stdout
    assert "start dsv41-r1" in result.stdout
    for node in (HEAD, WORKER):
        state = bed.docker_json(node, "inspect", "--format", "{{json .State}}", f"dsv41-r{0 if node == HEAD else 1}")
        assert isinstance(state, dict)
        assert state["Running"] is True


def test_plan_is_empty_after_apply(bed: Bed) -> None:
    assert bed.plan_exit() == 0


def engine_ref(bed: Bed) -> str:
    return str(bed.testbed.images()["engine"])


def test_ranks_get_a_stop_timeout_well_above_docker_default(bed: Bed) -> None:
    timeout = bed.node(HEAD, "docker", "inspect", "--format", "{{.Config.StopTimeout}}", "dsv41-r0").stdout.strip()
    assert int(timeout) >= 30


def test_a_wrong_key_mode_is_fixed_and_the_key_kept(bed: Bed) -> None:
    key = bed.api_key()
    bed.node(HEAD, "chmod", "0644", "/srv/spark/state/api_key")
    planned = bed.reconciler("plan").stdout
    assert "apikey on spark-head: set mode 0600" in planned
    assert "0644" in planned
    bed.reconciler("apply")
    assert bed.node(HEAD, "stat", "-c", "%a", "/srv/spark/state/api_key").stdout.strip() == "600"
    assert bed.api_key() == key
    assert bed.plan_exit() == 0


def test_the_api_answers_with_the_key_only(bed: Bed) -> None:
    key = bed.api_key()
    assert len(key) == 43
    answer = chat(bed, key, "What is 17 * 23? Answer with the number.")
    assert "391" in answer["choices"][0]["message"]["content"]
    denied = bed.testbed.exec(
        HEAD, ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "http://127.0.0.1:8000/v1/models"], check=False
    )
    assert denied.stdout == "401"


def test_key_file_is_private(bed: Bed) -> None:
    mode = bed.node(HEAD, "stat", "-c", "%a", "/srv/spark/state/api_key").stdout.strip()
    assert mode == "600"


def test_the_key_appears_nowhere(bed: Bed) -> None:
    key = bed.api_key()
    outputs = [
        bed.reconciler("plan").stdout,
        bed.reconciler("plan", "--json").stdout,
        bed.reconciler("status", "--json").stdout,
        bed.reconciler("logs", "r0", "--tail", "500").stdout,
        bed.reconciler("logs", "r1", "--tail", "500").stdout,
        bed.reconciler("logs", "memguard").stdout,
    ]
    for node in (HEAD, WORKER):
        outputs.append(bed.node(node, "sh", "-c", "docker inspect $(docker ps -aq)").stdout)
        outputs.append(bed.node(node, "sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '", check=False).stdout)
    for text in outputs:
        assert key not in text


def test_status_reports_nodes_health_and_memory(bed: Bed) -> None:
    report: Any = json.loads(bed.reconciler("status", "--json").stdout)
    assert report["converged"] is True
    assert report["health"] == 200
    for node in (HEAD, WORKER):
        assert report["nodes"][node]["reachable"] is True
        assert report["nodes"][node]["mem_available_gib"] > 0
        assert report["nodes"][node]["guard"]["running"] is True


def test_kv_bytes_edit_restarts_the_group_in_order(bed: Bed) -> None:
    original = bed.spec.read_text(encoding="utf-8")
    bed.spec.write_text(original.replace("serving:\n", "serving:\n  kv_bytes: 2000000000\n", 1), encoding="utf-8")
    try:
        planned = bed.reconciler("plan", "--detailed-exitcode", check=False)
        assert planned.returncode == 2
        assert planned.stdout.count("--kv-cache-memory-bytes 2700000000 -> 2000000000") >= 2
        assert "2 to replace" in planned.stdout
        since = time.time()
        started = time.monotonic()
        bed.reconciler("apply")
        print(f"group restart converged in {time.monotonic() - started:.1f} s")
        head_events, worker_events = events(bed, HEAD, since), events(bed, WORKER, since)
        assert first(head_events, "die", "dsv41-r0") < first(worker_events, "die", "dsv41-r1")
        assert first(worker_events, "start", "dsv41-r1") < first(head_events, "start", "dsv41-r0")
        assert bed.plan_exit() == 0
        command = bed.docker_json(HEAD, "inspect", "--format", "{{json .Config.Cmd}}", "dsv41-r0")
        assert isinstance(command, list)
        assert command[command.index("--kv-cache-memory-bytes") + 1] == "2000000000"
    finally:
        bed.spec.write_text(original, encoding="utf-8")
    bed.reconciler("apply")
    assert bed.plan_exit() == 0


def test_stop_holds_the_group_and_start_brings_it_back(bed: Bed) -> None:
    bed.reconciler("stop")
    for node, name in ((HEAD, "dsv41-r0"), (WORKER, "dsv41-r1")):
        running = bed.node(node, "docker", "inspect", "--format", "{{.State.Running}}", name).stdout.strip()
        assert running == "false"
    assert bed.plan_exit() == 0, "a held group is converged: nothing to start"
    status = json.loads(bed.reconciler("status", "--json").stdout)
    assert status["nodes"][HEAD]["hold"] is not None
    bed.reconciler("start")
    assert bed.plan_exit() == 0
    assert "391" in chat(bed, bed.api_key(), "What is 17 * 23?")["choices"][0]["message"]["content"]


def test_a_second_apply_does_nothing(bed: Bed) -> None:
    result = bed.reconciler("apply")
    assert "No changes." in result.stdout
    assert not re.search(r"Apply complete", result.stdout)


def test_a_rank_that_exits_fails_the_apply_fast_with_every_ranks_logs(bed: Bed) -> None:
    original = bed.spec.read_text(encoding="utf-8")
    broken = original.replace("  extra_env:\n", '  extra_env:\n    ENGINE_FAULT_EXIT_AFTER_S: "0.5"\n', 1)
    bed.spec.write_text(broken, encoding="utf-8")
    try:
        started = time.monotonic()
        failed = bed.reconciler("apply", check=False)
        elapsed = time.monotonic() - started
        print(f"failed apply reported after {elapsed:.1f} s")
        assert failed.returncode == 1
        assert "ranks on spark-head: wait until GET /v1/models" in failed.stderr
        assert "a rank exited" in failed.stderr
        assert "r0| " in failed.stderr
        assert "r1| " in failed.stderr
        assert elapsed < 120, "fail fast: far below the startup timeout"
    finally:
        bed.spec.write_text(original, encoding="utf-8")
    bed.reconciler("apply")
    assert bed.plan_exit() == 0
