"""Memory you can plan with: the guard's record, and what the plan predicts from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconciler.actions import StartRank
from reconciler.facts.memory import KIB_PER_GIB, GuardFacts, MemoryWindow, memory_windows
from reconciler.facts.node import Facts, load_facts
from reconciler.plan import Plan, plan
from reconciler.spec import Deployment
from tests.scenarios import CONVERGED_FACTS, reference_deployment, with_node, with_serving

HEAD, WORKER = "spark-head", "spark-worker"
GB = 10**9


def running_hash(facts: Facts, node: str) -> str:
    rank = next(c for c in facts.nodes[node].containers if c.name.startswith("dsv41-r"))
    return rank.labels["io.spark-reconciler.config-hash"]


def recorded(low_gib: dict[str, float], minutes: int = 20, facts: Facts | None = None) -> Facts:
    """Converged facts whose guards recorded `minutes` one-minute windows of the running config,
    the lowest at `low_gib` per node."""
    facts = facts or load_facts(CONVERGED_FACTS)
    for node, low in low_gib.items():
        config = running_hash(facts, node)
        windows = [
            MemoryWindow(at=1_000 + 60 * n, low_kib=int((low + (n % 3)) * KIB_PER_GIB), ranks=[config])
            for n in range(minutes)
        ]
        facts = with_node(
            facts, node, guard=facts.nodes[node].guard.model_copy(update={"windows": windows, "window_s": 60.0})
        )
    return facts


def kv_bytes(value: int) -> Deployment:
    return with_serving(reference_deployment(), kv_bytes=value)


def starts(result: Plan) -> list[str]:
    return [a.node for a in result.actions if isinstance(a.payload, StartRank)]


def test_a_kv_bytes_increase_beyond_the_recorded_headroom_is_blocked_with_the_numbers() -> None:
    facts = recorded({HEAD: 3.0, WORKER: 6.0})
    result = plan(kv_bytes(4_700_000_000), facts)
    assert starts(result) == [], "no restart into a config the record says will trip the guard"
    (blocker,) = [b for b in result.blockers if b.component == "ranks"]
    assert blocker.node == HEAD
    assert blocker.message == (
        "memory on spark-head: kv_bytes 2700000000 -> 4700000000; lowest MemAvailable under the running config "
        "3.0 GiB (over 20 min), predicted 1.1 GiB (-1.9 GiB): under the guard's floor 1 GiB + 1 GiB margin"
    )
    assert "--accept-memory-risk" in blocker.hint
    worker = [note for note in result.notes if note.startswith("memory on spark-worker")]
    assert worker == [
        "memory on spark-worker: kv_bytes 2700000000 -> 4700000000; lowest MemAvailable under the running config "
        "6.0 GiB (over 20 min), predicted 4.1 GiB (-1.9 GiB)"
    ]


def test_accepting_the_risk_restarts_and_says_so() -> None:
    result = plan(kv_bytes(4_700_000_000), recorded({HEAD: 3.0, WORKER: 6.0}), accept_memory_risk=True)
    assert starts(result) == [WORKER, HEAD]
    assert not [b for b in result.blockers if b.component == "ranks"]
    assert any(note.endswith("accepted with --accept-memory-risk") for note in result.notes), result.notes


def test_a_decrease_shows_the_prediction_and_restarts() -> None:
    result = plan(kv_bytes(1_700_000_000), recorded({HEAD: 3.0, WORKER: 3.0}))
    assert starts(result) == [WORKER, HEAD]
    assert "predicted 3.9 GiB (+0.9 GiB)" in result.notes[0]


def test_a_record_too_short_or_of_another_config_predicts_nothing_and_blocks_nothing() -> None:
    short = recorded({HEAD: 0.5, WORKER: 0.5}, minutes=5)
    result = plan(kv_bytes(40_000_000_000), short)
    assert starts(result) == [WORKER, HEAD]
    assert "no prediction: the guard's record holds 5.0 of the 15 minutes" in result.notes[0]
    facts = load_facts(CONVERGED_FACTS)
    other = [MemoryWindow(at=n, low_kib=KIB_PER_GIB // 2, ranks=["v2:another"]) for n in range(30)]
    restarted = [MemoryWindow(at=n, low_kib=KIB_PER_GIB // 2, ranks=[]) for n in range(30)]
    facts = with_node(facts, HEAD, guard=GuardFacts(windows=[*other, *restarted], window_s=60.0))
    assert "holds 0 of the 15 minutes" in plan(kv_bytes(40_000_000_000), facts).notes[0]


def test_max_num_seqs_keeps_the_pool_and_says_what_it_cannot_tell() -> None:
    result = plan(with_serving(reference_deployment(), max_num_seqs=4), recorded({HEAD: 3.0, WORKER: 3.0}))
    assert starts(result) == [WORKER, HEAD]
    assert "predicted 3.0 GiB (+0.0 GiB); max_num_seqs change activation and CUDA-graph memory" in result.notes[0]


def test_gpu_util_with_kv_bytes_pinned_moves_only_the_start_check() -> None:
    result = plan(with_serving(reference_deployment(), gpu_util=0.95), recorded({HEAD: 3.0, WORKER: 3.0}))
    assert "gpu_util with kv_bytes set moves only vLLM's start-up check" in result.notes[0]
    assert starts(result)


def test_an_unplanned_restart_is_never_judged() -> None:
    from tests.scenarios import with_container

    facts = with_container(recorded({HEAD: 0.1, WORKER: 0.1}), WORKER, status="exited", exit_code=1)
    result = plan(reference_deployment(), facts)
    assert starts(result) == [WORKER, HEAD]
    assert not result.notes


# ---------------------------------------------------------------- the record as read and written


def test_the_record_file_reads_only_what_the_guard_writes() -> None:
    good = {"at": 1, "low_kib": 1024, "ranks": ["v2:a"]}
    raw = {"window_samples": 60, "interval_s": 1.0, "windows": [good, {"at": "x"}, 7, {**good, "low_kib": -1}]}
    windows, window_s = memory_windows(raw)
    assert [w.low_kib for w in windows] == [1024]
    assert window_s == 60.0
    assert memory_windows({"window_samples": 60, "interval_s": 1e9, "windows": [good]})[1] is None
    assert memory_windows("not a record") == ([], None)
    many = memory_windows({"window_samples": 1, "interval_s": 1, "windows": [good] * 10_000})[0]
    assert len(many) == 240


def test_the_guard_records_each_windows_low_and_the_configs_that_ran_through_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reconciler.nodeside import memguard

    (tmp_path / "memguard.json").write_text(json.dumps({"floor_gib": 0.5, "labels": [], "interval_s": 1.0}))
    guard = memguard.Guard(str(tmp_path))
    running = [["v2:a"]]
    monkeypatch.setattr(memguard, "rank_configs", lambda _labels: running[0])
    monkeypatch.setattr(memguard, "WINDOW_SAMPLES", 3)
    for count, available in enumerate([9.0, 5.0, 7.0, 8.0, 4.0, 6.0, 9.0]):
        if count == 4:
            running[0] = ["v2:b"]  # a restart onto another config during the second window
        guard.remember(count, available)
    record = json.loads((tmp_path / "memguard.record.json").read_text())
    assert [(w["low_kib"], w["ranks"]) for w in record["windows"]] == [
        (5 * KIB_PER_GIB, ["v2:a"]),
        (4 * KIB_PER_GIB, []),
    ]
    assert record["window_samples"] == 3
    assert oct((tmp_path / "memguard.record.json").stat().st_mode & 0o777) == "0o600"


def test_a_failing_record_never_keeps_the_guard_from_its_floor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Docker answers the record's question with an error: the guard still kills below the floor."""
    from reconciler.nodeside import memguard

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 125000000 kB\nMemAvailable: 100000 kB\n")
    config = {"floor_gib": 0.5, "labels": [], "interval_s": 1.0, "meminfo": str(meminfo)}
    (tmp_path / "memguard.json").write_text(json.dumps(config))
    guard = memguard.Guard(str(tmp_path))
    killed: list[bool] = []

    def refuse(_labels: list[str]) -> list[str]:
        raise AttributeError("'str' object has no attribute 'get'")

    monkeypatch.setattr(memguard, "rank_configs", refuse)

    def kill(_labels: list[str]) -> list[str]:
        killed.append(True)
        return ["dsv41-r0"]

    monkeypatch.setattr(memguard, "kill_ranks", kill)
    guard.tick(0)
    assert killed == [True]
    assert (tmp_path / "memguard.trip.json").exists()
    assert "memory record: AttributeError" in (tmp_path / "memguard.log").read_text()


def test_a_saved_plan_with_a_prediction_stays_current_while_the_record_grows() -> None:
    from reconciler import savedplan

    deployment = kv_bytes(1_700_000_000)
    before = recorded({HEAD: 3.0, WORKER: 3.0}, minutes=20)
    saved = savedplan.saved(plan(deployment, before), deployment, before)
    later = recorded({HEAD: 2.5, WORKER: 3.0}, minutes=21)
    savedplan.check_current(saved, deployment, later, Path("plan.json"), plan(deployment, later))


def test_kv_bytes_set_on_one_side_only_predicts_nothing() -> None:
    """The upstream profile renders no --kv-cache-memory-bytes: the pool then follows gpu_util x
    MemTotal, which the record of a pinned pool cannot turn into a number."""
    result = plan(with_serving(reference_deployment(), profile="upstream"), recorded({HEAD: 3.0, WORKER: 3.0}))
    memory = [note for note in result.notes if note.startswith("memory on spark-head")]
    assert memory, result.notes
    assert "no prediction: kv_bytes set on one side only" in memory[0]
    assert not [b for b in result.blockers if b.message.startswith("memory on")]


def test_a_rank_that_fails_while_a_risky_edit_waits_is_not_restarted_onto_it() -> None:
    from tests.scenarios import with_container

    facts = with_container(recorded({HEAD: 3.0, WORKER: 3.0}), WORKER, status="exited", exit_code=1)
    result = plan(kv_bytes(4_700_000_000), facts)
    assert starts(result) == [], "the start would be onto the edit the record says trips the guard"
    assert {b.node for b in result.blockers if b.message.startswith("memory on")} == {HEAD, WORKER}
