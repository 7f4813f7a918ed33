"""Running the image's steps: a pull from the registry, the head's fetch into its image store, a
peer's copy of the blobs it lacks, a pull from the node's own store, and the pruning of images
we pulled that are no longer kept.

The store (reconciler/nodeside/imagestore.py) holds the image as its registry sent it:
manifests and compressed layers by digest. Docker keeps only unpacked layers, so a node cannot
pass on what it pulled; the store can, and a pull from it through a registry relay on the
node's loopback gives Docker the very manifest the digest names, so the image carries the pinned
digest on every node whatever its local image ID.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from reconciler.actions import Action, Copy, CopyImage, FetchImage, PruneImages, Pull, runs
from reconciler.components.image import Layers, record_pull, short_ref
from reconciler.components.rsync import rsync_streams
from reconciler.errors import NodeCommandError
from reconciler.nodeside.statedir import StateDir
from reconciler.pipeline import Board, Feed
from reconciler.spec.imageref import Registry, digest_of, registry_of
from reconciler.transport.base import run_program

if TYPE_CHECKING:
    from reconciler.execution import ApplyContext
    from reconciler.transport.base import LineSink

# A transfer of tens of GB on a slow link: bounded, but never by a guess at the link's speed.
TRANSFER_TIMEOUT_S = 24 * 3600
PULL_PREFIX = "@pull "
_PULL_HINT = "check the registry is reachable from the node and the digest exists (docker pull by hand to see more)"


def _pull(ctx: ApplyContext, action: Action, pull: Pull) -> str:
    if pull.from_store:
        return _pull_from_store(ctx, action, pull)
    return _pull_from_registry(ctx, action, pull)


def _pull_from_registry(ctx: ApplyContext, action: Action, pull: Pull) -> str:
    ref = pull.ref
    client = ctx.transport(action.node).docker()
    if _image_id(client, ref) is not None:
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
    image_id = _image_id(client, ref)
    if image_id is None:
        raise NodeCommandError(f"{action.node}: {short_ref(ref)} still missing after the pull", _PULL_HINT)
    record_pull(ctx, action.node, ref, image_id, front=bool(action.target))
    return f"pulled {short_ref(ref)}"


def _image_id(client: Any, ref: str) -> str | None:
    import docker

    try:
        return str(client.images.get(ref).id)
    except docker.errors.ImageNotFound:
        return None


def _store(ctx: ApplyContext, node: str) -> str:
    return ctx.state_dir(node).image_store


def _fetch(ctx: ApplyContext, action: Action, fetch: FetchImage) -> str:
    node = action.node
    insecure = _insecure_registry(ctx.transport(node).docker(), registry_of(fetch.ref).api_host)
    args = {"store": _store(ctx, node), "ref": fetch.ref, "insecure": insecure}
    answer = _run(ctx, node, "fetch", args)
    blobs = answer["record"]["blobs"]
    fetched = int(answer.get("fetched_bytes", 0))
    return f"{len(blobs)} blobs of {short_ref(fetch.ref)} in the store, {_size(fetched)} fetched from the registry"


def _insecure_registry(client: Any, host: str) -> bool:
    """Whether the node's Docker may reach this registry over plain HTTP (its insecure
    registries, or a loopback address, which Docker always allows): the fetch then does too."""
    import ipaddress

    name = Registry(host, "").address[0]
    config = client.info().get("RegistryConfig") or {}
    index = (config.get("IndexConfigs") or {}).get(host) or {}
    if index.get("Secure") is False or name in ("localhost", "127.0.0.1"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    cidrs = config.get("InsecureRegistryCIDRs") or []
    return address.is_loopback or any(address in ipaddress.ip_network(cidr, strict=False) for cidr in cidrs)


def _copy(ctx: ApplyContext, action: Action, copy: CopyImage) -> str:
    """rsync the blobs of the image the node's store lacks from the source's store, then have
    the node check the new ones against their digests before its store lists the image."""
    node, origin = action.node, copy.source_node
    record = _record(ctx, origin, copy.ref)
    survey = _run(ctx, node, "survey", {"store": _store(ctx, node)})
    here = survey["blobs"]
    missing = {_blob_path(digest): size for digest, size in record["blobs"].items() if here.get(digest) != size}
    # A blob at its size is checked unless a record here already vouches for it: an rsync cut
    # short may leave a file of the right size that never finished (its checksum unread).
    vouched = {digest for held in survey["refs"].values() for digest in held["blobs"]}
    source_dir, destination_dir = _store(ctx, origin), _store(ctx, node)
    if missing:
        rsync = Copy(
            source_node=origin,
            source_dir=source_dir,
            destination_dir=destination_dir,
            files=None,
            bytes=sum(missing.values()),
            sizes=missing,
            fabric=copy.fabric,
        )
        feed = Feed(Board(origin), missing, released=True)
        daemon = StateDir(ctx.deployment.state_dir).image_copy_daemon
        rsync_streams(ctx, node, rsync, missing, feed, _landed, daemon_dir=daemon)
    verify = [digest for digest in record["blobs"] if digest not in vouched]
    _run(ctx, node, "adopt", {"store": destination_dir, "record": record, "verify": verify})
    kept = len(record["blobs"]) - len(missing)
    return (
        f"copied {len(missing)} blobs ({_size(sum(missing.values()))}) of {short_ref(copy.ref)} from {origin} to "
        f"{node}; {kept} already there"
    )


def _landed(names: list[str]) -> None:
    """Nothing to do as each batch lands: the blobs are checked all at once after the copy."""
    del names


def _record(ctx: ApplyContext, node: str, ref: str) -> dict[str, Any]:
    """The source store's record of the image: every blob a pull needs, and their sizes."""
    digest = digest_of(ref)
    held = _run(ctx, node, "survey", {"store": _store(ctx, node)})["refs"]
    record = held.get(digest) if isinstance(held, dict) else None
    if not isinstance(record, dict) or not isinstance(record.get("blobs"), dict):
        raise NodeCommandError(
            f"{node}: its image store does not hold {short_ref(ref)} whole",
            "run `reconciler plan` again: the copy's source changed since the plan",
        )
    return record


def _blob_path(digest: str) -> str:
    return "blobs/sha256/" + digest.removeprefix("sha256:")


def _pull_from_store(ctx: ApplyContext, action: Action, pull: Pull) -> str:
    node = action.node
    layers = Layers()
    report = ctx.progress.reporter()
    lines = ctx.node_lines(node)

    def take(line: str) -> None:
        if not line.startswith(PULL_PREFIX):
            lines(line)
            return
        try:
            event = json.loads(line[len(PULL_PREFIX) :])
        except ValueError:
            return
        if isinstance(event, dict) and layers.take(event):
            report(layers.counter())

    answer = _run(ctx, node, "pull", {"store": _store(ctx, node), "ref": pull.ref}, on_line=take)
    local, image_id = str(answer["local_ref"]), str(answer["id"])
    record_pull(ctx, node, local, image_id)
    done = sum(1 for status in layers.status.values() if status == "Pull complete")
    return f"{short_ref(pull.ref)} loaded from the node's image store as {short_ref(local)} ({done} layers new)"


def _prune(ctx: ApplyContext, action: Action, prune: PruneImages) -> str:
    """Untag each image we pulled that is no longer kept (Docker removes an image with its last
    name; a name of the owner's keeps it), forget its record, and trim the store."""
    import docker

    node = action.node
    client = ctx.transport(node).docker()
    removed, kept = [], []
    for ref in prune.remove:
        try:
            client.images.remove(ref)
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.APIError as exc:  # a child image, a container made from it since the plan
            kept.append(f"{short_ref(ref)} ({exc.explanation})")
            _mark_refused(ctx, node, ref, str(exc.explanation))
            continue
        ctx.ops(node).remove_file(ctx.state_dir(node).pulled_images + "/" + _record_name(ref))
        removed.append(short_ref(ref))
    freed = _run(ctx, node, "prune", {"store": _store(ctx, node), "keep": prune.keep})["freed_bytes"]
    parts = [f"removed {', '.join(removed) or 'no image'}", f"store trimmed by {_size(int(freed))}"]
    parts += [f"kept {', '.join(kept)}"] if kept else []
    return "; ".join(parts)


def _mark_refused(ctx: ApplyContext, node: str, ref: str, why: str) -> None:
    """Keep the record with Docker's reason: the image stays ours (uninstall may still remove it),
    and no later plan asks Docker to remove it again."""
    record = next((item for item in ctx.facts.nodes[node].pulled if item.ref == ref), None)
    if record is None:
        return
    kept = {"ref": ref, "id": record.id, "at": record.at, "role": record.role or "serving", "refused": why[:500]}
    path = ctx.state_dir(node).pulled_images + "/" + _record_name(ref)
    ctx.ops(node).write_file(path, json.dumps(kept) + "\n")


def _record_name(ref: str) -> str:
    from reconciler.components.image import pull_record

    return pull_record("", ref).rsplit("/", 1)[-1]


def _run(ctx: ApplyContext, node: str, call: str, args: dict[str, Any], on_line: LineSink | None = None) -> Any:
    transport = ctx.transport(node)
    lines = on_line or ctx.node_lines(node)
    return run_program(transport, "imagestore", call, args, timeout=TRANSFER_TIMEOUT_S, on_line=lines)


def _size(count: int) -> str:
    from reconciler.fsutil import human_bytes

    return human_bytes(count)


EXECUTORS = (runs(Pull, _pull), runs(FetchImage, _fetch), runs(CopyImage, _copy), runs(PruneImages, _prune))
