"""The serving image, present on every node under the pinned reference."""

from __future__ import annotations

from reconciler.actions import Action, InSync, Outcome, action_id
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
            Action(
                action_id(COMPONENT, "pull", node.name),
                COMPONENT,
                "create",
                node.name,
                f"pull {short_ref(ref)}",
                "image not present on the node",
            )
        )
    return outcome


def short_ref(ref: str) -> str:
    """Registry path plus 12 digest characters: enough to tell images apart in a plan."""
    name, at, digest = ref.partition("@sha256:")
    return f"{name}@sha256:{digest[:12]}" if at else ref
