"""The serving image, present on every node under its pinned ref (image.ref)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reconciler.actions import Action, Component, InSync, Outcome, Pull, action, runs
from reconciler.errors import NodeCommandError
from reconciler.facts.node import Facts
from reconciler.nodeside.statedir import StateDir
from reconciler.spec import Deployment

if TYPE_CHECKING:
    from reconciler.execution import ApplyContext
    from reconciler.progress import Counter

COMPONENT = Component.IMAGE
# The target of the front image's pull on the head: no rank waits for it, the front does.
FRONT_PULL = "front"


def plan_image(deployment: Deployment, facts: Facts) -> Outcome:
    """The serving image on every node (pulled side by side), then the front's on the head."""
    outcome = Outcome()
    answering = list(facts.answering(deployment.ranked_nodes))
    wanted = [(node, observed, "", deployment.image.ref) for _, node, observed in answering]
    wanted += [
        (node, observed, FRONT_PULL, deployment.api.front_image) for rank, node, observed in answering if rank == 0
    ]
    for node, observed, target, ref in wanted:
        if ref in observed.images:
            outcome.in_sync.append(InSync(node.name, COMPONENT, f"{short_ref(ref)} present"))
            continue
        cause = "image not present on the node" + (" (the front's)" if target else "")
        pull = action(Pull(ref=ref), node.name, "create", f"pull {short_ref(ref)}", cause, (), target)
        outcome.actions.append(pull)
    return outcome


def short_ref(ref: str) -> str:
    """Registry path plus 12 digest characters: enough to tell images apart in a plan."""
    name, at, digest = ref.partition("@sha256:")
    return f"{name}@sha256:{digest[:12]}" if at else ref


def _pull(ctx: ApplyContext, action: Action, pull: Pull) -> str:
    ref = pull.ref
    client = ctx.transport(action.node).docker()
    if _present(client, ref):
        return "already present"
    import docker  # here, not at the top: planning imports this module and needs no Docker SDK

    layers = Layers()
    report = ctx.progress.reporter()
    failed = f"{action.node}: pull of {short_ref(ref)} failed"
    try:
        for event in client.api.pull(ref, stream=True, decode=True):
            if layers.take(event):
                report(layers.counter())
            if "error" in event:
                raise NodeCommandError(f"{failed}: {event['error']}", _PULL_HINT)
    except docker.errors.APIError as exc:
        raise NodeCommandError(f"{failed}: {exc.explanation}", _PULL_HINT) from None
    if not _present(client, ref):
        raise NodeCommandError(f"{action.node}: {short_ref(ref)} still missing after the pull", _PULL_HINT)
    record_pull(ctx, action.node, ref, client.images.get(ref).id)
    return f"pulled {short_ref(ref)}"


def pull_record(state_dir: str, ref: str) -> str:
    """Where the record of our pull of `ref` lives on a node: one file a ref, so pulls side by
    side never rewrite one file."""
    import hashlib

    return f"{StateDir(state_dir).pulled_images}/{hashlib.sha256(ref.encode()).hexdigest()[:32]}.json"


def record_pull(ctx: ApplyContext, node: str, ref: str, image_id: str) -> None:
    """Remember that we pulled `ref` here, as that image id: what uninstall and storage may
    remove is what we pulled (the same ref pulled later by the owner is another id, or the same
    bytes, which they then share with us)."""
    import json

    from reconciler.clock import utc_iso

    record = json.dumps({"ref": ref, "id": image_id, "at": utc_iso()}) + "\n"
    ctx.ops(node).write_file(pull_record(ctx.deployment.state_dir, ref), record)


class Layers:
    """A pull's progress from Docker's event stream: bytes downloaded of the layers' sizes (known
    once each layer starts) and layers done of the layers seen."""

    DONE = frozenset({"Download complete", "Verifying Checksum", "Extracting", "Pull complete", "Already exists"})

    def __init__(self) -> None:
        self.got: dict[str, int] = {}
        self.size: dict[str, int] = {}
        self.status: dict[str, str] = {}

    def take(self, event: dict[str, Any]) -> bool:
        """Count one event; False when it is not about a layer."""
        layer, status = event.get("id"), event.get("status")
        if not isinstance(layer, str) or not isinstance(status, str) or status.startswith("Pulling from"):
            return False
        self.status[layer] = status
        detail = event.get("progressDetail") or {}
        current, total = detail.get("current"), detail.get("total")
        if status == "Downloading" and isinstance(current, int) and isinstance(total, int):
            self.got[layer], self.size[layer] = current, total
        elif status in self.DONE and layer in self.size:
            self.got[layer] = self.size[layer]
        return True

    def counter(self) -> Counter:
        from reconciler.progress import Counter  # only while pulling: a plan starts without it

        done = sum(1 for status in self.status.values() if status in {"Pull complete", "Already exists"})
        total = sum(self.size.values()) or None
        return Counter("pull", sum(self.got.values()), total, done, len(self.status), unit="layer")


_PULL_HINT = "check the registry is reachable from the node and the digest exists (docker pull by hand to see more)"


def _present(client: Any, ref: str) -> bool:
    import docker

    try:
        client.images.get(ref)
    except docker.errors.ImageNotFound:
        return False
    return True


EXECUTORS = (runs(Pull, _pull),)
