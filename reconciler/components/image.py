"""The serving image, present on every node under the pinned reference."""

from __future__ import annotations

from typing import Any

from reconciler.actions import Action, InSync, Outcome, Pull, Step, action
from reconciler.errors import NodeCommandError
from reconciler.execution import ApplyContext, Executor, payload_of
from reconciler.facts.node import Facts
from reconciler.spec import Deployment

COMPONENT = "image"


def plan_image(deployment: Deployment, facts: Facts) -> Outcome:
    outcome = Outcome()
    ref = deployment.image.ref
    for _, node in deployment.ranked_nodes:
        observed = facts.nodes[node.name]
        if not observed.reachable:
            continue
        if ref in observed.images:
            outcome.in_sync.append(InSync(node.name, COMPONENT, f"{short_ref(ref)} present"))
            continue
        outcome.actions.append(
            action(
                Step.PULL, node.name, "create", f"pull {short_ref(ref)}", "image not present on the node", Pull(ref=ref)
            )
        )
    return outcome


def short_ref(ref: str) -> str:
    """Registry path plus 12 digest characters: enough to tell images apart in a plan."""
    name, at, digest = ref.partition("@sha256:")
    return f"{name}@sha256:{digest[:12]}" if at else ref


def _pull(ctx: ApplyContext, action: Action) -> str:
    ref = payload_of(action, Pull).ref
    client = ctx.transport(action.node).docker()
    if _present(client, ref):
        return "already present"
    import docker  # here, not at the top: planning imports this module and needs no Docker SDK

    layers: dict[str, str] = {}
    try:
        for event in client.api.pull(ref, stream=True, decode=True):
            if "id" in event and "status" in event:
                layers[event["id"]] = event["status"]
                done = sum(1 for status in layers.values() if status in {"Pull complete", "Already exists"})
                ctx.progress.throttled(f"pull-{action.node}", f"    {action.node}: pulling {done}/{len(layers)} layers")
            if "error" in event:
                raise NodeCommandError(f"{action.node}: pull of {short_ref(ref)} failed: {event['error']}", _PULL_HINT)
    except docker.errors.APIError as exc:
        raise NodeCommandError(
            f"{action.node}: pull of {short_ref(ref)} failed: {exc.explanation}", _PULL_HINT
        ) from None
    if not _present(client, ref):
        raise NodeCommandError(f"{action.node}: {short_ref(ref)} still missing after the pull", _PULL_HINT)
    return f"pulled {short_ref(ref)}"


_PULL_HINT = "check the registry is reachable from the node and the digest exists (docker pull by hand to see more)"


def _present(client: Any, ref: str) -> bool:
    import docker

    try:
        client.images.get(ref)
    except docker.errors.ImageNotFound:
        return False
    return True


EXECUTORS: dict[Step, Executor] = {Step.PULL: _pull}
