"""apply: order, the concurrent image pulls, and failures naming the action."""

from __future__ import annotations

import io
import threading
from typing import get_args

import pytest

from reconciler import apply
from reconciler.actions import Action, GuardConfig, Pull, StartGuard, Step, StepPayload, action
from reconciler.components import apikey, breaker, checkpoint_run, front, image_run, memguard, pi, ranks
from reconciler.errors import (
    ApplyError,
    JsoncError,
    NodeCommandError,
    NodeUnreachableError,
    ReconcilerError,
    TransientError,
)
from reconciler.execution import ApplyContext, Progress
from reconciler.plan import Plan, plan
from tests.scenarios import empty_facts, reference_deployment

PAYLOADS: dict[Step, StepPayload] = {
    Step.PULL: Pull(ref="img@sha256:1"),
    Step.START_GUARD: StartGuard(
        state_dir="/s", config=GuardConfig(floor_gib=4, interval_s=1, labels=[], config_hash="")
    ),
}


def step_on(step: Step, node: str, *after: str) -> Action:
    return action(PAYLOADS[step], node, "create", f"{step.name_in_id} on {node}", "test", after)


def test_each_step_has_one_payload_type_and_each_payload_type_one_executor() -> None:
    payload_types = get_args(StepPayload)
    assert sorted(kind.STEP for kind in payload_types) == sorted(Step)
    assert set(apply.EXECUTORS) == set(payload_types)
    bound = [*checkpoint_run.EXECUTORS, *image_run.EXECUTORS, *apikey.EXECUTORS, *memguard.EXECUTORS]
    bound += [*ranks.EXECUTORS, *breaker.EXECUTORS, *front.EXECUTORS, *pi.EXECUTORS]
    assert len(bound) == len(apply.EXECUTORS), "a payload type bound twice"


def test_neighbouring_pulls_on_distinct_nodes_form_one_batch_and_nothing_else_does() -> None:
    pulls = [step_on(Step.PULL, "a"), step_on(Step.PULL, "b")]
    guards = [step_on(Step.START_GUARD, "a"), step_on(Step.START_GUARD, "b")]
    again = step_on(Step.PULL, "a")
    grouped = apply.batches([*pulls, *guards, again])
    assert [[a.id for a in batch] for batch in grouped] == [
        ["image.pull@a", "image.pull@b"],
        ["memguard.start@a"],
        ["memguard.start@b"],
        ["image.pull@a"],
    ]


def test_a_pull_waiting_for_another_is_not_batched_with_it() -> None:
    first, second = step_on(Step.PULL, "a"), step_on(Step.PULL, "b", "image.pull@a")
    assert len(apply.batches([first, second])) == 2


def test_the_fresh_bring_up_pulls_every_node_at_once() -> None:
    actions = plan(reference_deployment(), empty_facts()).actions
    pulls = [batch for batch in apply.batches(list(actions)) if batch[0].step is Step.PULL]
    # The front's image comes after, on the head alone.
    assert [[a.node for a in batch] for batch in pulls] == [["spark-head", "spark-worker"], ["spark-head"]]


def run(monkeypatch: pytest.MonkeyPatch, actions: list[Action], executor: object) -> tuple[object, str]:
    monkeypatch.setattr(apply, "executor_for", lambda _action: executor)
    out = io.StringIO()
    ctx = ApplyContext(reference_deployment(), empty_facts(), {}, Progress(out))
    the_plan = Plan("dsv41", [], actions)
    try:
        return apply.apply_plan(ctx, the_plan), out.getvalue()
    except ApplyError as error:
        return error, out.getvalue()


def test_batched_pulls_really_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    both_running = threading.Barrier(2, timeout=60)

    def pull(_ctx: ApplyContext, act: Action) -> str:
        both_running.wait()  # raises BrokenBarrierError if the two never run at the same time
        return f"pulled on {act.node}"

    result, out = run(monkeypatch, [step_on(Step.PULL, "a"), step_on(Step.PULL, "b")], pull)
    assert isinstance(result, apply.ApplyResult)
    assert [message for _, message, _ in result.done] == ["pulled on a", "pulled on b"]
    assert "[1/2] done in" in out
    assert "[2/2] done in" in out


def test_a_failed_pull_fails_the_apply_after_the_other_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    finished: list[str] = []

    def pull(_ctx: ApplyContext, act: Action) -> str:
        if act.node == "a":
            raise NodeCommandError("manifest unknown", "check image.ref")
        finished.append(act.node)
        return "pulled"

    error, _ = run(monkeypatch, [step_on(Step.PULL, "a"), step_on(Step.PULL, "b")], pull)
    assert isinstance(error, ApplyError)
    assert error.message == "[1/2] image on a: pull on a: failed: manifest unknown"
    assert finished == ["b"]


@pytest.mark.parametrize(
    ("failure", "calls"),
    [
        (NodeUnreachableError("a: SSH connection dropped", "retrying"), 2),  # transient: tried again, and done
        (NodeCommandError("manifest unknown", "check image.ref"), 1),  # permanent: reported at once
    ],
)
def test_an_action_is_retried_by_the_branch_its_error_is_on(
    monkeypatch: pytest.MonkeyPatch, failure: ReconcilerError, calls: int
) -> None:
    monkeypatch.setattr(apply._execute.retry, "sleep", lambda _seconds: None)
    attempts: list[str] = []

    def pull(_ctx: ApplyContext, act: Action) -> str:
        attempts.append(act.node)
        if len(attempts) == 1:
            raise failure
        return "pulled"

    outcome, _ = run(monkeypatch, [step_on(Step.PULL, "a")], pull)
    assert len(attempts) == calls
    assert isinstance(outcome, apply.ApplyResult) == isinstance(failure, TransientError)


def test_a_readers_error_in_an_executor_is_not_an_action_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """It escapes to the command line, which reports it as the bug it is."""

    def pull(_ctx: ApplyContext, _act: Action) -> str:
        raise JsoncError("expected a value", 1, 1)

    with pytest.raises(JsoncError):
        run(monkeypatch, [step_on(Step.PULL, "a")], pull)
