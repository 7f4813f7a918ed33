"""The one converge path: the lock inside it, saved plans run as saved, questions before the
disruptive, and `stop` never acting while an `apply` does (a race, with real threads and the
real lock file; the nodes are replaced by facts and recording executors)."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import pytest

from reconciler import apply, commands, savedplan
from reconciler.actions import Action, Copy, Step, Verify
from reconciler.errors import ApplyError, FactsChangedError, LockBusyError, ReconcilerError, StalePlanError
from reconciler.execution import ApplyContext, Progress
from reconciler.facts.node import Facts, load_facts
from reconciler.lock import deployment_lock
from reconciler.plan import Plan, needs_confirmation, plan
from reconciler.spec import Deployment
from tests.scenarios import (
    COMMIT,
    CONVERGED_FACTS,
    converged_facts,
    empty_facts,
    reference_deployment,
    with_container,
    with_node,
    with_serving,
    with_tree_files,
)


@pytest.fixture
def deployment(tmp_path: Path) -> Deployment:
    """The reference spec with its state dir (and so its lock) under tmp_path."""
    return reference_deployment().model_copy(update={"state_dir": str(tmp_path / "state")})


class Nodes:
    """Stands in for gather and the executors: facts in order, executed actions recorded."""

    def __init__(self, *facts: Facts, gate: threading.Event | None = None) -> None:
        self.facts = list(facts)
        self.executed: list[str] = []
        # Each action waits here until the test opens it: a race a test sets up, not a sleep's luck.
        self.gate = gate
        self.inside = threading.Event()
        self.finished: dict[str, float] = {}

    def observe(self, _deployment: Deployment, _transports: object, _liveness: object, **_options: bool) -> Facts:
        return self.facts.pop(0) if len(self.facts) > 1 else self.facts[0]

    def executor(self, _action: Action) -> object:
        def run(_ctx: ApplyContext, action: Action) -> str:
            self.inside.set()
            if self.gate is not None:
                assert self.gate.wait(60), "the test never opened the gate"
            self.executed.append(action.id)
            self.finished[threading.current_thread().name] = time.monotonic()
            return "done"

        return run


@pytest.fixture
def nodes(monkeypatch: pytest.MonkeyPatch, deployment: Deployment) -> Nodes:
    fake = Nodes(empty_facts(), converged_facts(deployment))
    monkeypatch.setattr(commands, "observe", fake.observe)
    monkeypatch.setattr(apply, "executor_for", fake.executor)
    return fake


def in_batches(executed: list[str], actions: list[Action]) -> list[set[str]]:
    """The ids as run, batch by batch: the actions of one batch run at once, in any order."""
    run = iter(executed)
    return [{next(run) for _ in batch} for batch in apply.batches(actions)]


def as_planned(actions: list[Action]) -> list[set[str]]:
    return [{action.id for action in batch} for batch in apply.batches(actions)]


def converge(deployment: Deployment, request: commands.Converge) -> commands.ApplyOutcome:
    return commands.converge(deployment, {}, Progress(io.StringIO()), request)


def test_converge_plans_applies_every_action_and_plans_again(deployment: Deployment, nodes: Nodes) -> None:
    outcome = converge(deployment, commands.Converge(doing="test"))
    actions = list(outcome.before.actions)
    assert len(nodes.executed) == len(actions)
    assert in_batches(nodes.executed, actions) == as_planned(actions)
    assert not outcome.after.has_changes


def test_a_saved_plan_runs_exactly_as_saved(deployment: Deployment, nodes: Nodes, tmp_path: Path) -> None:
    saved = savedplan.saved(plan(deployment, empty_facts()), deployment, empty_facts())
    outcome = converge(deployment, commands.Converge(doing="test", saved=(saved, tmp_path / "p.json")))
    actions = list(saved.plan.actions)
    assert len(nodes.executed) == len(actions)
    assert in_batches(nodes.executed, actions) == as_planned(actions)
    assert outcome.before is saved.plan


def test_a_stale_saved_plan_is_refused_before_anything_runs(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    converged = load_facts(CONVERGED_FACTS)
    saved = savedplan.saved(plan(deployment, converged), deployment, converged)
    killed = Nodes(with_container(converged, "spark-worker", status="exited", exit_code=137))
    monkeypatch.setattr(commands, "observe", killed.observe)
    monkeypatch.setattr(apply, "executor_for", killed.executor)
    with pytest.raises(StalePlanError):
        converge(deployment, commands.Converge(doing="test", saved=(saved, tmp_path / "p.json")))
    assert killed.executed == []


def test_a_declined_question_applies_nothing(deployment: Deployment, nodes: Nodes) -> None:
    asked: list[list[str]] = []

    def decline(result: object) -> bool:
        asked.append(needs_confirmation(result))  # type: ignore[arg-type]
        return False

    outcome = converge(deployment, commands.Converge(doing="test", confirm=decline))
    assert outcome.declined
    assert nodes.executed == []
    assert asked == [["moves 920.0 GB"]]


def test_what_asks_first_a_group_restart_and_a_big_download_but_not_a_guard_start() -> None:
    converged = load_facts(CONVERGED_FACTS)
    restart = plan(with_serving(reference_deployment(), kv_bytes=2_000_000_000), converged)
    assert needs_confirmation(restart) == ["restarts or stops the rank group (the API goes down until it is back)"]
    assert needs_confirmation(plan(reference_deployment(), converged)) == []
    fresh = plan(reference_deployment(), empty_facts())
    assert needs_confirmation(fresh) == ["moves 920.0 GB"]  # downloaded once, copied once


def test_a_plan_with_only_blockers_is_an_error_for_apply_but_not_for_the_loop(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    facts = empty_facts()
    unreachable = {
        name: node.model_copy(update={"reachable": False, "error": "ssh: timed out"})
        for name, node in facts.nodes.items()
    }
    blocked = Nodes(facts.model_copy(update={"nodes": unreachable}))
    monkeypatch.setattr(commands, "observe", blocked.observe)
    with pytest.raises(ReconcilerError, match="timed out"):
        converge(deployment, commands.Converge(doing="test"))
    outcome = converge(deployment, commands.Converge(doing="test", blocked_is_error=False))
    assert outcome.before.blockers
    assert not outcome.result.done


def test_converge_takes_the_deployment_lock(deployment: Deployment, nodes: Nodes) -> None:
    with deployment_lock(deployment, "someone else"), pytest.raises(LockBusyError, match="someone else"):
        converge(deployment, commands.Converge(doing="test", wait_s=0))
    assert nodes.executed == []


def test_stop_never_acts_while_an_apply_does(deployment: Deployment, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race: `stop` starts while an apply is in its first action; its hold is written only
    after the apply's last action finished, and both complete. The apply's first action lasts
    until the stop says it waits for the lock."""
    stop_waits = threading.Event()
    racing = Nodes(empty_facts(), converged_facts(deployment), gate=stop_waits)
    monkeypatch.setattr(commands, "observe", racing.observe)
    monkeypatch.setattr(apply, "executor_for", racing.executor)
    held_at: list[float] = []
    waited: list[str] = []
    errors: list[BaseException] = []

    def apply_now() -> None:
        try:
            converge(deployment, commands.Converge(doing="reconciler apply"))
        except BaseException as exc:  # the assertion below reports it
            errors.append(exc)

    def on_wait(message: str) -> None:
        waited.append(message)
        stop_waits.set()

    applying = threading.Thread(target=apply_now, name="apply")
    applying.start()
    assert racing.inside.wait(60)
    stop = commands.Converge(
        doing="reconciler stop",
        wait_s=60,
        first=lambda _ctx: held_at.append(time.monotonic()),
        blocked_is_error=False,
        on_wait=on_wait,
    )
    converge(deployment, stop)
    applying.join(60)
    assert not applying.is_alive()
    assert not errors
    assert waited
    assert "reconciler apply" in waited[0]
    assert held_at
    assert held_at[0] >= racing.finished["apply"]


SHARD = "model-00002-of-00006.safetensors"


class FindsCorruptShards(Nodes):
    """Each verify named in `findings` (node, file), in turn, finds that file's bytes wrong once;
    everything else succeeds."""

    def __init__(self, *facts: Facts, findings: list[tuple[str, str]]) -> None:
        super().__init__(*facts)
        self.findings = findings

    def executor(self, action: Action) -> object:
        recorded = super().executor(action)

        def run(ctx: ApplyContext, current: Action) -> str:
            if self.findings and current.id == f"checkpoint.verify@{self.findings[0][0]}":
                node, name = self.findings.pop(0)
                raise FactsChangedError(f"{node}: sha256 differs: {name}", "plan again", node=node, files=[name])
            return recorded(ctx, current)  # type: ignore[operator, no-any-return]

        return run


class FindsOneCorruptShard(FindsCorruptShards):
    """The worker's verify finds SHARD's bytes wrong `times` times."""

    def __init__(self, *facts: Facts, times: int) -> None:
        super().__init__(*facts, findings=[("spark-worker", SHARD)] * times)


def corrupt_on_worker(deployment: Deployment, node: str = "spark-worker") -> Facts:
    """The converged deployment with SHARD's hash on the node found other than the Hub's."""
    converged = converged_facts(deployment)
    tree = converged.nodes[node].checkpoint.revisions[COMMIT].files[SHARD]
    return with_tree_files(converged, node, {SHARD: tree.model_copy(update={"sha256": "0" * 64})})


def test_a_verify_that_finds_bytes_wrong_ends_the_round_and_a_new_plan_repairs_them(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The executor only reports; the next plan (shown like the first) re-copies exactly that
    file and restarts the group that may have read it."""
    fake = FindsOneCorruptShard(
        empty_facts(), corrupt_on_worker(deployment), converged_facts(deployment), converged_facts(deployment), times=1
    )
    monkeypatch.setattr(commands, "observe", fake.observe)
    monkeypatch.setattr(apply, "executor_for", fake.executor)
    shown: list[Plan] = []
    outcome = converge(deployment, commands.Converge(doing="test", show=shown.append))
    first, second = shown
    round_one, round_two = fake.executed[: -len(second.actions)], fake.executed[-len(second.actions) :]
    assert "checkpoint.verify@spark-worker" not in round_one, "the failed verify is not done"
    assert not [step for step in round_one if step.startswith("ranks.")], "nothing after it ran"
    assert set(round_one) < {action.id for action in first.actions}
    assert sorted(round_two) == sorted(action.id for action in second.actions)
    copy = next(action for action in second.actions if action.step is Step.COPY)
    assert isinstance(copy.payload, Copy)
    assert (copy.node, copy.payload.files) == ("spark-worker", [SHARD])
    assert any(action.step is Step.STOP_RANK for action in second.actions), "the group may have read it"
    assert outcome.replanned is second
    assert not outcome.after.has_changes


def test_bytes_still_wrong_after_the_new_plan_fetched_them_again_fail_the_apply(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FindsOneCorruptShard(empty_facts(), corrupt_on_worker(deployment), times=2)
    monkeypatch.setattr(commands, "observe", fake.observe)
    monkeypatch.setattr(apply, "executor_for", fake.executor)
    with pytest.raises(ApplyError, match=f"sha256 differs: {SHARD}") as failed:
        converge(deployment, commands.Converge(doing="test"))
    assert "fetched them again and they still differ" in failed.value.hint


def test_a_saved_plan_whose_verify_finds_bytes_wrong_stops_there(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A saved plan runs as it was made: no plan of the reconciler's own follows it."""
    fake = FindsOneCorruptShard(empty_facts(), corrupt_on_worker(deployment), times=1)
    monkeypatch.setattr(commands, "observe", fake.observe)
    monkeypatch.setattr(apply, "executor_for", fake.executor)
    saved = savedplan.saved(plan(deployment, empty_facts()), deployment, empty_facts())
    shown: list[Plan] = []
    request = commands.Converge(doing="test", saved=(saved, tmp_path / "p.json"), show=shown.append)
    with pytest.raises(ApplyError, match=f"sha256 differs: {SHARD}") as failed:
        converge(deployment, request)
    assert "a saved plan runs as it was made" in failed.value.hint
    assert shown == [saved.plan]


def test_a_deep_verify_the_first_round_did_not_reach_is_deep_in_the_new_plan(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head's verify reports first, so the worker's was never read: the new plan reads it whole."""
    fake = FindsCorruptShards(
        empty_facts(),
        corrupt_on_worker(deployment, "spark-head"),
        converged_facts(deployment),
        findings=[("spark-head", SHARD)],
    )
    monkeypatch.setattr(commands, "observe", fake.observe)
    monkeypatch.setattr(apply, "executor_for", fake.executor)
    shown: list[Plan] = []
    converge(deployment, commands.Converge(doing="test", deep_verify=True, show=shown.append))
    deep = {action.node: action.payload.deep for action in shown[1].actions if isinstance(action.payload, Verify)}
    assert deep == {"spark-head": False, "spark-worker": True}


def test_bytes_found_wrong_only_by_the_new_plan_say_so(deployment: Deployment, monkeypatch: pytest.MonkeyPatch) -> None:
    other = "model-00001-of-00006.safetensors"
    fake = FindsCorruptShards(
        empty_facts(), corrupt_on_worker(deployment), findings=[("spark-worker", SHARD), ("spark-worker", other)]
    )
    monkeypatch.setattr(commands, "observe", fake.observe)
    monkeypatch.setattr(apply, "executor_for", fake.executor)
    with pytest.raises(ApplyError, match=f"spark-worker: sha256 differs: {other}") as failed:
        converge(deployment, commands.Converge(doing="test"))
    assert "found only now" in failed.value.hint


@pytest.mark.usefixtures("nodes")
def test_a_start_that_became_ready_is_recorded_phase_by_phase_and_fed_to_the_metrics(deployment: Deployment) -> None:
    from reconciler.events import history_path, read_events
    from reconciler.metrics import LoopMetrics
    from reconciler.starts import read_starts, starts_path

    metrics = LoopMetrics(deployment)
    converge(deployment, commands.Converge(doing="test", on_event=metrics.on_event))
    (record,) = read_starts(starts_path(deployment.state_dir))
    assert record["cause_kind"] == "start"
    assert {"image_pull", "checkpoint_download", "container_start", "engine_load", "smoke"} <= set(record["phases"])
    assert record["ready_s"] >= record["phases"]["engine_load"] >= 0
    history = read_events(history_path(deployment.state_dir))
    assert [event["kind"] for event in history if event["kind"] in {"start", "pass"}] == ["start", "pass"]
    assert metrics.registry.get_sample_value("spark_reconciler_group_starts_total", {"cause": "start"}) == 1
    # A converge with nothing to do records no start.
    converge(deployment, commands.Converge(doing="test"))
    assert len(read_starts(starts_path(deployment.state_dir))) == 1


def test_the_pass_that_begins_a_hold_is_one_hold_event(deployment: Deployment, monkeypatch: pytest.MonkeyPatch) -> None:
    from reconciler.events import history_path, read_events
    from reconciler.facts.node import Hold

    held = with_node(converged_facts(deployment), "spark-head", hold=Hold(since="2026-12-04T00:00:00Z", reason="stop"))
    fake = Nodes(held)
    monkeypatch.setattr(commands, "observe", fake.observe)
    monkeypatch.setattr(apply, "executor_for", fake.executor)
    converge(deployment, commands.Converge(doing="test"))
    holds = [event for event in read_events(history_path(deployment.state_dir)) if event["kind"] == "hold"]
    assert len(holds) == 1, holds
    assert "stop" in holds[0]["reason"]
