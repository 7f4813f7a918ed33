"""Execute a plan: each action's payload in order, after re-checking it; stop at the first failure.

One exception to strict order: image pulls that follow each other in the plan, each on a
different node and none waiting for another, run at the same time (pulled node by node, a
20 GB image twice in a row is the slowest step of a fresh bring-up after the checkpoint).

Each step has exactly one executor, which runs the action's payload. Executors re-check their
precondition on the node (facts may be stale) and are idempotent, but never decide again what
to do: the plan that was shown is the plan that runs.
Transient failures (a dropped SSH connection, a Docker timeout) are retried with backoff;
anything else stops the apply with the failed action and its cause.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import docker
import requests
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from reconciler.actions import Action, Payload, Step, is_pipelined
from reconciler.components import apikey, breaker, checkpoint_run, front, image_run, memguard, pi, ranks
from reconciler.errors import (
    ApplyError,
    NodeCommandError,
    NodeUnreachableError,
    ReconcilerError,
    TransientError,
)
from reconciler.execution import ApplyContext, Executor
from reconciler.pipeline import GROUP_STEPS, run_group
from reconciler.plan import Plan

# Each payload type's one executor (see `runs`).
EXECUTORS: dict[type[Payload], Executor] = dict(
    [
        *checkpoint_run.EXECUTORS,
        *image_run.EXECUTORS,
        *apikey.EXECUTORS,
        *memguard.EXECUTORS,
        *ranks.EXECUTORS,
        *breaker.EXECUTORS,
        *front.EXECUTORS,
        *pi.EXECUTORS,
    ]
)


@dataclass
class ApplyResult:
    done: list[tuple[Action, str, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {
            "done": [
                {"id": action.id, "result": message, "seconds": round(seconds, 2)}
                for action, message, seconds in self.done
            ]
        }


def executor_for(action: Action) -> Executor:
    return EXECUTORS[type(action.payload)]


@retry(
    retry=retry_if_exception_type(TransientError),
    stop=stop_after_attempt(3),
    wait=wait_exponential_jitter(initial=1, max=10),
    reraise=True,
)
def _execute(ctx: ApplyContext, action: Action) -> str:
    try:
        return executor_for(action)(ctx, action)
    except docker.errors.DockerException as exc:
        explanation = getattr(exc, "explanation", None) or str(exc)
        raise NodeCommandError(
            f"Docker on {action.node}: {explanation}", "see `reconciler logs` and dockerd's log"
        ) from None
    except requests.RequestException as exc:
        # A dropped connection to the Docker API: transient, retried with backoff.
        raise NodeUnreachableError(f"Docker API on {action.node} dropped: {exc}", "retrying") from None


# Steps safe to run on several nodes at once: each touches only its node.
CONCURRENT_STEPS = {Step.PULL}


def batches(actions: list[Action]) -> list[list[Action]]:
    """The plan's actions in order, neighbouring concurrent-safe ones on distinct nodes grouped,
    and a run of checkpoint actions holding a pipelined one as one group (see pipeline.py)."""
    grouped: list[list[Action]] = []
    # Maximal runs of the checkpoint's staging steps and runs of the rest.
    for run in _runs(actions, lambda run, action: (run[-1].step in GROUP_STEPS) == (action.step in GROUP_STEPS)):
        grouped += [run] if any(is_pipelined(action) for action in run) else _runs(run, _joins)
    return grouped


def _runs(actions: list[Action], joins: Callable[[list[Action], Action], bool]) -> list[list[Action]]:
    """The actions in order, each joining the run before it when `joins` says so."""
    runs: list[list[Action]] = []
    for action in actions:
        if runs and joins(runs[-1], action):
            runs[-1].append(action)
        else:
            runs.append([action])
    return runs


def _joins(batch: list[Action], action: Action) -> bool:
    return (
        action.step in CONCURRENT_STEPS
        and all(other.step == action.step for other in batch)
        and action.node not in {other.node for other in batch}
        and not {other.id for other in batch} & set(action.depends_on)
    )


def apply_plan(ctx: ApplyContext, plan: Plan, result: ApplyResult | None = None) -> ApplyResult:
    """Run the plan's actions in order; `result` (kept when an action fails) gets each one done."""
    result = result if result is not None else ApplyResult()
    total = len(plan.actions)
    numbers = {action.id: number for number, action in enumerate(plan.actions, start=1)}
    for batch in batches(list(plan.actions)):
        pipelined = any(is_pipelined(action) for action in batch)
        for action in [] if pipelined else batch:
            _announce(ctx, action, numbers[action.id], total)
        outcomes = _run_group(ctx, batch, numbers, total) if pipelined else _run_batch(ctx, batch, numbers, total)
        for action, (message, elapsed, error) in zip(batch, outcomes, strict=True):
            _record_step(ctx, action, elapsed, error.message if error is not None else None, message)
            if error is not None:
                where = f"[{numbers[action.id]}/{total}] {action.component} on {action.node}: {action.summary}"
                raise ApplyError(f"{where}: failed: {error.message}", error.hint, cause=error, step=action.step.value)
            prefix = "        done" if len(batch) == 1 else f"        [{numbers[action.id]}/{total}] done"
            ctx.progress.line(f"{prefix} in {elapsed:.1f} s: {message}")
            result.done.append((action, message, elapsed))
    return result


def _record_step(ctx: ApplyContext, action: Action, seconds: float, error: str | None, result: str) -> None:
    """The step in the event history: what, where, why, how long, and how it ended."""
    outcome = {"outcome": "failed", "error": error} if error is not None else {"outcome": "done", "result": result}
    moved = {"bytes": ctx.moved[action.id]} if action.id in ctx.moved else {}
    ctx.events.emit(
        "step",
        step=action.step.value,
        node=action.node,
        id=action.id,
        cause=action.cause,
        seconds=round(seconds, 2),
        **outcome,
        **moved,
    )


def _announce(ctx: ApplyContext, action: Action, number: int, total: int) -> None:
    ctx.progress.line(f"[{number}/{total}] {action.symbol} {action.component} on {action.node}: {action.summary}")


Outcome = tuple[str, float, ReconcilerError | None]


def _run_group(ctx: ApplyContext, group: list[Action], numbers: dict[str, int], total: int) -> list[Outcome]:
    """A pipelined group: each action announced as it starts (several run at once)."""

    def run(action: Action) -> Outcome:
        _announce(ctx, action, numbers[action.id], total)
        return _run_one(ctx, action, numbers[action.id], total)

    return run_group(ctx.boards, group, run)


def _run_one(ctx: ApplyContext, action: Action, number: int, total: int) -> Outcome:
    started = time.monotonic()
    try:
        with ctx.progress.step(number, total, action) as state:
            try:
                message = _execute(ctx, action)
            finally:
                if state.counter is not None:
                    ctx.moved[action.id] = state.counter.done
    except ReconcilerError as exc:
        return "", time.monotonic() - started, exc
    ended = time.monotonic()
    ctx.spans.append((action, started, ended))
    return message, ended - started, None


def _run_batch(ctx: ApplyContext, batch: list[Action], numbers: dict[str, int], total: int) -> list[Outcome]:
    """One action inline; several at once, every one run to its end before any failure is raised."""
    if len(batch) == 1:
        return [_run_one(ctx, batch[0], numbers[batch[0].id], total)]
    with ThreadPoolExecutor(max_workers=len(batch), thread_name_prefix="apply") as pool:
        return list(pool.map(lambda action: _run_one(ctx, action, numbers[action.id], total), batch))
