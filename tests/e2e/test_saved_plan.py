"""`plan --out FILE` then `apply FILE` on the testbed: exactly the printed actions run, and a
plan made stale by a rank killed in between is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import Bed

pytestmark = pytest.mark.testbed

WORKER = "spark-worker"


def saved_actions(path: Path) -> list[dict[str, object]]:
    actions: list[dict[str, object]] = json.loads(path.read_text(encoding="utf-8"))["plan"]["actions"]
    return actions


def test_apply_of_a_saved_plan_runs_exactly_its_actions(bed: Bed, tmp_path: Path) -> None:
    bed.fresh()  # the whole bring-up as the saved plan
    path = tmp_path / "bring-up.json"
    printed = bed.reconciler("plan", "--out", str(path))
    planned = saved_actions(path)
    assert len(planned) > 10
    for action in planned:
        assert str(action["summary"]) in printed.stdout
    applied = bed.reconciler("apply", str(path), "--json")
    report = json.loads(applied.stdout)
    assert [step["id"] for step in report["applied"]["done"]] == [action["id"] for action in planned]
    assert report["plan"]["actions"] == planned, "the actions run are the saved ones, payloads included"
    assert report["ok"]
    assert bed.plan_exit() == 0


def test_a_saved_plan_is_refused_when_a_rank_died_in_between(converged: Bed, tmp_path: Path) -> None:
    bed = converged
    bed.node(WORKER, "sh", "-c", "kill $(cat /srv/spark/state/memguard.pid)")
    path = tmp_path / "guard.json"
    bed.reconciler("plan", "--out", str(path))
    assert [action["id"] for action in saved_actions(path)] == ["memguard.start@spark-worker"]
    bed.node(WORKER, "docker", "kill", "dsv41-r1")
    refused = bed.reconciler("apply", str(path), check=False)
    assert refused.returncode == 1
    assert "is stale" in refused.stderr
    assert "spark-worker containers" in refused.stderr
    assert f"reconciler plan --spec {bed.spec.resolve()} --out {path}" in refused.stderr, "the plan names its spec"
    guard = bed.node(WORKER, "sh", "-c", "kill -0 $(cat /srv/spark/state/memguard.pid) 2>/dev/null", check=False)
    assert guard.returncode != 0, "nothing may run from a stale plan: the worker's guard is still down"
    bed.reconciler("apply", "--yes")
    assert bed.plan_exit() == 0
