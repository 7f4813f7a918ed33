"""The owner's housekeeping and the way out: a new API key, what fills the disks, uninstall.

`rotate-key` writes a new key and runs the front's steps alone (its key-version label follows
the key file, so the front is replaced in seconds; the ranks never hold the key and are not
touched); a front that cannot take the key now is said before the key changes. `storage`
measures what is ours on every node and releases what nothing serves, keeps or needs.
`uninstall` shows, then removes, everything the reconciler made: the boot service, the ranks,
the front, the memory guards, the images it pulled (a record per pull on each node, with the
image id, says which: an image the owner pulled is never ours to delete), what it wrote in the
state dirs, Pi's provider; the checkpoint only when asked. Each acts under the deployment lock,
so no `apply` acts beside it, and uninstall first makes sure no loop is left to rebuild it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reconciler import commands, service
from reconciler.actions import Component
from reconciler.components.image import pull_record, short_ref
from reconciler.constants import UNIT_NAME
from reconciler.errors import NodeCommandError, NodeUnreachableError, ReconcilerError
from reconciler.execution import ApplyContext, Progress
from reconciler.facts.gather import gather
from reconciler.facts.node import Facts
from reconciler.facts.revisions import desired_commit
from reconciler.fsutil import human_bytes
from reconciler.lock import deployment_lock, lock_path
from reconciler.nodeops import NodeOps
from reconciler.nodeside import ops
from reconciler.nodeside.statedir import StateDir
from reconciler.plan import Plan
from reconciler.redact import register
from reconciler.serving import LABEL_DEPLOYMENT, LABEL_OWNER, LABEL_ROLE, OWNER, ROLE_FRONT
from reconciler.spec import Deployment
from reconciler.spec.imageref import same_image
from reconciler.transport.base import Transport

# "This machine": the boot service, Pi's provider and the records kept where the CLI runs.
HERE = "this machine"
FRONT_ONLY = frozenset({Component.FRONT})


# --- rotate-key -------------------------------------------------------------------------------


def rotate_key(deployment: Deployment, transports: dict[str, Transport], progress: Progress) -> commands.ApplyOutcome:
    """A new key in the key file, then the front's steps alone: the front reads the new key.
    Refused, the key untouched, when the front could not take it now."""
    _, made = commands.live_plan(deployment, transports)
    problem = front_not_ready(made)
    if problem is not None:
        raise ReconcilerError(
            f"the front cannot take a new key now: {problem}; the key is unchanged",
            "run `reconciler apply` (or fix what it names), then `reconciler rotate-key` again",
        )
    request = commands.Converge(doing="reconciler rotate-key", first=write_new_key, only=FRONT_ONLY)
    try:
        return commands.converge(deployment, transports, progress, request)
    except ReconcilerError as exc:
        if not exc.message.startswith("there is no API key"):
            raise ReconcilerError(
                f"{exc.message} (the new key is in place, the front has not taken it yet)",
                "run `reconciler apply` to finish the front; rotating again would make yet another key",
            ) from None
        raise


def front_not_ready(made: Plan) -> str | None:
    """Why the front could not be replaced by its own steps: a blocker of its own, or a step of
    another component it waits for (its image not pulled yet, say)."""
    blocked = [blocker for blocker in made.blockers if blocker.component is Component.FRONT]
    if blocked:
        return f"{blocked[0].node}: {blocked[0].message}"
    by_id = {action.id: action for action in made.actions}
    needed = [
        by_id[dependency].summary
        for action in made.actions
        if action.component is Component.FRONT
        for dependency in action.depends_on
        if dependency in by_id and by_id[dependency].component is not Component.FRONT
    ]
    return f"it waits for {'; '.join(dict.fromkeys(needed))}" if needed else None


def front_pending(outcome: commands.ApplyOutcome) -> list[str]:
    """What the front still has to do after the rotation (its steps, or what blocks it)."""
    after = outcome.after
    steps = [action.summary for action in after.actions if action.component is Component.FRONT]
    return steps + [f"{b.node}: {b.message}" for b in after.blockers if b.component is Component.FRONT]


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
    kind: str  # revision, image, state, cache, store, others, node
    what: str
    bytes: int
    status: str
    releasable: bool = False
    # What releasing it frees (hard-linked files shared with a kept revision stay; an image that
    # also carries a tag of the owner's stays, only our reference goes).
    freed: int = 0
    # Internal: how to release it (a revision's path) and an image's pulled refs.
    handle: str = field(default="", repr=False)
    refs: tuple[str, ...] = field(default=(), repr=False)

    @property
    def key(self) -> tuple[str, str, str]:
        return self.node, self.kind, self.what

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
    items: list[Item] = []
    for node in deployment.nodes:
        if not facts.nodes[node.name].reachable:
            items.append(Item(node.name, "node", "-", 0, "not answering: nothing measured"))
            continue
        try:
            with docker_answers(node.name):
                found = NodeOps(transports[node.name], None).footprint(deployment.state_dir, node.model_dir)
                items += _revision_items(node.name, found, *_wanted_and_kept(deployment, facts, node.name))
                items += _state_items(node.name, found)
                items += _image_items(deployment, node.name, transports[node.name], found["pulled"])
        except NodeUnreachableError as exc:
            items.append(Item(node.name, "node", "-", 0, f"not answering: {exc.message}"))
    return items


@contextlib.contextmanager
def docker_answers(node: str) -> Iterator[None]:
    """A node's Docker that does not answer (dockerd down, a broken socket) is a node not
    answering, in words, not a traceback."""
    import docker
    import requests

    try:
        yield
    except (docker.errors.DockerException, requests.RequestException) as exc:
        raise NodeUnreachableError(
            f"{node}: Docker did not answer ({type(exc).__name__})", f"check that dockerd runs on {node}"
        ) from None


def _wanted_and_kept(deployment: Deployment, facts: Facts, node: str) -> tuple[str | None, set[str] | None]:
    """The commit the spec wants and the ones kept for a rollback, from the head's record and the
    node's own; (None, None) when the head does not answer: then nothing is known to be spare."""
    head = facts.nodes[deployment.head.name]
    if not head.reachable:
        return None, None
    keep = deployment.model.keep_revisions
    kept: set[str] = set()
    for observed in (head, facts.nodes[node]):
        record = observed.checkpoint.record
        kept |= set(record.history[: 1 + keep]) if record is not None else set()
    return desired_commit(deployment.model, head.checkpoint), kept


def _revision_items(node: str, found: ops.Footprint, wanted: str | None, kept: set[str] | None) -> list[Item]:
    items = []
    for revision in found["revisions"]:
        commit = revision["path"].rpartition("@")[2] if "@" in revision["path"] else ""
        partial = f"; {human_bytes(revision['partial_bytes'])} unfinished or split" if revision["partial_bytes"] else ""
        if revision["serving"]:
            status = "served"
        elif kept is None:
            status = "not served; whether it is kept is unknown while the head does not answer"
        elif commit and commit == wanted:
            status = "the spec's revision, being staged"
        elif commit in kept:
            status = "kept for a rollback (model.keep_revisions)"
        else:
            status = "not served, not kept: safe to release"
        releasable = status.endswith("safe to release")
        item = Item(node, "revision", revision["path"], revision["bytes"], status + partial, releasable)
        item.freed, item.handle = (revision["freed"] if releasable else 0), revision["path"]
        items.append(item)
    return items


def _state_items(node: str, found: ops.Footprint) -> list[Item]:
    state = found["state_dir"]
    if state is None:
        return []
    cache, images = found["engine_cache_bytes"], found["image_store_bytes"]
    kept = "the reconciler's files (the API key on the head): kept"
    items = [
        Item(node, "state", state["path"], state["bytes"] - cache - images, kept),
        Item(node, "cache", f"{state['path']}/cache", cache, "the engine's compile cache: kept (a start rebuilds it)"),
    ]
    if images:
        why = "the image as its registry sent it, passed on to peers: kept for the images kept (image.keep_previous)"
        items.append(Item(node, "store", f"{state['path']}/images", images, why))
    return items


def ours(client: Any, pulled: list[ops.PulledImage]) -> dict[str, str]:
    """ref -> image id of each image we pulled that the node still has as that same image."""
    found = {}
    for record in pulled:
        image_id = _image_id(client, record["ref"])
        if image_id is not None and image_id == record["id"]:
            found[record["ref"]] = image_id
    return found


def _image_items(deployment: Deployment, node: str, transport: Transport, pulled: list[ops.PulledImage]) -> list[Item]:
    """Our pulls and the spec's images (in use, needed, or safe to release), then the others as
    one line: an image the reconciler did not pull is never released."""
    client = transport.docker()
    used = {container.image.id for container in _all_containers(client) if container.image is not None}
    needed = _needed_images(deployment, node)
    mine = ours(client, pulled)
    items, others, other_bytes = [], 0, 0
    for image in client.images.list():
        refs = set(image.attrs.get("RepoDigests") or []) | set(image.tags)
        our_refs = sorted(ref for ref, image_id in mine.items() if image_id == image.id)
        spec_refs = sorted(ref for ref in refs if any(same_image(ref, wanted) for wanted in needed))
        size = int(image.attrs.get("Size") or 0)
        if not our_refs and not spec_refs:
            others, other_bytes = others + 1, other_bytes + size
            continue
        status = _image_status(bool(our_refs), image.id in used, bool(spec_refs))
        releasable = status.endswith("safe to release")
        # Removing our references frees the image only when no reference of the owner's is left.
        alone = not (set(image.tags) - set(our_refs)) and set(image.attrs.get("RepoDigests") or []) <= set(our_refs)
        freed = size if releasable and alone else 0
        item = Item(node, "image", short_ref((our_refs or spec_refs)[0]), size, status, releasable, freed)
        item.refs = tuple(our_refs)
        items.append(item)
    if others:
        counted = f"{others} image{'s' if others != 1 else ''}"
        items.append(Item(node, "others", counted, other_bytes, "not pulled by the reconciler: never touched"))
    return items


def _image_status(pulled: bool, in_use: bool, needed: bool) -> str:
    whose = "ours" if pulled else "not pulled by the reconciler"
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


def release(
    deployment: Deployment, transports: dict[str, Transport], items: list[Item], shown: list[Item]
) -> tuple[list[Item], list[str]]:
    """Remove what is releasable now and was shown as releasable (the survey is made again under
    the lock: what changed since the question stays); (released, what failed and why)."""
    asked = {item.key for item in shown if item.releasable}
    done, failed = [], []
    for item in (item for item in items if item.releasable and item.key in asked):
        try:
            if _release_one(deployment, transports, item):
                done.append(item)
        except ReconcilerError as exc:
            failed.append(f"{item.node}: {item.what}: {exc.message}")
    return done, failed


def _release_one(deployment: Deployment, transports: dict[str, Transport], item: Item) -> bool:
    node_ops = NodeOps(transports[item.node], None)
    if item.kind == "revision":
        model_dir = deployment.node(item.node).model_dir
        removed = node_ops.remove_revisions(ops.RemoveRevisionsArgs(model_dir=model_dir, remove=[item.handle]))
        return bool(removed["removed"])
    for ref in item.refs:
        _remove_image(transports[item.node], ref)
        # At once: a record left behind would make a later pull of the owner's look like ours.
        node_ops.remove_file(pull_record(deployment.state_dir, ref))
    return True


def _remove_image(transport: Transport, ref: str) -> None:
    """Remove the reference we pulled (a tag of the owner's on the same image keeps it)."""
    import docker

    try:
        transport.docker().images.remove(ref)
    except docker.errors.NotFound:
        return
    except docker.errors.APIError as exc:  # a container took it up since: it stays
        raise NodeCommandError(
            f"{transport.node}: cannot remove image {short_ref(ref)}: {exc.explanation}",
            "run `reconciler storage` again: it shows what uses the image now",
        ) from None


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
        got = human_bytes(sum(item.freed for item in released))
        lines.append(f"Released {len(released)} of {len(releasable)}: {got} freed.")
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
    # Internal: a container's id, an image's ref, a path.
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


@dataclass
class Uninstalled:
    done: list[Removal] = field(default_factory=list)
    # What could not be removed, and why (a rerun tries again).
    failed: list[str] = field(default_factory=list)


def uninstall_plan(
    deployment: Deployment, transports: dict[str, Transport], spec_path: str, *, checkpoint: bool, unit_dir: Path
) -> UninstallPlan:
    """What uninstall would remove on every node and here, and what it keeps."""
    result = UninstallPlan()
    unit = our_unit(unit_dir, spec_path)
    if unit is not None:
        result.removals.append(Removal(HERE, "service", UNIT_NAME, str(unit), str(unit)))
    for node in deployment.nodes:
        try:
            with docker_answers(node.name):
                _node_removals(deployment, node.name, transports[node.name], checkpoint, result)
        except NodeUnreachableError as exc:
            result.unreachable.append(node.name)
            result.kept.append(Removal(node.name, "node", "not answering", exc.message))
    _local_removals(deployment, result)
    return result


def our_unit(unit_dir: Path, spec_path: str) -> Path | None:
    """The boot service, when it runs this spec (another spec's service is not ours to remove).
    The unit names the spec as install-service was given it; either spelling of this one counts."""
    unit = unit_dir / UNIT_NAME
    try:
        text = unit.read_text(encoding="utf-8")
    except OSError:
        return None
    spellings = {Path(spec_path).absolute(), Path(spec_path).resolve()}
    return unit if any(f"--spec {spelling}" in text for spelling in spellings) else None


def _node_removals(
    deployment: Deployment, node: str, transport: Transport, checkpoint: bool, result: UninstallPlan
) -> None:
    spec_node = deployment.node(node)
    found = NodeOps(transport, None).footprint(deployment.state_dir, spec_node.model_dir)
    if found["guard_running"]:
        result.removals.append(Removal(node, "guard", "memory guard", "stopped"))
    client = transport.docker()
    labels = [f"{LABEL_OWNER}={OWNER}", f"{LABEL_DEPLOYMENT}={deployment.name}"]
    mine = client.containers.list(all=True, filters={"label": labels}, ignore_removed=True)
    for container in mine:
        result.removals.append(Removal(node, "container", container.name, container.status, container.id))
    _image_removals(deployment, node, client, found["pulled"], {c.id for c in mine}, result)
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
        detail = f"{human_bytes(state['bytes'])}: what the reconciler wrote there; the API key and TLS pair on the head"
        result.removals.append(Removal(node, "state", state["path"], detail, state["path"]))


def _image_removals(
    deployment: Deployment,
    node: str,
    client: Any,
    pulled: list[ops.PulledImage],
    our_containers: set[str],
    result: UninstallPlan,
) -> None:
    """Our pulls go unless a container of the owner's runs them; the spec's images we did not
    pull stay, said once."""
    in_use = {c.image.id for c in _all_containers(client) if c.id not in our_containers and c.image is not None}
    mine = ours(client, pulled)
    for ref, image_id in mine.items():
        if image_id in in_use:
            result.kept.append(
                Removal(node, "image", short_ref(ref), "pulled by the reconciler, but a container of yours uses it")
            )
        else:
            result.removals.append(Removal(node, "image", short_ref(ref), "pulled by the reconciler", ref))
    for ref in sorted(_needed_images(deployment, node) - set(mine)):
        if _image_id(client, ref) is not None:
            result.kept.append(
                Removal(node, "image", short_ref(ref), "not pulled by the reconciler: `docker image rm` it")
            )


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
        result.removals.append(Removal(HERE, "records", local, "events, incidents, starts", local))


def uninstall(
    deployment: Deployment,
    transports: dict[str, Transport],
    planned: UninstallPlan,
    *,
    spec_path: str,
    say: Callable[[str], None],
) -> Uninstalled:
    """Remove what the plan lists, in an order that leaves nothing to restart the rest: the
    service first (and no loop left running), then per node the guard, containers, images,
    checkpoint and state dir. A removal that fails is reported and the rest goes on; a rerun
    removes what is left."""
    service_unit = next((Path(r.handle) for r in planned.removals if r.kind == "service"), None)
    if service_unit is not None:
        service.check_can_remove(service_unit)
    outcome = Uninstalled()
    with deployment_lock(deployment, "reconciler uninstall", wait_s=600, on_wait=say):
        checked = False
        for removal in _in_order(planned.removals):
            if removal.kind != "service" and not checked:  # the service's loop is gone by now
                _no_loop_left(spec_path)
                checked = True
            try:
                left = _remove(deployment, transports, removal)
            except ReconcilerError as exc:
                outcome.failed.append(f"{removal.node}: {removal.kind} {removal.what}: {exc.message}")
                continue
            outcome.failed += [f"{removal.node}: {line}" for line in left]
            say(f"removed {removal.line()}" + (" (in part: see below)" if left else ""))
            outcome.done.append(removal)
    _remove_lock_file(deployment)
    return outcome


def _no_loop_left(spec_path: str) -> None:
    """A `reconciler run` of this spec still alive would rebuild what uninstall removes."""
    running = service.loops_running(spec_path)
    if running:
        raise ReconcilerError(
            f"`reconciler run` is running for this spec (pid {', '.join(map(str, running))}); uninstall stopped",
            "stop it (Ctrl-C where it runs, or `sudo systemctl stop` its service), then run uninstall again",
        )


def _remove_lock_file(deployment: Deployment) -> None:
    """The lock's own file, here, and its dir if nothing else is in it (an uninstalled head
    keeps no trace of the lock taken to uninstall it)."""
    path = lock_path(deployment)
    for remove in (path.unlink, path.parent.rmdir):
        try:
            remove()
        except OSError:
            return


KIND_ORDER = ("service", "guard", "container", "image", "checkpoint", "state", "pi", "records")


def _in_order(removals: list[Removal]) -> Iterator[Removal]:
    yield from sorted(removals, key=lambda removal: KIND_ORDER.index(removal.kind))


def _remove(deployment: Deployment, transports: dict[str, Transport], removal: Removal) -> list[str]:
    """Remove one thing; what of it is left, and why."""
    if removal.kind == "service":
        service.uninstall(Path(removal.handle))
        return []
    if removal.kind == "pi":
        from reconciler.pi import agent

        agent.uninstall(deployment.pi.provider)
        return []
    if removal.kind == "records":
        return ops.remove_state_dir(removal.handle)[1]
    with docker_answers(removal.node):
        return _remove_on_node(deployment, transports[removal.node], removal)


def _remove_on_node(deployment: Deployment, transport: Transport, removal: Removal) -> list[str]:
    import docker

    node_ops = NodeOps(transport, None)
    try:
        if removal.kind == "guard":
            node_ops.guard_stop(deployment.state_dir)
        elif removal.kind == "container":
            _remove_container(deployment, transport.docker().containers.get(removal.handle))
        elif removal.kind == "image":
            # The reference we pulled, not the image by id: a tag of the owner's keeps the image.
            transport.docker().images.remove(removal.handle)
        elif removal.kind in {"checkpoint", "state"}:
            model_dir = deployment.node(transport.node).model_dir
            args = ops.RemoveTreesArgs(state_dir=deployment.state_dir, model_dir=model_dir, remove=[removal.kind])
            return node_ops.remove_trees(args)["left"]
    except docker.errors.NotFound:
        return []  # gone already: what uninstall wants
    except docker.errors.APIError as exc:
        raise NodeCommandError(f"{exc.explanation}", "run `reconciler uninstall` again once it is free") from None
    return []


def _remove_container(deployment: Deployment, container: Any) -> None:
    # A rank gets its grace (in-flight requests end); the front holds nothing to finish.
    front = container.labels.get(LABEL_ROLE) == ROLE_FRONT
    if not front and container.status in {"running", "restarting", "paused"}:
        container.stop(timeout=deployment.serving.stop_timeout_s)
    container.remove(force=True)


def render_uninstall_plan(planned: UninstallPlan) -> str:
    if not planned.removals:
        lines = ["Nothing to remove: no trace of this deployment's reconciler is left."]
    else:
        lines = ["Uninstall would remove:"] + [f"  - {removal.line()}" for removal in _in_order(planned.removals)]
    lines += [f"  kept: {kept.line()}" for kept in planned.kept]
    return "\n".join(lines) + "\n"
