"""The owner's housekeeping and the way out: a new API key, what fills the disks, uninstall.

`rotate-key` writes a new key and runs the front's steps alone (its key-version label follows
the key file, so the front is replaced in seconds; the ranks never hold the key and are not
touched). `storage` measures what is ours on every node and releases what nothing needs.
`uninstall` shows, then removes, everything the reconciler made: the boot service, the ranks,
the front, the memory guards, the images it pulled (a record per pull on each node says which:
an image the owner pulled is never ours to delete), the state dirs and Pi's provider; the
checkpoint only when asked. Each runs under the deployment lock, so no loop pass or `apply`
acts beside it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reconciler import commands, service
from reconciler.actions import Component
from reconciler.components.image import pull_record, short_ref
from reconciler.constants import UNIT_NAME
from reconciler.errors import NodeCommandError, ReconcilerError
from reconciler.execution import ApplyContext, Progress
from reconciler.facts.gather import gather
from reconciler.facts.revisions import desired_commit
from reconciler.fsutil import human_bytes
from reconciler.lock import deployment_lock
from reconciler.nodeops import NodeOps
from reconciler.nodeside import ops
from reconciler.nodeside.statedir import StateDir
from reconciler.redact import register
from reconciler.serving import LABEL_DEPLOYMENT, LABEL_OWNER, LABEL_ROLE, OWNER, ROLE_FRONT
from reconciler.spec import Deployment
from reconciler.transport.base import Transport

# "This machine": the boot service, Pi's provider and the records kept where the CLI runs.
HERE = "this machine"


# --- rotate-key -------------------------------------------------------------------------------


def rotate_key(deployment: Deployment, transports: dict[str, Transport], progress: Progress) -> commands.ApplyOutcome:
    """A new key in the key file, then the front's steps alone: the front reads the new key."""
    request = commands.Converge(
        doing="reconciler rotate-key",
        first=write_new_key,
        only=frozenset({Component.FRONT}),
        blocked_is_error=False,
    )
    return commands.converge(deployment, transports, progress, request)


def write_new_key(ctx: ApplyContext) -> None:
    """Under the lock: replace the key whole (a reader sees the old key or the new, never half)."""
    import secrets

    head = ctx.deployment.head.name
    path = ctx.deployment.key_file()
    state = ctx.ops(head).key_file(path)
    if not state.get("present") or not state.get("size"):
        raise ReconcilerError(
            f"there is no API key at {path} on {head} to rotate", "run `reconciler apply`: it creates the first key"
        )
    key = secrets.token_urlsafe(32)
    register(key)
    ctx.ops(head).write_file(path, key + "\n", mode=0o600)


# --- what is on the nodes ---------------------------------------------------------------------


@dataclass
class Item:
    """One thing of ours (or beside ours) on a node's disk, what it is to the deployment, and
    whether releasing it is safe."""

    node: str
    kind: str  # revision, image, state, cache, other-images
    what: str
    bytes: int
    status: str
    releasable: bool = False
    # What releasing it frees (hard-linked files shared with a kept revision stay).
    freed: int = 0
    # Internal: how to release it (a revision's path, an image's id) and an image's pulled refs.
    handle: str = field(default="", repr=False)
    refs: tuple[str, ...] = field(default=(), repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "kind": self.kind,
            "what": self.what,
            "bytes": self.bytes,
            "status": self.status,
            "releasable": self.releasable,
            "freed": self.freed,
        }


def storage(deployment: Deployment, transports: dict[str, Transport]) -> list[Item]:
    """Every node's share of the checkpoint, images and state, each with its status."""
    facts = gather(deployment, transports)
    head = facts.nodes[deployment.head.name]
    wanted = desired_commit(deployment.model, head.checkpoint) if head.reachable else None
    history = head.checkpoint.record.history if head.checkpoint.record is not None else []
    kept = set(history[1 : 1 + deployment.model.keep_revisions])
    items: list[Item] = []
    for node in deployment.nodes:
        if not facts.nodes[node.name].reachable:
            items.append(Item(node.name, "node", "-", 0, "not answering: nothing measured"))
            continue
        found = NodeOps(transports[node.name], None).footprint(deployment.state_dir, node.model_dir)
        items += _revision_items(node.name, found, wanted, kept)
        items += _state_items(node.name, found)
        items += _image_items(deployment, node.name, transports[node.name], found["pulled"])
    return items


def _revision_items(node: str, found: ops.Footprint, wanted: str | None, kept: set[str]) -> list[Item]:
    items = []
    for revision in found["revisions"]:
        commit = revision["path"].rpartition("@")[2] if "@" in revision["path"] else ""
        partial = f"; {human_bytes(revision['partial_bytes'])} unfinished or split" if revision["partial_bytes"] else ""
        if revision["serving"]:
            status = "served"
        elif commit and commit == wanted:
            status = "the spec's revision, being staged"
        elif commit in kept:
            status = "kept for a rollback (model.keep_revisions)"
        else:
            status = "not served, not kept: safe to release"
        releasable = status.endswith("safe to release")
        item = Item(node, "revision", revision["path"], revision["bytes"], status + partial, releasable)
        item.freed, item.handle = revision["freed"], revision["path"]
        items.append(item)
    return items


def _state_items(node: str, found: ops.Footprint) -> list[Item]:
    state = found["state_dir"]
    if state is None:
        return []
    cache = found["engine_cache_bytes"]
    return [
        Item(
            node,
            "state",
            state["path"],
            state["bytes"] - cache,
            "the reconciler's files (the API key on the head): kept",
        ),
        Item(
            node,
            "cache",
            f"{state['path']}/cache",
            cache,
            "the engine's compile cache: kept (a start rebuilds it slowly)",
        ),
    ]


def _image_items(deployment: Deployment, node: str, transport: Transport, pulled: list[str]) -> list[Item]:
    """Our pulls and the spec's images (in use, needed, or safe to release), then the others as
    one line: an image the reconciler did not pull is never released."""
    client = transport.docker()
    used = {container.image.id for container in _all_containers(client) if container.image is not None}
    needed = _needed_images(deployment, node)
    items, others, other_bytes = [], 0, 0
    for image in client.images.list():
        refs = set(image.attrs.get("RepoDigests") or []) | set(image.tags)
        ours = sorted(refs & set(pulled))
        size = int(image.attrs.get("Size") or 0)
        spec_refs = sorted(refs & needed)
        if not ours and not spec_refs:
            others, other_bytes = others + 1, other_bytes + size
            continue
        status = _image_status(bool(ours), image.id in used, bool(spec_refs))
        releasable = status.endswith("safe to release")
        item = Item(
            node, "image", short_ref((ours or spec_refs)[0]), size, status, releasable, size if releasable else 0
        )
        item.handle, item.refs = image.id, tuple(ours)
        items.append(item)
    if others:
        counted = f"{others} image{'s' if others != 1 else ''}"
        items.append(Item(node, "others", counted, other_bytes, "not pulled by the reconciler: never touched"))
    return items


def _image_status(ours: bool, in_use: bool, needed: bool) -> str:
    whose = "ours" if ours else "not pulled by the reconciler"
    if in_use:
        return f"{whose}, in use"
    if needed:
        return f"{whose}, the spec's (no container runs it now)"
    return "ours, no longer used: safe to release"


def _needed_images(deployment: Deployment, node: str) -> set[str]:
    """The images the spec runs on this node: the engine everywhere, the front on the head."""
    return {deployment.image.ref} | ({deployment.api.front_image} if node == deployment.head.name else set())


def _all_containers(client: Any) -> list[Any]:
    containers: list[Any] = client.containers.list(all=True, ignore_removed=True)
    return containers


def release(deployment: Deployment, transports: dict[str, Transport], items: list[Item]) -> list[Item]:
    """Remove the releasable items (checked again by the node: never the served revision); what
    was released."""
    done = []
    for item in (item for item in items if item.releasable):
        node_ops = NodeOps(transports[item.node], None)
        if item.kind == "revision":
            model_dir = deployment.node(item.node).model_dir
            removed = node_ops.remove_revisions(ops.RemoveRevisionsArgs(model_dir=model_dir, remove=[item.handle]))
            if removed["removed"]:
                done.append(item)
        elif item.kind == "image" and all(_remove_image(transports[item.node], ref) for ref in item.refs):
            done.append(item)
    _forget_pulls(deployment, transports, done)
    return done


def _remove_image(transport: Transport, ref: str) -> bool:
    """Remove the reference we pulled (a tag of the owner's on the same image keeps it)."""
    import docker

    try:
        transport.docker().images.remove(ref)
    except docker.errors.NotFound:
        return True
    except docker.errors.APIError as exc:  # a container took it up since: it stays
        raise NodeCommandError(
            f"{transport.node}: cannot remove image {short_ref(ref)}: {exc.explanation}",
            "run `reconciler storage` again: it shows what uses the image now",
        ) from None
    return True


def _forget_pulls(deployment: Deployment, transports: dict[str, Transport], items: list[Item]) -> None:
    """Drop the pull records of removed images (a later pull of the same ref records it again)."""
    for item in (item for item in items if item.kind == "image"):
        for ref in item.refs:
            NodeOps(transports[item.node], None).remove_file(pull_record(deployment.state_dir, ref))


def render_storage(items: list[Item], released: list[Item] | None = None) -> str:
    lines = []
    for node in dict.fromkeys(item.node for item in items):
        lines.append(f"{node}:")
        for item in (item for item in items if item.node == node):
            lines.append(f"  {item.kind:<9} {human_bytes(item.bytes):>9}  {item.what}")
            lines.append(f"  {'':<9} {'':>9}  {item.status}")
    releasable = [item for item in items if item.releasable]
    freed = sum(item.freed for item in releasable)
    if released is not None:
        lines.append(
            f"Released {len(released)} of {len(releasable)}: {human_bytes(sum(i.freed for i in released))} freed."
        )
    elif releasable:
        count = f"{len(releasable)} item{'s' if len(releasable) != 1 else ''}"
        lines.append(f"Safe to release: {count}, {human_bytes(freed)}: `reconciler storage --release`.")
    else:
        lines.append("Nothing is safe to release: every byte of ours is served, kept or needed.")
    return "\n".join(lines) + "\n"


# --- uninstall --------------------------------------------------------------------------------


@dataclass
class Removal:
    """One thing uninstall removes, or keeps and says why."""

    node: str
    kind: str  # service, guard, container, image, checkpoint, state, pi, records
    what: str
    detail: str = ""
    # Internal: a container's or image's id, a path.
    handle: str = field(default="", repr=False)

    def line(self) -> str:
        return f"{self.node}: {self.kind} {self.what}" + (f" ({self.detail})" if self.detail else "")

    def to_dict(self) -> dict[str, str]:
        return {"node": self.node, "kind": self.kind, "what": self.what, "detail": self.detail}


@dataclass
class UninstallPlan:
    removals: list[Removal] = field(default_factory=list)
    kept: list[Removal] = field(default_factory=list)
    # Nodes that did not answer: nothing on them is known, so nothing on them is removed.
    unreachable: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "remove": [r.to_dict() for r in self.removals],
            "keep": [k.to_dict() for k in self.kept],
            "unreachable": self.unreachable,
        }


def uninstall_plan(
    deployment: Deployment, transports: dict[str, Transport], spec_path: str, *, checkpoint: bool, unit_dir: Path
) -> UninstallPlan:
    """What uninstall would remove on every node and here, and what it keeps."""
    result = UninstallPlan()
    unit = _our_unit(unit_dir, spec_path)
    if unit is not None:
        result.removals.append(Removal(HERE, "service", UNIT_NAME, str(unit), str(unit)))
    for node in deployment.nodes:
        try:
            _node_removals(deployment, node.name, transports[node.name], checkpoint, result)
        except ReconcilerError as exc:
            result.unreachable.append(node.name)
            result.kept.append(Removal(node.name, "node", "not answering", exc.message))
    _local_removals(deployment, result)
    return result


def _our_unit(unit_dir: Path, spec_path: str) -> Path | None:
    """The boot service, when it runs this spec (another spec's service is not ours to remove)."""
    unit = unit_dir / UNIT_NAME
    try:
        text = unit.read_text(encoding="utf-8")
    except OSError:
        return None
    return unit if f"--spec {Path(spec_path).resolve()}" in text else None


def _node_removals(
    deployment: Deployment, node: str, transport: Transport, checkpoint: bool, result: UninstallPlan
) -> None:
    spec_node = deployment.node(node)
    found = NodeOps(transport, None).footprint(deployment.state_dir, spec_node.model_dir)
    if found["guard_running"]:
        result.removals.append(Removal(node, "guard", "memory guard", "stopped"))
    client = transport.docker()
    labels = [f"{LABEL_OWNER}={OWNER}", f"{LABEL_DEPLOYMENT}={deployment.name}"]
    for container in client.containers.list(all=True, filters={"label": labels}, ignore_removed=True):
        result.removals.append(Removal(node, "container", container.name, container.status, container.id))
    for ref, _ in _pulled_present(client, found["pulled"]):
        result.removals.append(Removal(node, "image", short_ref(ref), "pulled by the reconciler", ref))
    for ref in sorted(_needed_images(deployment, node) - set(found["pulled"])):
        if _image_id(client, ref) is not None:
            result.kept.append(
                Removal(node, "image", short_ref(ref), "not pulled by the reconciler: `docker image rm` it")
            )
    revisions = found["revisions"]
    size = human_bytes(sum(revision["freed"] for revision in revisions))
    if revisions or found["model_dir_kind"] != "absent":
        held = f"{len(revisions)} revision{'s' if len(revisions) != 1 else ''}, {size}"
        if checkpoint:
            result.removals.append(Removal(node, "checkpoint", found["model_dir"], f"{held}; --checkpoint"))
        else:
            result.kept.append(Removal(node, "checkpoint", found["model_dir"], f"{held}; --checkpoint removes it"))
    if found["state_dir"] is not None:
        state = found["state_dir"]
        detail = f"{human_bytes(state['bytes'])}: records, settings, caches; the API key and TLS pair on the head"
        result.removals.append(Removal(node, "state", state["path"], detail, state["path"]))


def _pulled_present(client: Any, pulled: list[str]) -> list[tuple[str, str]]:
    """(ref, image id) of each ref we pulled that the node still has."""
    found = [(ref, _image_id(client, ref)) for ref in pulled]
    return [(ref, image_id) for ref, image_id in found if image_id is not None]


def _image_id(client: Any, ref: str) -> str | None:
    import docker

    try:
        image_id: str = client.images.get(ref).id
    except docker.errors.ImageNotFound:
        return None
    return image_id


def _local_removals(deployment: Deployment, result: UninstallPlan) -> None:
    """Here: Pi's provider, and the records kept where the CLI runs when that is not the head."""
    from reconciler.facts.pi import pi_status

    if deployment.pi.enabled and pi_status(deployment.pi.provider).get("configured"):
        result.removals.append(Removal(HERE, "pi", f"provider {deployment.pi.provider}", "from Pi's config"))
    local = StateDir(deployment.state_dir).expanded().root
    remote_head = deployment.head.ssh is not None
    if remote_head and os.path.isdir(local):
        result.removals.append(Removal(HERE, "records", local, "events, incidents, starts, plans", local))


def uninstall(
    deployment: Deployment,
    transports: dict[str, Transport],
    planned: UninstallPlan,
    *,
    say: Callable[[str], None],
) -> list[Removal]:
    """Remove what the plan lists, in an order that leaves nothing to restart the rest: the
    service first, then per node the guard, containers, images, checkpoint and state dir."""
    done = []
    for removal in planned.removals:
        if removal.kind == "service" and not os.access(Path(removal.handle).parent, os.W_OK):
            raise ReconcilerError(
                f"cannot remove {removal.handle}: this user may not write {Path(removal.handle).parent}",
                "run `sudo reconciler uninstall`; nothing was removed",
            )
    with deployment_lock(deployment, "reconciler uninstall", wait_s=600, on_wait=say):
        for removal in _in_order(planned.removals):
            _remove(deployment, transports, removal)
            say(f"removed {removal.line()}")
            done.append(removal)
    # The lock's own file is in the state dir here: it goes once the lock is let go.
    shutil.rmtree(StateDir(deployment.state_dir).expanded().root, ignore_errors=True)
    return done


KIND_ORDER = ("service", "guard", "container", "image", "checkpoint", "state", "pi", "records")


def _in_order(removals: list[Removal]) -> Iterator[Removal]:
    yield from sorted(removals, key=lambda removal: KIND_ORDER.index(removal.kind))


def _remove(deployment: Deployment, transports: dict[str, Transport], removal: Removal) -> None:
    if removal.kind == "service":
        service.uninstall(Path(removal.handle))
    elif removal.kind == "pi":
        from reconciler.pi import agent

        agent.uninstall(deployment.pi.provider)
    elif removal.kind == "records":
        shutil.rmtree(removal.handle, ignore_errors=True)
    else:
        _remove_on_node(deployment, transports[removal.node], removal)


def _remove_on_node(deployment: Deployment, transport: Transport, removal: Removal) -> None:
    import docker

    node_ops = NodeOps(transport, None)
    client = transport.docker()
    try:
        if removal.kind == "guard":
            node_ops.guard_stop(deployment.state_dir)
        elif removal.kind == "container":
            container = client.containers.get(removal.handle)
            # A rank gets its grace (in-flight requests end); the front holds nothing to finish.
            front = container.labels.get(LABEL_ROLE) == ROLE_FRONT
            if not front and container.status in {"running", "restarting", "paused"}:
                container.stop(timeout=deployment.serving.stop_timeout_s)
            container.remove(force=True)
        elif removal.kind == "image":
            # The reference we pulled, not the image by id: a tag of the owner's keeps the image.
            client.images.remove(removal.handle)
        elif removal.kind in {"checkpoint", "state"}:
            remove = ["checkpoint"] if removal.kind == "checkpoint" else ["state"]
            model_dir = deployment.node(transport.node).model_dir
            node_ops.remove_trees(
                ops.RemoveTreesArgs(state_dir=deployment.state_dir, model_dir=model_dir, remove=remove)
            )
    except docker.errors.NotFound:
        return  # gone already: what uninstall wants
    except docker.errors.APIError as exc:
        raise NodeCommandError(
            f"{transport.node}: cannot remove {removal.kind} {removal.what}: {exc.explanation}",
            "run `reconciler uninstall` again once what holds it is gone: it removes only what is left",
        ) from None


def render_uninstall_plan(planned: UninstallPlan) -> str:
    if not planned.removals:
        lines = ["Nothing to remove: no trace of this deployment's reconciler is left."]
    else:
        lines = ["Uninstall would remove:"] + [f"  - {removal.line()}" for removal in _in_order(planned.removals)]
    lines += [f"  kept: {kept.line()}" for kept in planned.kept]
    return "\n".join(lines) + "\n"
