"""The serving image, present on every node under its pinned ref (image.ref)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reconciler.actions import (
    Action,
    Blocker,
    Component,
    CopyImage,
    FetchImage,
    InSync,
    Outcome,
    PruneImages,
    Pull,
    Step,
    action,
)
from reconciler.components.routing import fabric_pair
from reconciler.facts.node import Facts, NodeFacts, PulledImage
from reconciler.nodeside.statedir import StateDir
from reconciler.serving import container_name
from reconciler.spec import Deployment, Node
from reconciler.spec.imageref import digest_of, local_name, registry_of, same_image

if TYPE_CHECKING:
    from reconciler.execution import ApplyContext
    from reconciler.progress import Counter

COMPONENT = Component.IMAGE
# The target of the front image's pull on the head: no rank waits for it, the front does.
FRONT_PULL = "front"


def plan_image(deployment: Deployment, facts: Facts) -> Outcome:
    """The serving image on every node, then the front's on the head. A node pulls from the
    registry, or (image_source: peer) takes the image from a peer: the head fetches it once into
    its image store, each peer copies the blobs it lacks from the node before it in a chain, and
    its Docker pulls from its own store (only layers it lacks)."""
    answering = facts.answering(deployment.ranked_nodes)
    ref = deployment.image.ref
    outcome = Outcome()
    chain = _PeerChain(deployment, facts)
    for _, node, observed in answering:
        local = local_name(observed.images, ref)
        if local is not None:
            shown = f"{short_ref(ref)} present" + ("" if local == ref else f" (as {short_ref(local)}, from a peer)")
            outcome.in_sync.append(InSync(node.name, COMPONENT, shown))
            chain.holds(node, observed)
        elif deployment.image_source_of(node) == "peer":
            chain.take(node, observed)
        elif node.role == "worker":
            _from_registry(outcome, deployment, node, observed, ref, "")
    head_missing = (
        facts.nodes[deployment.head.name].reachable
        and local_name(facts.nodes[deployment.head.name].images, ref) is None
    )
    outcome.extend(chain.conclude())
    if head_missing and chain.head_store_used and chain.head_store_ready(outcome):
        outcome.actions.append(chain.head_pull())
    elif head_missing:
        _from_registry(outcome, deployment, deployment.head, facts.nodes[deployment.head.name], ref, "")
    # The head's fetch, then the copies of the chain, then the pulls (side by side), by rank.
    ranks = {node.name: rank for rank, node in deployment.ranked_nodes}
    order = {Step.FETCH_IMAGE: 0, Step.COPY_IMAGE: 1, Step.PULL: 2}
    outcome.actions.sort(key=lambda item: (order.get(item.step, 3), ranks.get(item.node, 0)))
    for rank, node, observed in answering:
        front = deployment.api.front_image
        if rank == 0 and local_name(observed.images, front) is None:
            _from_registry(outcome, deployment, node, observed, front, FRONT_PULL)
        elif rank == 0:
            outcome.in_sync.append(InSync(node.name, COMPONENT, f"{short_ref(front)} present (the front's)"))
    return outcome


def _from_registry(
    outcome: Outcome, deployment: Deployment, node: Node, observed: NodeFacts, ref: str, target: str
) -> None:
    """A pull from the image's registry, or a blocker when the node showed it cannot reach it."""
    reach = observed.registry
    if target == "" and reach is not None and reach.error is not None:
        outcome.blockers.append(_unreachable_registry(deployment, node, reach.address, reach.error))
        return
    source = "the head pulls for itself" if node.role == "head" else "image_source: registry"
    cause = "image not present on the node" + (" (the front's)" if target else f"; {source}")
    outcome.actions.append(action(Pull(ref=ref), node.name, "create", f"pull {short_ref(ref)}", cause, (), target))


def _unreachable_registry(deployment: Deployment, node: Node, address: str, error: str) -> Blocker:
    message = f"the image is not here and its registry {address} cannot be reached from {node.name}: {error}"
    if node.role == "head":
        hint = f"give {node.name} a route to {address}: the head pulls the image for itself and for its peers"
    else:
        hint = (
            f"give {node.name} a route to {address}, or set image_source: peer on {node.name} (or "
            "image.worker_source: peer) and the head sends the image over the fabric"
        )
    del deployment
    return Blocker(node.name, COMPONENT, message, hint)


class _PeerChain:
    """The peer-sourced nodes that lack the image, in rank order. Each copies the blobs its
    store lacks from the node before it in the chain once that one's copy is done (its store
    then holds the image whole), or from the head, so every node uploads the image about once
    and the head's upload does not grow with the workers. The head's store is filled from the
    registry first when a copy needs it."""

    def __init__(self, deployment: Deployment, facts: Facts) -> None:
        self.deployment, self.facts = deployment, facts
        self.ref = deployment.image.ref
        self.digest = digest_of(self.ref) or ""
        self.head = deployment.head
        self.head_facts = facts.nodes[self.head.name]
        self.relay: tuple[Node, str] | None = None
        self.copies: list[Action] = []
        self.pulls: list[Action] = []
        self.fetch_id = f"{Step.FETCH_IMAGE.component}.{Step.FETCH_IMAGE.name_in_id}@{self.head.name}"
        self.head_store_used = False
        self.blockers: list[Blocker] = []

    def holds(self, node: Node, observed: NodeFacts) -> None:
        """A peer-sourced node that has the image: the next copy may start from its store."""
        if node.role == "worker" and self.digest in observed.image_store:
            self.relay = (node, "")

    def take(self, node: Node, observed: NodeFacts) -> None:
        after: tuple[str, ...] = ()
        if self.digest not in observed.image_store:
            copy = self._copy(node)
            self.copies.append(copy)
            after = (copy.id,)
            self.relay = (node, copy.id)
        why = "image not present on the node; image_source: peer"
        summary = f"load {short_ref(self.ref)} into Docker from the node's image store (only layers Docker lacks)"
        self.pulls.append(action(Pull(ref=self.ref, from_store=True), node.name, "create", summary, why, after))

    def _copy(self, node: Node) -> Action:
        origin, fabric, why = self._origin(node)
        after = self._ready(origin)
        route = _route(self.deployment, fabric)
        summary = f"copy the layers {node.name} lacks of {short_ref(self.ref)} from {origin.name} {route}"
        cause = "; ".join(part for part in ("image not present on the node; image_source: peer", why) if part)
        payload = CopyImage(ref=self.ref, source_node=origin.name, fabric=fabric)
        return action(payload, node.name, "create", summary, cause, after)

    def _origin(self, node: Node) -> tuple[Node, tuple[str, str] | None, str]:
        if self.deployment.model.copy_transport == "ssh":
            return self.head, None, ""
        if self.relay is not None:
            previous = self.relay[0]
            fabric = fabric_pair(self.facts, previous, node)
            if fabric is not None:
                return previous, fabric, f"{previous.name} holds the image by then: the workers copy in a chain"
        return self.head, fabric_pair(self.facts, self.head, node), ""

    def _ready(self, origin: Node) -> tuple[str, ...]:
        """What a copy from `origin` waits for: the head's fetch, or the origin's own copy."""
        if origin.name != self.head.name:
            return tuple(item for item in ((self.relay or (origin, ""))[1],) if item)
        self.head_store_used = True
        return () if self.digest in self.head_facts.image_store else (self.fetch_id,)

    def conclude(self) -> Outcome:
        outcome = Outcome()
        if (self.copies or self.pulls) and not self.head_facts.reachable:
            message = f"the image comes from {self.head.name}, which does not answer"
            hint = f"bring {self.head.name} back, or set image_source: registry on the workers"
            outcome.blockers += [Blocker(item.node, COMPONENT, message, hint) for item in self.pulls]
            return outcome
        reach = self.head_facts.registry
        if self.head_store_used and self.digest not in self.head_facts.image_store:
            if reach is not None and reach.error is not None:
                outcome.blockers.append(_unreachable_registry(self.deployment, self.head, reach.address, reach.error))
                return outcome
            outcome.actions.append(self._fetch())
        outcome.actions += self.copies + self.pulls
        return outcome

    def head_store_ready(self, outcome: Outcome) -> bool:
        """The head's store holds the image, or its fetch is planned (a blocker may stand instead)."""
        planned = any(item.id == self.fetch_id for item in outcome.actions)
        return planned or self.digest in self.head_facts.image_store

    def head_pull(self) -> Action:
        """The head lacks the image too: its Docker takes it from the store just filled, so the
        registry sends it once."""
        summary = f"load {short_ref(self.ref)} into Docker from the head's image store (fetched once for all)"
        cause = "image not present on the node; the head fetches it into its store for its peers anyway"
        after = () if self.digest in self.head_facts.image_store else (self.fetch_id,)
        return action(Pull(ref=self.ref, from_store=True), self.head.name, "create", summary, cause, after)

    def _fetch(self) -> Action:
        registry = registry_of(self.ref).host
        takers = [item.node for item in self.copies if item.payload.source_node == self.head.name]  # type: ignore[union-attr]
        summary = f"fetch {short_ref(self.ref)} from {registry} into {self.head.name}'s image store, as sent"
        verb = "takes" if len(takers) == 1 else "take"
        cause = f"{', '.join(takers)} {verb} the image from a peer (image_source: peer) and no store holds it yet"
        return action(FetchImage(ref=self.ref), self.head.name, "create", summary, cause)


def plan_image_prune(deployment: Deployment, facts: Facts, restarting: set[str]) -> list[Action]:
    """Per node, once the serving image is the spec's: the newest `image.keep_previous` other
    serving images we pulled stay, older ones we pulled go, and the store keeps only the kept
    digests. An image we did not pull has no record and is never named here. A container uses
    an image only if it is not one of our ranks restarting onto the new image in this plan
    (`restarting`: the nodes where one starts)."""
    actions = []
    ref = deployment.image.ref
    ours = {container_name(deployment, rank): node.name for rank, node in deployment.ranked_nodes}
    for _, node, observed in facts.answering(deployment.ranked_nodes):
        serving = [item for item in observed.pulled if _serving(item, ref) and item.present]
        previous = sorted((item for item in serving if not same_image(item.ref, ref)), key=lambda item: item.at)
        kept = previous[max(0, len(previous) - deployment.image.keep_previous) :]
        replaced = node.name in restarting
        remove = [
            item.ref
            for item in previous
            if item not in kept
            and not item.refused
            and all(replaced and ours.get(user) == node.name for user in item.users)
        ]
        keep = sorted({digest for item in [ref, *(k.ref for k in kept)] if (digest := digest_of(item))})
        extra = sorted(set(observed.image_store) - set(keep))
        if not remove and not extra:
            continue
        names = ", ".join(short_ref(item) for item in remove) or "no image"
        summary = f"remove {names} (pulled by the reconciler, older than the {len(kept)} kept)"
        summary += f"; {len(extra)} image(s) leave the store" if extra else ""
        cause = f"image.keep_previous: {deployment.image.keep_previous}; images the reconciler did not pull stay"
        actions.append(action(PruneImages(remove=remove, keep=keep), node.name, "remove", summary, cause))
    return actions


def _serving(record: PulledImage, ref: str) -> bool:
    """A serving image's record; one from before roles were written counts when it is of the
    serving image's repository (the front's image never is)."""
    if record.role is not None:
        return record.role == "serving"
    return registry_of(record.ref).path == registry_of(ref).path


def _route(deployment: Deployment, fabric: tuple[str, str] | None) -> str:
    if deployment.model.copy_transport == "ssh":
        return "over SSH, as model.copy_transport says (resumable)"
    if fabric is None:
        return "over SSH, fabric addresses not settled (resumable)"
    return f"over the fabric {fabric[0]} -> {fabric[1]} (rsync to a daemon for this copy, resumable)"


def local_image_name(client: Any, ref: str) -> str:
    """The name this node's Docker knows `ref`'s image by: `ref`, or the peer relay's name of the
    same digest; `ref` itself when neither is there (the caller's error then names it)."""
    if _present(client, ref):
        return ref
    known = [name for image in client.images.list() for name in image.attrs.get("RepoDigests") or []]
    return local_name(known, ref) or ref


def short_ref(ref: str) -> str:
    """Registry path plus 12 digest characters: enough to tell images apart in a plan."""
    name, at, digest = ref.partition("@sha256:")
    return f"{name}@sha256:{digest[:12]}" if at else ref


def pull_record(state_dir: str, ref: str) -> str:
    """Where the record of our pull of `ref` lives on a node: one file a ref, so pulls side by
    side never rewrite one file."""
    import hashlib

    return f"{StateDir(state_dir).pulled_images}/{hashlib.sha256(ref.encode()).hexdigest()[:32]}.json"


def record_pull(ctx: ApplyContext, node: str, ref: str, image_id: str, *, front: bool = False) -> None:
    """Remember that we pulled `ref` here, as that image id: what uninstall and storage may
    remove is what we pulled (the same ref pulled later by the owner is another id, or the same
    bytes, which they then share with us)."""
    import json

    from reconciler.clock import utc_iso

    # The front's image is no serving image: image.keep_previous never counts or prunes it.
    role = "front" if front else "serving"
    record = json.dumps({"ref": ref, "id": image_id, "at": utc_iso(), "role": role}) + "\n"
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


def _present(client: Any, ref: str) -> bool:
    import docker

    try:
        client.images.get(ref)
    except docker.errors.ImageNotFound:
        return False
    return True
