"""The owner's lifecycle on the testbed: a new key, what fills the disks, a reconciler upgrade
held under the loop, and the way out (uninstall, then uninstall with the checkpoint).

Each test converges first when it needs a serving group (`converged`), so they run in any
order; the uninstall test leaves nothing deployed, and the next test converges again.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT, STATE_DIR, Bed, loop_processes, loop_status, wait_until

pytestmark = pytest.mark.testbed

HEAD, WORKER = "spark-head", "spark-worker"
MODEL = "/srv/spark/models/DeepSeek-V4.1-Flash-Spark"
OURS = "label=io.spark-reconciler.owner=spark-reconciler"
# The rendering a newer reconciler would bring: one more variable in every rank's environment.
RENDERED_BEFORE = '        "VLLM_HOST_IP": fabric.ip,\n'
RENDERED_AFTER = RENDERED_BEFORE + '        "RENDERED_BY_A_NEWER_RECONCILER": "1",\n'


def ranks(bed: Bed) -> dict[str, str]:
    return {node: bed.container_id(node, f"dsv41-r{0 if node == HEAD else 1}") for node in (HEAD, WORKER)}


def ask(bed: Bed, key: str, path: str = "/v1/models") -> int:
    """The HTTP status the front answers a request with this key."""
    script = (
        "import sys, urllib.request, urllib.error\n"
        "req = urllib.request.Request('http://127.0.0.1:8000' + sys.argv[1],"
        " headers={'Authorization': 'Bearer ' + sys.stdin.read().strip()})\n"
        "try:\n    print(urllib.request.urlopen(req, timeout=30).status)\n"
        "except urllib.error.HTTPError as error:\n    print(error.code)\n"
    )
    return int(bed.testbed.exec(HEAD, ["python3", "-c", script, path], input_text=key, check=True).stdout)


def test_rotate_key_changes_the_key_the_front_accepts_and_leaves_the_ranks_serving(converged: Bed) -> None:
    bed = converged
    old_key, before = bed.api_key(), ranks(bed)
    front = bed.container_id(HEAD, "dsv41-front")
    piped = bed.reconciler("rotate-key", check=False)
    assert piped.returncode == 1
    assert "nobody to ask (stdin is not a terminal)" in piped.stderr
    assert bed.api_key() == old_key
    rotated = bed.reconciler("rotate-key", "--yes")
    new_key = bed.api_key()
    assert new_key not in ("", old_key)
    assert len(new_key) == 43
    assert bed.node(HEAD, "stat", "-c", "%a", f"{STATE_DIR}/api_key").stdout.strip() == "600"
    assert "The front took it; the ranks kept serving." in rotated.stdout
    assert f'export DSV41_API_KEY="$(cat {STATE_DIR}/api_key)"' in rotated.stdout
    assert new_key not in rotated.stdout + rotated.stderr
    assert ranks(bed) == before
    assert bed.container_id(HEAD, "dsv41-front") not in ("", front)
    assert ask(bed, new_key) == 200
    assert ask(bed, old_key) == 401
    assert bed.plan_exit() == 0


def test_storage_shows_what_is_ours_and_releases_only_what_is_safe(converged: Bed) -> None:
    bed = converged
    served = bed.node(WORKER, "readlink", "-f", MODEL).stdout.strip()
    stale = f"{MODEL}@{'e' * 40}"
    bed.node(WORKER, "sh", "-c", f"mkdir -p {stale} && head -c 3000000 /dev/urandom > {stale}/old.safetensors")
    report = json.loads(bed.reconciler("storage", "--json").stdout)
    by_what = {(item["node"], item["what"]): item for item in report["items"]}
    assert by_what[(WORKER, served)]["status"] == "served"
    assert not by_what[(WORKER, served)]["releasable"]
    assert by_what[(WORKER, stale)]["releasable"]
    assert by_what[(WORKER, stale)]["freed"] >= 3_000_000
    assert [item["what"] for item in report["items"] if item["releasable"]] == [stale]
    assert {item["kind"] for item in report["items"]} >= {"revision", "state", "cache"}
    text = bed.reconciler("storage").stdout
    assert "Safe to release: 1 item" in text
    assert "not served, not kept: safe to release" in text
    refused = bed.reconciler("storage", "--release", check=False)
    assert refused.returncode == 1
    assert bed.node(WORKER, "test", "-d", stale, check=False).returncode == 0
    released = bed.reconciler("storage", "--release", "--yes").stdout
    assert "Released 1 of 1" in released
    assert bed.node(WORKER, "test", "-d", stale, check=False).returncode == 1
    assert bed.node(WORKER, "readlink", "-f", MODEL).stdout.strip() == served
    assert bed.plan_exit() == 0


@contextmanager
def newer_reconciler(tmp: Path) -> Iterator[dict[str, str]]:
    """This reconciler with a changed rendering, as the next release might ship it: the
    environment (PYTHONPATH) that runs it instead of the installed one."""
    copy = tmp / "newer"
    shutil.copytree(ROOT / "reconciler", copy / "reconciler", ignore=shutil.ignore_patterns("__pycache__"))
    serving = copy / "reconciler/serving.py"
    text = serving.read_text(encoding="utf-8")
    assert RENDERED_BEFORE in text, "serving.py: rank_env's last line moved"
    serving.write_text(text.replace(RENDERED_BEFORE, RENDERED_AFTER), encoding="utf-8")
    yield {"PYTHONPATH": str(copy)}


def newer_argv(bed: Bed, env: dict[str, str], *args: str) -> list[str]:
    """The newer reconciler's command line (-P: this checkout, the working directory, must not
    come before PYTHONPATH's copy)."""
    python = str(ROOT / ".venv/bin/python")
    return ["env", f"PYTHONPATH={env['PYTHONPATH']}", python, "-P", "-m", "reconciler", *args, "--spec", str(bed.spec)]


def newer(bed: Bed, env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = bed.testbed.exec(HEAD, newer_argv(bed, env, *args), check=False, timeout=600)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_a_reconciler_upgrade_is_held_under_the_loop_until_apply(converged: Bed, tmp_path: Path) -> None:
    bed = converged
    before = ranks(bed)
    with newer_reconciler(tmp_path) as env:
        argv = bed.testbed.exec_argv(HEAD, newer_argv(bed, env, "run"))
        log = tmp_path / "loop.log"
        with log.open("w", encoding="utf-8") as out:
            loop = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_until(lambda: bool(loop_status(bed).get("last_pass")), 120, "the newer loop's first pass")
            wait_until(lambda: "renders the ranks differently" in json.dumps(loop_status(bed)), 60, "the hold's note")
            status = newer(bed, env, "status", check=False)
            assert status.returncode == 0, status.stdout + status.stderr
            assert "this reconciler renders the ranks differently" in status.stdout
            assert "`reconciler apply` restarts it onto this version" in status.stdout
            plan = newer(bed, env, "plan", check=False).stdout
            assert "config changed by a reconciler upgrade" in plan
            assert ranks(bed) == before, "the loop restarted the group by itself"
        finally:
            os.killpg(loop.pid, signal.SIGTERM)
            loop.wait(timeout=60)
            wait_until(lambda: not loop_processes(bed), 30, "the newer loop gone")
            sys.stderr.write(log.read_text(encoding="utf-8")[-3000:])
        newer(bed, env, "apply", "--yes")
        after = ranks(bed)
        assert all(after[node] not in ("", before[node]) for node in after)
        env_of_r1 = bed.node(WORKER, "docker", "inspect", "--format", "{{json .Config.Env}}", "dsv41-r1").stdout
        assert "RENDERED_BY_A_NEWER_RECONCILER=1" in env_of_r1
        assert newer(bed, env, "plan", "--detailed-exitcode", check=False).returncode == 0


def ours_on(bed: Bed, node: str) -> dict[str, str]:
    """What of ours the node holds: containers, the guard process, the state dir, our images."""
    containers = bed.node(node, "docker", "ps", "-aq", "--filter", OURS).stdout.strip()
    guard = bed.node(node, "sh", "-c", f"pgrep -f '{STATE_DIR}/[m]emguard.py' || true").stdout.strip()
    state = bed.node(node, "sh", "-c", f"ls -A {STATE_DIR} 2>/dev/null || true").stdout.strip()
    return {"containers": containers, "guard": guard, "state": state}


def test_uninstall_leaves_only_the_checkpoint_then_with_the_flag_nothing(converged: Bed) -> None:
    bed = converged
    engine = str(bed.testbed.images()["engine"])
    # The worker's image pulled by the reconciler itself (the testbed preloads it): ours to remove.
    bed.reconciler("stop")
    bed.node(WORKER, "docker", "rm", "-f", "dsv41-r1")
    bed.node(WORKER, "docker", "image", "rm", engine)
    bed.reconciler("start")
    assert bed.plan_exit() == 0
    dry = bed.reconciler("uninstall", "--dry-run").stdout
    for line in (
        f"{HEAD}: container dsv41-r0",
        f"{HEAD}: container dsv41-front",
        f"{WORKER}: container dsv41-r1",
        f"{WORKER}: guard memory guard",
        f"{WORKER}: image 198.19.0.1:5000/tb/engine@sha256:",
        f"{WORKER}: state {STATE_DIR}",
        f"kept: {HEAD}: checkpoint {MODEL}",
        f"kept: {HEAD}: image 198.19.0.1:5000/tb/engine@sha256:",
    ):
        assert line in dry, dry
    assert all(ours_on(bed, node)["containers"] for node in (HEAD, WORKER)), "a dry run removes nothing"
    refused = bed.reconciler("uninstall", check=False)
    assert refused.returncode == 1
    assert "nobody to ask" in refused.stderr
    bed.reconciler("uninstall", "--yes")
    for node in (HEAD, WORKER):
        assert ours_on(bed, node) == {"containers": "", "guard": "", "state": ""}, node
        assert bed.node(node, "test", "-d", f"{MODEL}/", check=False).returncode == 0, "the checkpoint is kept"
    assert bed.node(WORKER, "docker", "image", "inspect", engine, check=False).returncode != 0
    assert bed.node(HEAD, "docker", "image", "inspect", engine, check=False).returncode == 0, "not ours: kept"
    again = bed.reconciler("uninstall", "--yes").stdout
    assert again.startswith("Nothing to remove"), again
    assert all(ours_on(bed, node)["state"] == "" for node in (HEAD, WORKER)), "a second uninstall leaves no trace"
    bed.reconciler("uninstall", "--checkpoint", "--yes")
    for node in (HEAD, WORKER):
        listing = bed.node(node, "sh", "-c", f"ls -d {MODEL}* 2>/dev/null || true").stdout.strip()
        assert listing == "", (node, listing)
        assert ours_on(bed, node) == {"containers": "", "guard": "", "state": ""}, node
    last = bed.reconciler("uninstall", "--checkpoint", "--json")
    assert json.loads(last.stdout)["remove"] == []
