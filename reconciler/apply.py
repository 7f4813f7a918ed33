"""Execute a plan: each action in order, after re-checking it; stop at the first failure.

Executors re-check their precondition on the node (facts may be stale) and are idempotent.
Transient failures (a dropped SSH connection, a Docker timeout) are retried with backoff;
anything else stops the apply with the failed action and its cause.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import docker
import requests
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from reconciler.actions import Action
from reconciler.components import apikey, checkpoint, image, memguard, pi, ranks
from reconciler.errors import NodeCommandError, NodeUnreachableError, ReconcilerError
from reconciler.execution import ApplyContext, Executor
from reconciler.plan import Plan

EXECUTORS: dict[str, dict[str, Executor]] = {
    checkpoint.COMPONENT: checkpoint.EXECUTORS,
    image.COMPONENT: image.EXECUTORS,
    apikey.COMPONENT: apikey.EXECUTORS,
    memguard.COMPONENT: memguard.EXECUTORS,
    ranks.COMPONENT: ranks.EXECUTORS,
    pi.COMPONENT: pi.EXECUTORS,
}


class ApplyError(ReconcilerError):
    """An action failed; the message names it and its cause."""

    def __init__(self, message: str, hint: str, action: Action) -> None:
        super().__init__(message, hint)
        self.action = action


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
    try:
        return EXECUTORS[action.component][action.step]
    except KeyError:
        raise ReconcilerError(
            f"no executor for {action.id}", "this is a bug in spark-reconciler; please report it"
        ) from None


@retry(
    retry=retry_if_exception_type(NodeUnreachableError),
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


def apply_plan(ctx: ApplyContext, plan: Plan) -> ApplyResult:
    result = ApplyResult()
    total = len(plan.actions)
    for number, action in enumerate(plan.actions, start=1):
        ctx.progress.line(f"[{number}/{total}] {action.symbol} {action.component} on {action.node}: {action.summary}")
        started = time.monotonic()
        try:
            message = _execute(ctx, action)
        except ReconcilerError as exc:
            raise ApplyError(
                f"[{number}/{total}] {action.component} on {action.node}: {action.summary}: failed: {exc.message}",
                exc.hint,
                action,
            ) from None
        elapsed = time.monotonic() - started
        ctx.progress.line(f"        done in {elapsed:.1f} s: {message}")
        result.done.append((action, message, elapsed))
    return result
