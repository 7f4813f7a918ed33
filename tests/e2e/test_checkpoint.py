"""The checkpoint on the testbed: corruption and loss are found and repaired file by file.

After a converge, each test damages one thing on one node and shows that the plan names it (or
the verify finds it and a new plan does), that apply re-fetches exactly that file (the Hub
stand-in's request log, inode checks), and that the plan is empty again. Each test converges
first (`converged`), so they run in any order.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from tests.e2e.conftest import Bed

pytestmark = pytest.mark.testbed

HEAD, WORKER = "spark-head", "spark-worker"
MODEL = "/srv/spark/models/DeepSeek-V4.1-Flash-Spark"
HUB_CONTROL = "http://198.19.0.1:5080/_standin"
SHARD = "model-00002-of-00006.safetensors"


def hub_log() -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{HUB_CONTROL}/log", timeout=10) as response:
        entries: list[dict[str, Any]] = json.loads(response.read())
    return entries


def fetched_files(since: int) -> list[str]:
    return sorted({str(e["file"]) for e in hub_log()[since:] if e["method"] == "GET" and e.get("file")})


def stat(bed: Bed, node: str) -> dict[str, str]:
    """inode and mtime of every model file: untouched files keep both."""
    script = f"cd {MODEL} && find . -path ./.cache -prune -o -type f -printf '%P %i %T@\\n'"
    lines = bed.node(node, "sh", "-c", script).stdout.splitlines()
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in lines}


def flip_byte_keep_mtime(bed: Bed, node: str, name: str) -> None:
    script = (
        "import os, sys; p = sys.argv[1]; st = os.stat(p)\n"
        "with open(p, 'r+b') as f:\n"
        "    f.seek(st.st_size // 2); b = f.read(1); f.seek(-1, 1); f.write(bytes([b[0] ^ 0xFF]))\n"
        "os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))\n"
    )
    bed.node(node, "python3", "-c", script, f"{MODEL}/{name}")


def test_parts_are_deleted_after_reassembly(converged: Bed) -> None:
    bed = converged
    parts = bed.node(HEAD, "sh", "-c", f"ls {MODEL} | grep -c '\\.part[0-9][0-9]$' || true").stdout.strip()
    assert parts == "0", "parts are deleted after reassembly (keep_parts: false)"


def test_second_apply_does_no_checkpoint_work(converged: Bed) -> None:
    bed = converged
    since = len(hub_log())
    result = bed.reconciler("apply", "--yes")
    assert "No changes." in result.stdout
    assert fetched_files(since) == []


def test_a_flipped_byte_on_the_worker_is_found_by_deep_verify_and_only_that_file_recopied(converged: Bed) -> None:
    bed = converged
    flip_byte_keep_mtime(bed, WORKER, SHARD)
    assert bed.plan_exit() == 0, "size, mtime and inode unchanged: the hash cache cannot see it"
    before = stat(bed, WORKER)
    result = bed.reconciler("apply", "--yes", "--deep-verify")
    assert f"sha256 differs from the manifest's and the Hub's: {SHARD}: planned again" in result.stderr
    assert "copy 1 files" in result.stdout, "the new plan, shown like the first, copies that file alone"
    after = stat(bed, WORKER)
    changed = sorted(name for name in before if before[name] != after.get(name))
    assert changed == [SHARD]
    assert bed.plan_exit() == 0


def test_a_changed_mtime_is_rehashed_by_the_normal_pass_and_nothing_fetched(converged: Bed) -> None:
    bed = converged
    bed.node(HEAD, "touch", f"{MODEL}/{SHARD}")
    planned = bed.reconciler("plan").stdout
    assert "checkpoint on spark-head: verify" in planned
    assert SHARD in planned
    since = len(hub_log())
    bed.reconciler("apply", "--yes")
    assert fetched_files(since) == []
    assert bed.plan_exit() == 0


def test_a_corrupted_shard_on_the_head_is_refetched_alone_from_the_hub(converged: Bed) -> None:
    bed = converged
    flip_byte_keep_mtime(bed, HEAD, SHARD)
    bed.node(HEAD, "touch", f"{MODEL}/{SHARD}")
    since = len(hub_log())
    bed.reconciler("apply", "--yes")
    assert fetched_files(since) == [SHARD]
    assert bed.plan_exit() == 0


def test_a_missing_reassembled_shard_is_fetched_as_parts_and_reassembled(converged: Bed) -> None:
    bed = converged
    shard = "model-00006-of-00006.safetensors"
    bed.node(HEAD, "rm", f"{MODEL}/{shard}")
    planned = bed.reconciler("plan").stdout
    assert "reassemble model-00006-of-00006.safetensors" in planned
    since = len(hub_log())
    bed.reconciler("apply", "--yes")
    fetched = fetched_files(since)
    assert fetched
    assert all(name.startswith(f"{shard}.part") for name in fetched)
    assert bed.plan_exit() == 0


def test_a_hub_sourced_worker_fetches_its_own_missing_file(converged: Bed) -> None:
    bed = converged
    original = bed.spec.read_text(encoding="utf-8")
    bed.spec.write_text(original.replace("    model_source: peer\n", "    model_source: hub\n"), encoding="utf-8")
    try:
        bed.node(WORKER, "rm", f"{MODEL}/{SHARD}")
        head_before = stat(bed, HEAD)
        planned = bed.reconciler("plan").stdout
        assert "checkpoint on spark-worker: download 1 files" in planned
        since = len(hub_log())
        result = bed.reconciler("apply", "--yes")
        assert "1 files fetched by spark-worker itself" in result.stderr
        assert fetched_files(since) == [SHARD]
        assert stat(bed, HEAD) == head_before
        assert bed.plan_exit() == 0
    finally:
        bed.spec.write_text(original, encoding="utf-8")
