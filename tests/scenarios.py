"""Spec and facts scenarios shared by unit tests and the fixture regenerator.

Scenarios are derived from two fixture files (specs/deployment.yaml and
tests/fixtures/facts/empty.json) so each test states only what differs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reconciler.components.assessment import PARTED_SHARDS, is_part
from reconciler.components.checkpoint import placements
from reconciler.components.fabric import node_contexts
from reconciler.components.memguard import guard_config_hash
from reconciler.facts.containers import ContainerFacts
from reconciler.facts.files import (
    CheckpointFacts,
    CheckpointRecord,
    FileFacts,
    HubFacts,
    KeyFileFacts,
    Resolved,
    RevisionFacts,
)
from reconciler.facts.memory import GuardFacts, GuardTrip
from reconciler.facts.node import Facts, NodeFacts, load_facts
from reconciler.facts.revisions import revision_dir
from reconciler.front import LABEL_KEY_VERSION, render_front
from reconciler.init import InitRequest
from reconciler.record import replace
from reconciler.serving import LABEL_ROLE, RankContainer, render_group, rewrite_exl3_plan
from reconciler.spec import Deployment, Node, SshTarget, expand_home, load_spec
from tests.testbed import fakesys

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests/fixtures"
GOLDEN_DIR = FIXTURES / "golden"
SPEC_PATH = ROOT / "specs/deployment.yaml"
EMPTY_FACTS = FIXTURES / "facts/empty.json"
CONVERGED_FACTS = FIXTURES / "facts/converged.json"


def reference_deployment() -> Deployment:
    return load_spec(SPEC_PATH).deployment


def with_serving(deployment: Deployment, **changes: object) -> Deployment:
    serving = deployment.serving.model_copy(update=changes)
    return deployment.model_copy(update={"serving": serving})


def empty_facts() -> Facts:
    return load_facts(EMPTY_FACTS)


COMMIT = "61f9933a00000000000000000000000000000000"
# The model's EXL3 plan as the checkpoint ships it (bank dirs as the publisher's machine had them).
EXL3_PLAN = '{"qdir": "/build/exl3/qn:/build/exl3/q31:/build/exl3/q31s", "layers": 61}\n'


def listing_of(facts: Facts) -> HubFacts:
    """The head's listing of COMMIT in the empty fixture (every file, sizes, sha256, the manifest)."""
    return facts.nodes["spark-head"].checkpoint.hub[COMMIT]


def revision_tree(node: Node, home: str, listing: HubFacts) -> RevisionFacts:
    """A complete, verified revision directory of `listing` on a node, its plan staged."""
    files: dict[str, FileFacts] = {}
    manifest = listing.manifest or {}
    for name, info in listing.files.items():
        if is_part(name):
            continue
        files[name] = FileFacts(size=info.size, sha256=info.sha256 or manifest.get(name))
    for shard in PARTED_SHARDS:
        size = sum(info.size for name, info in listing.files.items() if name.startswith(shard + ".part"))
        files[shard] = FileFacts(size=size, sha256=manifest[shard])
    return RevisionFacts(
        path=revision_dir(expand_home(node.model_dir, home), listing.commit),
        files=files,
        manifest=dict(manifest),
        exl3_plan=EXL3_PLAN,
        staged_plan=rewrite_exl3_plan(EXL3_PLAN),
    )


def complete_checkpoint(deployment: Deployment, node: Node, base: Facts) -> CheckpointFacts:
    """A node that serves COMMIT from its revision directory, as an apply leaves it."""
    observed = base.nodes[node.name]
    assert observed.home is not None
    listing = listing_of(base)
    tree = revision_tree(node, observed.home, listing)
    record = CheckpointRecord(repo=deployment.model.repo, history=[COMMIT])
    if node.role == "head":
        record = record.model_copy(update={"resolved": Resolved(revision=deployment.model.revision, commit=COMMIT)})
    return observed.checkpoint.model_copy(update={"revisions": {COMMIT: tree}, "link": COMMIT, "record": record})


def running(container: RankContainer) -> ContainerFacts:
    return ContainerFacts(
        name=container.name,
        id=f"{container.rank:x}" * 64,
        image=container.image,
        status="running",
        labels=container.labels,
        command=[*container.entrypoint, *container.command],
        env=container.env_dict,
    )


KEY_VERSION = "1764547200000000000:4242:44"


def running_front(deployment: Deployment, home: str) -> ContainerFacts:
    """The front as its start leaves it: rendered, labelled with the key file's version."""
    front = render_front(deployment, home)
    return ContainerFacts(
        name=front.name,
        id="f" * 64,
        image=front.image,
        status="running",
        labels={**front.labels, LABEL_KEY_VERSION: KEY_VERSION},
        command=[*front.entrypoint, *front.command],
        env={},
    )


def converged_facts(deployment: Deployment | None = None) -> Facts:
    """What the fresh fixture looks like after a successful apply of `deployment`."""
    deployment = deployment or reference_deployment()
    base = empty_facts()
    contexts, blockers = node_contexts(deployment, base)
    assert not blockers, blockers
    for name, placed in placements(deployment, base, COMMIT).items():
        contexts[name] = replace(
            contexts[name], model_path=placed.model_path, plans_path=placed.plans_path, commit=placed.commit
        )
    containers = {rank.node: rank for rank in render_group(deployment, contexts)}
    nodes: dict[str, NodeFacts] = {}
    for name, observed in base.nodes.items():
        head = name == deployment.head.name
        assert observed.home is not None
        nodes[name] = observed.model_copy(
            update={
                "checkpoint": complete_checkpoint(deployment, deployment.node(name), base),
                "images": [deployment.image.ref, *([deployment.api.front_image] if head else [])],
                "containers": [
                    running(containers[name]),
                    *([running_front(deployment, observed.home)] if head else []),
                ],
                "guard": GuardFacts(running=True, config_hash=guard_config_hash(deployment)),
                "api_key": KeyFileFacts(present=True, empty=False, mode=0o600, version=KEY_VERSION) if head else None,
            }
        )
    return base.model_copy(update={"nodes": nodes})


def running_on(deployment: Deployment, facts: Facts, commit: str) -> Facts:
    """The facts with every rank running as rendered for revision `commit` (its directory)."""
    contexts, blockers = node_contexts(deployment, facts)
    assert not blockers, blockers
    for name, placed in placements(deployment, facts, commit).items():
        contexts[name] = replace(
            contexts[name], model_path=placed.model_path, plans_path=placed.plans_path, commit=placed.commit
        )
    for rank in render_group(deployment, contexts):
        others = [c for c in facts.nodes[rank.node].containers if c.labels.get(LABEL_ROLE)]
        facts = with_node(facts, rank.node, containers=[running(rank), *others])
    return facts


def with_node(facts: Facts, name: str, **changes: object) -> Facts:
    nodes = dict(facts.nodes)
    nodes[name] = nodes[name].model_copy(update=changes)
    return facts.model_copy(update={"nodes": nodes})


def with_tree_files(facts: Facts, node: str, files: dict[str, FileFacts], drop: list[str] | None = None) -> Facts:
    """The facts with some files of the node's COMMIT revision replaced, added or dropped."""
    checkpoint = facts.nodes[node].checkpoint
    tree = checkpoint.revisions[COMMIT]
    merged = {name: info for name, info in {**tree.files, **files}.items() if name not in (drop or [])}
    revisions = {**checkpoint.revisions, COMMIT: tree.model_copy(update={"files": merged})}
    return with_node(facts, node, checkpoint=checkpoint.model_copy(update={"revisions": revisions}))


def with_hub_sha(facts: Facts, name: str, sha256: str) -> Facts:
    """The facts with the head's listing of COMMIT giving `name` this sha256."""
    checkpoint = facts.nodes["spark-head"].checkpoint
    listing = checkpoint.hub[COMMIT]
    files = {**listing.files, name: replace(listing.files[name], sha256=sha256)}
    hub = {**checkpoint.hub, COMMIT: listing.model_copy(update={"files": files})}
    return with_node(facts, "spark-head", checkpoint=checkpoint.model_copy(update={"hub": hub}))


def with_container(facts: Facts, node: str, **changes: object) -> Facts:
    container = facts.nodes[node].containers[0].model_copy(update=changes)
    return with_node(facts, node, containers=[container])


# Commit B of the test repo: model-00003 and config.json changed, everything else as COMMIT.
COMMIT_B = "7a3f0c1e00000000000000000000000000000000"


def with_revision_b(facts: Facts) -> Facts:
    """The head knows the listing of COMMIT_B as well."""
    checkpoint = facts.nodes["spark-head"].checkpoint
    listing = checkpoint.hub[COMMIT]
    files = dict(listing.files)
    files["model-00003-of-00006.safetensors"] = replace(
        files["model-00003-of-00006.safetensors"], sha256="3b" * 32, size=48_100_000_000 - 4096
    )
    files["config.json"] = replace(files["config.json"], blob_id="b" * 40)
    manifest = {**(listing.manifest or {}), "model-00003-of-00006.safetensors": "3b" * 32}
    b = listing.model_copy(update={"commit": COMMIT_B, "files": files, "manifest": manifest})
    return with_node(
        facts, "spark-head", checkpoint=checkpoint.model_copy(update={"hub": {**checkpoint.hub, COMMIT_B: b}})
    )


def with_revision(deployment: Deployment, revision: str) -> Deployment:
    return deployment.model_copy(update={"model": deployment.model.model_copy(update={"revision": revision})})


def golden_scenarios() -> dict[str, tuple[Deployment, Facts]]:
    """Each golden plan text in tests/fixtures/golden/ comes from one of these."""
    deployment = reference_deployment()
    converged = load_facts(CONVERGED_FACTS)
    trip = GuardTrip(at="2026-11-29T21:04:05Z", mem_available_gib=0.83, floor_gib=1.0)
    return {
        "plan-empty": (deployment, empty_facts()),
        "plan-rank1-exited": (
            deployment,
            with_container(
                converged,
                "spark-worker",
                status="exited",
                exit_code=0,
                finished_at="2026-11-29T21:00:00Z",
            ),
        ),
        "plan-kv-bytes-changed": (with_serving(deployment, kv_bytes=2_000_000_000), converged),
        "plan-revision-change": (with_revision(deployment, COMMIT_B), with_revision_b(converged)),
        "plan-guard-tripped": (
            deployment,
            with_node(
                converged,
                "spark-worker",
                guard=GuardFacts(running=True, config_hash=guard_config_hash(deployment), trip=trip),
            ),
        ),
    }


# ---------------------------------------------------------------- reconciler init

KIB_PER_GIB = 1024 * 1024
TB = 1000**4
INIT_GOLDEN = GOLDEN_DIR / "init-two-sparks.yaml"


def spark_infiniband(ip: str) -> dict[str, Any]:
    """The probe's reading of a Spark's port-1 twins: rocep1s0f1 ACTIVE carrying `ip`, its twin DOWN."""
    return {
        "rocep1s0f1": {
            "ports": {"1": {"state": "4: ACTIVE\n", "gid": fakesys.mapped_gid(ip) + "\n", "gid_type": "RoCE v2\n"}},
            "netdevs": ["enp1s0f1np1"],
        },
        "roceP2p1s0f1": {
            "ports": {"1": {"state": "1: DOWN\n", "gid": fakesys.ZERO_GID + "\n", "gid_type": None}},
            "netdevs": ["enP2p1s0f1np1"],
        },
    }


def spark_ip_addr(ip: str, mgmt: str = "192.168.1.50") -> str:
    """`ip -j addr` of a configured Spark: management enP7s7, fabric enp1s0f1np1 (MTU 9000), docker0."""
    text = (FIXTURES / "fabric/ip-j-addr-testbed-head.json").read_text(encoding="utf-8")
    return text.replace("198.18.10.13", ip).replace("198.19.0.13", mgmt).replace("198.18.21.1", "172.17.0.1")


def init_answer(
    hostname: str,
    ip: str,
    *,
    home: str = "/home/nvidia",
    user: str = "nvidia",
    disk_free: int | None = 3 * TB,
    available_gib: float = 118.0,
    fabric: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A doctor probe's answer from a fresh Spark (no checkpoint, no containers)."""
    meminfo = f"MemTotal: {int(121.6 * KIB_PER_GIB)} kB\nMemAvailable: {int(available_gib * KIB_PER_GIB)} kB\n"
    return {
        "hostname": hostname,
        "home": home,
        "meminfo": meminfo,
        "checkpoint": {"link": None, "legacy": None, "legacy_commit": None, "revisions": {}, "record": None},
        "hash_cache": {},
        "hub_listings": [],
        "disk_free": disk_free,
        "key_file": {"present": False},
        "guard_running": False,
        "guard_config": None,
        "guard_trip": None,
        "hold": None,
        "restart_intent": None,
        "docker": {"containers": [], "images": []},
        "fabric": fabric
        or {"sysfs_root": "/sys", "infiniband": spark_infiniband(ip), "ip_addr": spark_ip_addr(ip), "rdma_link": None},
        "host": {"time": 1000.0, "python": "3.12.3", "user": user, "tools": {}, "docker_info": {}},
    }


def init_two_sparks() -> tuple[InitRequest, dict[str, Any]]:
    """`reconciler init --worker nvidia@192.168.100.11` on a configured pair: the request and the
    answers keyed as `probe_nodes` keys them."""
    worker = SshTarget(host="192.168.100.11", user="nvidia")
    request = InitRequest(head=None, workers=(worker,))
    answers = {
        "node-0": init_answer("spark-a1b2", "192.168.100.10"),
        "node-1": init_answer("spark-c3d4", "192.168.100.11"),
    }
    return request, answers
