"""Spec and facts scenarios shared by unit tests and the fixture regenerator.

Scenarios are derived from two fixture files (specs/deployment.yaml and
tests/fixtures/facts/empty.json) so each test states only what differs.
"""

from __future__ import annotations

from pathlib import Path

from reconciler.components.checkpoint import NATIVE_SHARDS
from reconciler.components.fabric import node_contexts
from reconciler.components.memguard import guard_config_hash
from reconciler.facts.containers import ContainerFacts
from reconciler.facts.files import CheckpointFacts, FileFacts, KeyFileFacts
from reconciler.facts.memory import GuardFacts, GuardTrip
from reconciler.facts.node import Facts, NodeFacts, load_facts
from reconciler.serving import RankContainer, render_group, rewrite_exl3_plan
from reconciler.spec import Deployment, load_spec

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


def complete_checkpoint(deployment: Deployment) -> CheckpointFacts:
    model = deployment.model
    manifest = {name: f"{index:02d}" + "ab" * 31 for index, name in enumerate(NATIVE_SHARDS, start=1)}
    files = {name: FileFacts(size=40_000_000_000, sha256=digest) for name, digest in manifest.items()}
    for name in (
        "config.json",
        "model.safetensors.index.json",
        model.manifest,
        f"exl3/plan/{model.exl3_plan}",
    ):
        files[name] = FileFacts(size=4096)
    for bank in ("qn", "q31", "q31s"):
        files[f"exl3/{bank}/L00.part.safetensors"] = FileFacts(size=1_000_000_000)
    return CheckpointFacts(
        files=files, manifest=manifest, exl3_plan=EXL3_PLAN, staged_plan=rewrite_exl3_plan(EXL3_PLAN)
    )


# The model's EXL3 plan as the checkpoint ships it (bank dirs as the publisher's machine had them).
EXL3_PLAN = '{"qdir": "/build/exl3/qn:/build/exl3/q31:/build/exl3/q31s", "layers": 61}\n'


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


def converged_facts(deployment: Deployment | None = None) -> Facts:
    """What the fresh fixture looks like after a successful apply of `deployment`."""
    deployment = deployment or reference_deployment()
    base = empty_facts()
    contexts, blockers = node_contexts(deployment, base)
    assert not blockers, blockers
    containers = {rank.node: rank for rank in render_group(deployment, contexts)}
    nodes: dict[str, NodeFacts] = {}
    for name, observed in base.nodes.items():
        nodes[name] = observed.model_copy(
            update={
                "checkpoint": complete_checkpoint(deployment),
                "images": [deployment.image.ref],
                "containers": [running(containers[name])],
                "guard": GuardFacts(running=True, config_hash=guard_config_hash(deployment)),
                "api_key": KeyFileFacts(present=True, empty=False, mode=0o600)
                if name == deployment.head.name
                else None,
            }
        )
    return base.model_copy(update={"nodes": nodes})


def with_node(facts: Facts, name: str, **changes: object) -> Facts:
    nodes = dict(facts.nodes)
    nodes[name] = nodes[name].model_copy(update=changes)
    return facts.model_copy(update={"nodes": nodes})


def with_container(facts: Facts, node: str, **changes: object) -> Facts:
    container = facts.nodes[node].containers[0].model_copy(update=changes)
    return with_node(facts, node, containers=[container])


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
        "plan-guard-tripped": (
            deployment,
            with_node(
                converged,
                "spark-worker",
                guard=GuardFacts(running=True, config_hash=guard_config_hash(deployment), trip=trip),
            ),
        ),
    }
