"""Gather the facts of every node, one probe round trip per node, nodes in parallel.

`node_facts_from_probe` is pure: it turns the probe's raw observations into NodeFacts and
is tested on recorded probe output; only `gather` touches the network.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from reconciler import hub
from reconciler.clock import utc_iso
from reconciler.errors import ReconcilerError
from reconciler.facts.containers import container_from_inspect
from reconciler.facts.fabric import fabric_from_probe
from reconciler.facts.files import CheckpointFacts, FileFacts, HubFacts, KeyFileFacts, parse_manifest
from reconciler.facts.memory import GuardFacts, GuardTrip, MemoryFacts, parse_meminfo
from reconciler.facts.node import Facts, Hold, NodeFacts, RestartIntent
from reconciler.facts.pi import gather_pi
from reconciler.serving import LABEL_OWNER, OWNER
from reconciler.spec import Deployment, Node, expand_home
from reconciler.transport.base import Transport, run_program


def probe_args(deployment: Deployment, node: Node) -> dict[str, Any]:
    return {
        "state_dir": deployment.state_dir,
        "model_dir": node.model_dir,
        "manifest": deployment.model.manifest,
        "exl3_plan": deployment.model.exl3_plan,
        "key_file": deployment.key_file() if node.role == "head" else None,
        "label": f"{LABEL_OWNER}={OWNER}",
        "gid_index": node.fabric.gid_index,
    }


def node_facts_from_probe(node: Node, raw: dict[str, Any]) -> NodeFacts:
    """The facts of one node from its probe's answer; any part that cannot be read is
    reported as a problem of the node, never raised (the answer reflects files anyone can edit)."""
    try:
        return _node_facts(node, raw)
    except (ValidationError, KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        return NodeFacts(reachable=False, error=f"the node's probe answer cannot be read: {_short(exc)}")


def _short(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}"


def _node_facts(node: Node, raw: dict[str, Any]) -> NodeFacts:
    docker_state = raw["docker"]
    hostname, home = _text(raw.get("hostname")), _text(raw.get("home"))
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
        containers=[container_from_inspect(attrs) for attrs in docker_state["containers"] if isinstance(attrs, dict)],
        guard=_guard(raw),
        api_key=_key_file(raw["key_file"]) if isinstance(raw.get("key_file"), dict) else None,
        hold=_state_file(Hold, raw.get("hold"), Hold(since="unknown (hold.json is unreadable)")),
        restart_intent=_state_file(
            RestartIntent,
            raw.get("restart_intent"),
            RestartIntent(since="unknown", cause="restart-intent.json is unreadable"),
        ),
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _memory(text: object) -> MemoryFacts | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return parse_meminfo(text)
    except (KeyError, ValueError, ValidationError):
        return None


StateFile = TypeVar("StateFile", bound=BaseModel)


def _state_file(model: type[StateFile], raw: object, unreadable: StateFile) -> StateFile | None:
    """A small JSON state file the reconciler wrote (hold, restart intent): absent is None; a file
    that exists but cannot be read counts as present, the cautious reading (held, restart due)."""
    if raw is None:
        return None
    try:
        return model.model_validate(raw)
    except ValidationError:
        return unreadable


def _checkpoint(model_dir: str, raw: dict[str, Any]) -> CheckpointFacts:
    cache = raw.get("hash_cache")
    cache = cache if isinstance(cache, dict) else {}
    files: dict[str, FileFacts] = {}
    for relative, (size, mtime_ns, inode) in raw["model_files"].items():
        cached = cache.get(f"{model_dir.rstrip('/')}/{relative}")
        files[relative] = FileFacts(size=size, sha256=_cached_digest(cached, [size, mtime_ns, inode]))
    manifest = parse_manifest(raw["manifest"]) if isinstance(raw.get("manifest"), str) else None
    return CheckpointFacts(
        files=files,
        manifest=manifest,
        exl3_plan=_text(raw.get("source_plan")),
        staged_plan=_text(raw.get("staged_plan")),
        disk_free=raw.get("disk_free") if isinstance(raw.get("disk_free"), int) else None,
        hub=_cached_listing(raw.get("hub_files")),
    )


def _cached_digest(entry: object, key: list[int]) -> str | None:
    """The cached sha256 when the cache entry is (size, mtime_ns, inode, digest) of this very file."""
    if not isinstance(entry, list) or len(entry) != 4 or entry[:3] != key:
        return None
    digest = entry[3]
    return digest if isinstance(digest, str) and _SHA256_RE.match(digest) else None


_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def _cached_listing(raw: object) -> HubFacts | None:
    """The Hub listing the last download saved; one that cannot be read is asked for again."""
    if not raw:
        return None
    try:
        return HubFacts.model_validate(raw)
    except ValidationError:
        return None


def _guard(raw: dict[str, Any]) -> GuardFacts:
    config = raw.get("guard_config")
    config_hash = config.get("config_hash") if isinstance(config, dict) else None
    unreadable = GuardTrip(at="unknown (memguard.trip.json is unreadable)", mem_available_gib=0.0, floor_gib=0.0)
    return GuardFacts(
        running=bool(raw.get("guard_running")),
        config_hash=config_hash if isinstance(config_hash, str) else None,
        trip=_state_file(GuardTrip, raw.get("guard_trip"), unreadable),
    )


def _key_file(raw: dict[str, Any]) -> KeyFileFacts:
    if not raw.get("present"):
        return KeyFileFacts(present=False)
    mode = raw.get("mode")
    return KeyFileFacts(present=True, empty=raw.get("size", 0) == 0, mode=mode if isinstance(mode, int) else None)


def probe_node(deployment: Deployment, node: Node, transport: Transport) -> NodeFacts:
    try:
        raw = run_program(transport, "probe", "print_probe", probe_args(deployment, node), timeout=120)
    except ReconcilerError as exc:
        return NodeFacts(reachable=False, error=exc.message)
    except (OSError, json.JSONDecodeError) as exc:
        return NodeFacts(reachable=False, error=f"{type(exc).__name__}: {exc}")
    return node_facts_from_probe(node, raw)


def gather(deployment: Deployment, transports: dict[str, Transport]) -> Facts:
    """Probe all nodes at once; an unreachable node becomes facts saying so, not an exception."""
    with ThreadPoolExecutor(max_workers=max(1, len(deployment.nodes))) as pool:
        futures = {
            node.name: pool.submit(probe_node, deployment, node, transports[node.name]) for node in deployment.nodes
        }
        nodes = {name: future.result() for name, future in futures.items()}
    head = deployment.head.name
    nodes[head] = with_hub_listing(deployment, nodes[head])
    pi = gather_pi(deployment.pi.provider) if deployment.pi.enabled else None  # this machine's Pi, local files
    return Facts(taken_at=utc_iso(), nodes=nodes, pi=pi)


def with_hub_listing(deployment: Deployment, head: NodeFacts) -> NodeFacts:
    """Ask the Hub what the checkpoint holds when the head has no listing cached yet.

    One request per pass, and only until the first download wrote the listing to STATE_DIR. A
    Hub that is down, slow or wrong leaves the listing unknown with the reason, which the
    checkpoint component shows as its blocker; nothing else needs the Hub.
    """
    if not head.reachable or head.checkpoint.hub is not None:
        return head
    try:
        update: dict[str, object] = {"hub": hub.list_files(deployment.model).as_facts()}
    except ReconcilerError as exc:
        update = {"hub_error": exc.message}
    checkpoint = head.checkpoint.model_copy(update=update)
    return head.model_copy(update={"checkpoint": checkpoint})
