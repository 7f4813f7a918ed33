"""Gather the facts of every node, one probe round trip per node, nodes in parallel.

`node_facts_from_probe` is pure: it turns the probe's raw observations into NodeFacts and
is tested on recorded probe output; only `gather` touches the network.
"""

from __future__ import annotations

import contextlib
import re
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeGuard, TypeVar

from pydantic import BaseModel, ValidationError

from reconciler import hub
from reconciler.clock import utc_iso
from reconciler.errors import NodeUnreachableError, ReconcilerError, SshConfigError
from reconciler.facts.base import MAX_KERNEL_COUNT, text_or_none
from reconciler.facts.containers import container_from_inspect
from reconciler.facts.fabric import fabric_from_probe, parse_ip_addr
from reconciler.facts.files import (
    FINGERPRINT_RE,
    CheckpointFacts,
    CheckpointRecord,
    FileFacts,
    HubFacts,
    KeyFileFacts,
    RevisionFacts,
    TlsFacts,
)
from reconciler.facts.host import host_from_probe
from reconciler.facts.memory import GuardFacts, GuardTrip, MemoryFacts, memory_windows, parse_meminfo
from reconciler.facts.node import (
    BreakerTrip,
    Facts,
    GroupRestart,
    Hold,
    NodeFacts,
    PulledImage,
    RegistryReach,
    RestartIntent,
)
from reconciler.facts.pi import gather_pi
from reconciler.facts.revisions import desired_commit, is_commit
from reconciler.front import DRAIN_MOUNT
from reconciler.nodeops import NodeOps
from reconciler.nodeside.statedir import StateDir
from reconciler.record import Record
from reconciler.repofiles import SHA256, parse_manifest
from reconciler.serving import LABEL_OWNER, OWNER
from reconciler.spec import Deployment, Model, Node, expand_home
from reconciler.spec.imageref import digest_of, registry_of
from reconciler.transport.base import Transport, run_program
from reconciler.transport.sshroute import SshRoute


def probe_args(deployment: Deployment, node: Node) -> dict[str, Any]:
    return {
        "state_dir": deployment.state_dir,
        "model_dir": node.model_dir,
        "manifest": deployment.model.manifest,
        "exl3_plan": deployment.model.exl3_plan,
        "key_file": deployment.key_file() if node.role == "head" else None,
        "tls_files": list(deployment.tls_files() or ()) if node.role == "head" else [],
        "label": f"{LABEL_OWNER}={OWNER}",
        "gid_index": node.fabric.gid_index,
        "head": node.role == "head",
        "front_drain": DRAIN_MOUNT if node.role == "head" else None,
        "registry": _registry_check(deployment, node),
    }


def _registry_check(deployment: Deployment, node: Node) -> dict[str, Any] | None:
    """What the probe connects to when the node lacks the image and pulls it from its registry."""
    if deployment.image_source_of(node) == "peer":
        return None
    ref = deployment.image.ref
    host, port = registry_of(ref).address
    return {"ref": ref, "digest": digest_of(ref), "host": host, "port": port}


def node_facts_from_probe(node: Node, raw: dict[str, Any]) -> NodeFacts:
    """The facts of one node from its probe's answer; any part that cannot be read is
    reported as a problem of the node, never raised (the answer reflects files anyone can edit)."""
    try:
        return _node_facts(node, raw)
    except (ValidationError, KeyError, TypeError, ValueError, AttributeError, IndexError, ArithmeticError) as exc:
        return NodeFacts(reachable=False, error=f"the node's probe answer cannot be read: {_short(exc)}")


def _short(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}"


def _node_facts(node: Node, raw: dict[str, Any]) -> NodeFacts:
    docker_state = raw["docker"]
    hostname, home = text_or_none(raw.get("hostname")), text_or_none(raw.get("home"))
    if "error" in docker_state:
        return NodeFacts(reachable=False, error=f"docker: {docker_state['error']}", hostname=hostname, home=home)
    if home is None or not home.startswith("/"):
        return NodeFacts(reachable=False, error="the node did not say its home directory", hostname=hostname)
    return NodeFacts(
        hostname=hostname,
        home=home,
        memory=_memory(raw.get("meminfo")),
        fabric=fabric_from_probe(raw.get("fabric"), ifname=node.fabric.ifname, ip=node.fabric.ip),
        checkpoint=_checkpoint(expand_home(node.model_dir, home), raw),
        images=[ref for ref in docker_state["images"] if isinstance(ref, str)],
        image_store=_image_store(raw.get("image_store")),
        registry=_state_file(RegistryReach, raw.get("registry"), None),
        pulled=_pulled(raw.get("pulled")),
        containers=[container_from_inspect(attrs) for attrs in docker_state["containers"] if isinstance(attrs, dict)],
        guard=_guard(raw),
        api_key=_key_file(raw["key_file"]) if isinstance(raw.get("key_file"), dict) else None,
        tls=_tls(raw.get("tls"), raw.get("fabric")),
        hold=_state_file(Hold, raw.get("hold"), Hold(since="unknown (hold.json is unreadable)")),
        restart_intent=_state_file(
            RestartIntent,
            raw.get("restart_intent"),
            RestartIntent(since="unknown", cause="restart-intent.json is unreadable"),
        ),
        restarts=_restarts(raw.get("restarts")),
        front_draining=raw.get("front_draining") is True,
        host=host_from_probe(raw.get("host_facts")),
        breaker=_state_file(
            BreakerTrip, raw.get("breaker"), BreakerTrip(since="unknown", cause="breaker.json is unreadable")
        ),
    )


def _image_store(raw: object) -> dict[str, int]:
    """The digests a node's image store holds whole, and their bytes; anything else is left out."""
    if not isinstance(raw, dict):
        return {}
    return {
        digest: size
        for digest, size in raw.items()
        if isinstance(digest, str) and digest_of(f"x@{digest}") == digest and isinstance(size, int) and size >= 0
    }


def _pulled(raw: object) -> list[PulledImage]:
    """Our pull records; one that cannot be read is left out (its image is then never pruned)."""
    read = (_state_file(PulledImage, item, None) for item in (raw if isinstance(raw, list) else []))
    return [item for item in read if item is not None]


def _restarts(raw: object) -> list[GroupRestart]:
    """The recorded unplanned restarts; entries that cannot be read are left out (the count can
    only fall short, which errs towards one more restart, never a hold without a cause)."""
    entries = raw.get("restarts") if isinstance(raw, dict) else None
    read = (_state_file(GroupRestart, item, None) for item in (entries if isinstance(entries, list) else []))
    return [item for item in read if item is not None]


def _memory(text: object) -> MemoryFacts | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return parse_meminfo(text)
    except (KeyError, ValueError, ValidationError):
        return None


StateFile = TypeVar("StateFile", bound=BaseModel)


def _state_file(model: type[StateFile], raw: object, unreadable: StateFile | None) -> StateFile | None:
    """A small JSON state file the reconciler wrote (hold, restart intent, a cached listing): absent
    is None; a file that exists but cannot be read is `unreadable`, for a hold or a restart intent
    the cautious reading (held, restart due)."""
    if raw is None:
        return None
    try:
        return model.model_validate(raw)
    except ValidationError:
        return unreadable


def _checkpoint(model_dir: str, raw: dict[str, Any]) -> CheckpointFacts:
    state = raw["checkpoint"]
    digests = _Digests(raw.get("hash_cache"))
    revisions = {commit: digests.tree(tree) for commit, tree in dict(state.get("revisions") or {}).items()}
    legacy = state.get("legacy")
    return CheckpointFacts(
        revisions=revisions,
        link=_linked_commit(state.get("link"), model_dir, revisions),
        legacy=digests.tree(legacy) if isinstance(legacy, dict) else None,
        legacy_commit=text_or_none(state.get("legacy_commit")),
        record=_state_file(CheckpointRecord, state.get("record"), None),
        disk_free=_signed_kernel_count(raw.get("disk_free")),
        hub=_cached_listings(raw.get("hub_listings")),
    )


def _signed_kernel_count(value: object) -> int | None:
    """A signed 64-bit count the probe reported, or None (unknown) when it is none."""
    if isinstance(value, int) and not isinstance(value, bool) and -MAX_KERNEL_COUNT - 1 <= value <= MAX_KERNEL_COUNT:
        return value
    return None


def _linked_commit(target: object, model_dir: str, revisions: dict[str, RevisionFacts]) -> str | None:
    """The commit of the revision directory model_dir links to (a link elsewhere is no revision)."""
    if not isinstance(target, str):
        return None
    name = target.rstrip("/").rsplit("/", 1)[-1]
    base, _, commit = name.partition("@")
    linked = base == model_dir.rstrip("/").rsplit("/", 1)[-1] and commit in revisions
    return commit if linked else None


def _cache_entry(entry: object) -> TypeGuard[list[Any]]:
    """A hash cache entry: [size, mtime_ns, inode, sha256]."""
    if not isinstance(entry, list) or len(entry) != 4 or not all(isinstance(value, int) for value in entry[:3]):
        return False
    return isinstance(entry[3], str) and re.match(SHA256, entry[3]) is not None


class _Digests:
    """The node's hash cache: by path, and by (size, mtime_ns, inode), so that a file hardlinked
    into another revision keeps the hash verified under its first name."""

    def __init__(self, cache: object) -> None:
        self.by_path: dict[str, str] = {}
        self.by_inode: dict[tuple[int, int, int], str] = {}
        for path, entry in (cache if isinstance(cache, dict) else {}).items():
            if _cache_entry(entry):
                self.by_path[str(path)] = entry[3]
                self.by_inode[(entry[0], entry[1], entry[2])] = entry[3]

    def tree(self, raw: dict[str, Any]) -> RevisionFacts:
        root = str(raw["path"]).rstrip("/")
        files = {
            relative: FileFacts(size=size, sha256=self.by_inode.get((size, mtime_ns, inode)))
            for relative, (size, mtime_ns, inode) in dict(raw.get("files") or {}).items()
        }
        manifest = raw.get("manifest")
        return RevisionFacts(
            path=root,
            files=files,
            manifest=parse_manifest(manifest) if isinstance(manifest, str) else None,
            exl3_plan=text_or_none(raw.get("exl3_plan")),
            staged_plan=text_or_none(raw.get("staged_plan")),
        )


def _cached_listings(raw: object) -> dict[str, HubFacts]:
    """The listings the head cached, by commit; one that cannot be read is asked for again."""
    listings = (_state_file(HubFacts, item, None) for item in (raw if isinstance(raw, list) else []))
    return {listing.commit: listing for listing in listings if listing is not None}


def _guard(raw: dict[str, Any]) -> GuardFacts:
    config = raw.get("guard_config")
    unreadable = GuardTrip(at="unknown (memguard.trip.json is unreadable)", mem_available_gib=0.0, floor_gib=0.0)
    windows, window_s = memory_windows(raw.get("guard_record"))
    return GuardFacts(
        running=bool(raw.get("guard_running")),
        config_hash=text_or_none(config.get("config_hash")) if isinstance(config, dict) else None,
        trip=_state_file(GuardTrip, raw.get("guard_trip"), unreadable),
        windows=windows,
        window_s=window_s,
    )


def _tls(raw: object, fabric: object) -> TlsFacts | None:
    """The front's certificate and key, described without the key's content, and the addresses
    a self-signed certificate names (the node's own, as `ip addr` lists them)."""
    if not isinstance(raw, dict):
        return None
    cert, key = raw.get("cert"), raw.get("key")
    fingerprint = cert.get("fingerprint") if isinstance(cert, dict) else None
    return TlsFacts(
        cert=_key_file(cert) if isinstance(cert, dict) else KeyFileFacts(),
        key=_key_file(key) if isinstance(key, dict) else KeyFileFacts(),
        fingerprint=fingerprint if isinstance(fingerprint, str) and FINGERPRINT_RE.fullmatch(fingerprint) else None,
        addresses=_own_addresses(fabric),
    )


def _own_addresses(fabric: object) -> list[str]:
    """The usable IPv4 addresses of the node's interfaces that are up; none when unreadable."""
    text = fabric.get("ip_addr") if isinstance(fabric, dict) else None
    if not isinstance(text, str):
        return []
    try:
        netdevs = parse_ip_addr(text)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError):
        return []  # odd `ip` output: the fabric check reports it; the certificate names fewer addresses
    return [str(address.ip) for netdev in netdevs.values() if netdev.up for address in netdev.usable][:16]


def _key_file(raw: dict[str, Any]) -> KeyFileFacts:
    if not raw.get("present"):
        return KeyFileFacts(present=False)
    mode = raw.get("mode")
    version = text_or_none(raw.get("version"))
    return KeyFileFacts(
        present=True, empty=raw.get("size", 0) == 0, mode=mode if isinstance(mode, int) else None, version=version
    )


class NodeProbe(Record):
    """What one node's probe answered, or why it did not; the send/receive times bound its clock."""

    raw: dict[str, Any] | None = None
    error: str | None = None
    hint: str = ""
    # The login itself failed (the node, its address or the ssh config), not the probe.
    ssh_failed: bool = False
    sent_at: float = 0.0
    received_at: float = 0.0
    route: SshRoute | None = None  # how the ssh config routed the connection (set by doctor)

    @property
    def host(self) -> dict[str, Any]:
        return (self.raw or {}).get("host") or {}

    @property
    def docker_error(self) -> str | None:
        docker = (self.raw or {}).get("docker") or {}
        return str(docker["error"]) if "error" in docker else None


def probe_every_node(
    deployment: Deployment, transports: dict[str, Transport], *, doctor: bool = False
) -> dict[str, NodeProbe]:
    """The probe on every node at once (with the doctor's extra checks when asked): what each
    answered, or why it did not; never an exception for one node that fails."""
    with ThreadPoolExecutor(max_workers=max(1, len(deployment.nodes))) as pool:
        futures = {
            node.name: pool.submit(_probe, deployment, node, transports[node.name], doctor=doctor)
            for node in deployment.nodes
        }
        return {name: future.result() for name, future in futures.items()}


def _probe(deployment: Deployment, node: Node, transport: Transport, *, doctor: bool) -> NodeProbe:
    sent = time.time()
    args = {**probe_args(deployment, node), "doctor": True} if doctor else probe_args(deployment, node)
    try:
        raw = run_program(transport, "probe", "print_probe", args, timeout=600 if doctor else 120)
    except (NodeUnreachableError, SshConfigError) as exc:
        return NodeProbe(error=exc.message, hint=exc.hint, ssh_failed=True)
    except ReconcilerError as exc:
        return NodeProbe(error=exc.message, hint=exc.hint)
    except OSError as exc:
        return NodeProbe(error=f"{type(exc).__name__}: {exc}", hint="install python3 on the node")
    if not isinstance(raw, dict):
        return NodeProbe(error="the probe's answer is not a JSON object", hint="check python3 on the node")
    return NodeProbe(raw=raw, sent_at=sent, received_at=time.time())


def gather(deployment: Deployment, transports: dict[str, Transport], *, update_revision: bool = False) -> Facts:
    """Probe all nodes at once; an unreachable node becomes facts saying so, not an exception."""
    probes = probe_every_node(deployment, transports)
    nodes = {name: probe_facts(deployment.node(name), probe) for name, probe in probes.items()}
    head = deployment.head.name
    nodes[head] = with_hub_listing(deployment, nodes[head], transports[head], update_revision=update_revision)
    pi = gather_pi(deployment.pi.provider) if deployment.pi.enabled else None  # this machine's Pi, local files
    return Facts(taken_at=utc_iso(), nodes=nodes, pi=pi)


def probe_facts(node: Node, probe: NodeProbe, *, without_docker: bool = False) -> NodeFacts:
    """The facts from one probe: a node whose probe failed is unreachable. `without_docker` (the
    doctor) reads the rest of the answer when Docker alone did not answer, to check it all."""
    if probe.raw is None:
        return NodeFacts(reachable=False, error=probe.error)
    if without_docker and probe.docker_error is not None:
        return node_facts_from_probe(node, {**probe.raw, "docker": {"containers": [], "images": []}})
    return node_facts_from_probe(node, probe.raw)


def with_hub_listing(
    deployment: Deployment, head: NodeFacts, transport: Transport | None = None, *, update_revision: bool = False
) -> NodeFacts:
    """What the Hub says, as far as the plan needs it.

    For a branch or tag, where it points now (one light request: the plan pins it, and says when
    it moved). For the commit to serve, its listing and manifest, unless the head has them
    cached; a listing asked for is cached (STATE_DIR/hub/) so later passes need no Hub. A Hub
    that is down, slow or wrong leaves what it would have said unknown, with the reason, which
    the checkpoint component shows as its blocker; nothing else needs the Hub.
    """
    if not head.reachable:
        return head
    model = deployment.model
    checkpoint = head.checkpoint
    problem: str | None = None
    if not is_commit(model.revision):
        try:
            upstream = hub.within_deadline(model, "resolving the revision", lambda: hub.resolve(model))
            checkpoint = checkpoint.model_copy(update={"upstream": upstream})
        except ReconcilerError as exc:
            problem = exc.message
    commit = desired_commit(model, checkpoint, update=update_revision)
    if commit is not None and commit not in checkpoint.hub:
        try:
            listing = hub.within_deadline(model, f"listing {model.repo}@{commit[:12]}", partial(_listed, model, commit))
        except ReconcilerError as exc:
            problem = exc.message
        else:
            checkpoint = checkpoint.model_copy(update={"hub": {**checkpoint.hub, commit: listing}})
            _cache_listing(deployment, transport, listing)
            problem = None
    if problem is not None and (commit is None or commit not in checkpoint.hub):
        checkpoint = checkpoint.model_copy(update={"hub_error": problem})
    return head.model_copy(update={"checkpoint": checkpoint})


def _listed(model: Model, commit: str) -> HubFacts:
    listing = hub.list_files(model, commit)
    files = {item.path: item for item in listing.files}
    return HubFacts(commit=listing.commit, files=files, manifest=hub.manifest_entries(model, commit))


def listing_path(deployment: Deployment, commit: str) -> str:
    return StateDir(deployment.state_dir).hub_listing(deployment.model.repo, commit)


def _cache_listing(deployment: Deployment, transport: Transport | None, listing: HubFacts) -> None:
    """Keep a listing the Hub gave: a commit's files never change, so it is never asked again.
    A cache, not a change to the deployment: a failure to write it costs one request next pass."""
    if transport is None:
        return
    with contextlib.suppress(ReconcilerError, OSError):
        NodeOps(transport, deployment.state_dir, timeout=60).write_file(
            listing_path(deployment, listing.commit), listing.model_dump_json() + "\n"
        )
