"""Gather the facts of every node, one probe round trip per node, nodes in parallel.

`node_facts_from_probe` is pure: it turns the probe's raw observations into NodeFacts and
is tested on recorded probe output; only `gather` touches the network.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from reconciler import hub
from reconciler.errors import ReconcilerError
from reconciler.facts.containers import container_from_inspect
from reconciler.facts.fabric import fabric_from_probe
from reconciler.facts.files import CheckpointFacts, FileFacts, HubFacts, HubFileFacts, KeyFileFacts, parse_manifest
from reconciler.facts.memory import GuardFacts, GuardTrip, parse_meminfo
from reconciler.facts.node import Facts, Hold, NodeFacts, RestartIntent
from reconciler.facts.pi import gather_pi
from reconciler.serving import LABEL_OWNER, OWNER, rewrite_exl3_plan
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
    docker_state = raw["docker"]
    if "error" in docker_state:
        return NodeFacts(
            reachable=False, error=f"docker: {docker_state['error']}", hostname=raw["hostname"], home=raw["home"]
        )
    home = raw["home"]
    return NodeFacts(
        hostname=raw["hostname"],
        home=home,
        memory=parse_meminfo(raw["meminfo"]) if raw.get("meminfo") else None,
        fabric=fabric_from_probe(raw.get("fabric"), ifname=node.fabric.ifname, ip=node.fabric.ip),
        checkpoint=_checkpoint(expand_home(node.model_dir, home), raw),
        images=list(docker_state["images"]),
        containers=[container_from_inspect(attrs) for attrs in docker_state["containers"]],
        guard=_guard(raw),
        api_key=_key_file(raw["key_file"]) if raw.get("key_file") is not None else None,
        hold=Hold.model_validate(raw["hold"]) if raw.get("hold") else None,
        restart_intent=RestartIntent.model_validate(raw["restart_intent"]) if raw.get("restart_intent") else None,
    )


def _checkpoint(model_dir: str, raw: dict[str, Any]) -> CheckpointFacts:
    cache: dict[str, list[Any]] = raw.get("hash_cache") or {}
    files: dict[str, FileFacts] = {}
    for relative, (size, mtime_ns, inode) in raw["model_files"].items():
        cached = cache.get(f"{model_dir.rstrip('/')}/{relative}")
        fresh = cached is not None and cached[:3] == [size, mtime_ns, inode]
        files[relative] = FileFacts(size=size, sha256=cached[3] if fresh and cached else None)
    manifest = parse_manifest(raw["manifest"]) if raw.get("manifest") else None
    listing = HubFacts.model_validate(raw["hub_files"]) if raw.get("hub_files") else None
    return CheckpointFacts(
        files=files, manifest=manifest, plan_staged=_plan_staged(raw), disk_free=raw.get("disk_free"), hub=listing
    )


def _plan_staged(raw: dict[str, Any]) -> bool:
    source, staged = raw.get("source_plan"), raw.get("staged_plan")
    if source is None or staged is None:
        return False
    try:
        return bool(staged == rewrite_exl3_plan(source))
    except (ValueError, KeyError, AttributeError):
        return False


def _guard(raw: dict[str, Any]) -> GuardFacts:
    config = raw.get("guard_config") or {}
    trip = raw.get("guard_trip")
    return GuardFacts(
        running=bool(raw.get("guard_running")),
        config_hash=config.get("config_hash"),
        trip=GuardTrip.model_validate(trip) if trip else None,
    )


def _key_file(raw: dict[str, Any]) -> KeyFileFacts:
    if not raw.get("present"):
        return KeyFileFacts(present=False)
    return KeyFileFacts(present=True, empty=raw.get("size", 0) == 0, mode=raw.get("mode"))


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
    return Facts(taken_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), nodes=nodes, pi=pi)


def with_hub_listing(deployment: Deployment, head: NodeFacts) -> NodeFacts:
    """Ask the Hub what the checkpoint holds when the head has no listing cached yet.

    One request per pass, and only until the first download wrote the listing to STATE_DIR;
    an unreachable Hub leaves the listing unknown (the download step reports the error).
    """
    if not head.reachable or head.checkpoint.hub is not None:
        return head
    try:
        listing = hub.list_files(deployment.model)
    except ReconcilerError:
        return head
    checkpoint = head.checkpoint.model_copy(update={"hub": hub_facts(listing)})
    return head.model_copy(update={"checkpoint": checkpoint})


def hub_facts(listing: hub.HubListing) -> HubFacts:
    files = {item.path: HubFileFacts(size=item.size, sha256=item.sha256) for item in listing.files}
    return HubFacts(commit=listing.commit, files=files)
