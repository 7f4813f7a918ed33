"""The checkpoint on every node: download, reassemble parts, verify, copy to peers, stage the plan.

The head downloads from the Hub; a worker copies from the head over the fabric (or downloads
itself when its model_source is hub). A node's checkpoint is done when every expected file is
present and every manifest entry matches its sha256; then its EXL3 plan is staged into the
state dir with bank paths rewritten for the /model mount.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from reconciler.actions import Action, InSync, Outcome, Verb, action_id, shorten
from reconciler.facts.files import CheckpointFacts
from reconciler.facts.node import Facts
from reconciler.spec import Deployment, Node

COMPONENT = "checkpoint"
NATIVE_SHARDS = [f"model-0000{index}-of-00006.safetensors" for index in range(1, 7)]
# The Hub caps one file at 50 GB, so these two Engram shards are stored as .partNN files.
PARTED_SHARDS = NATIVE_SHARDS[4:]
_PART_RE = re.compile(r"^(?P<shard>.+\.safetensors)\.part(?P<index>[0-9]{2})$")


def expected_files(deployment: Deployment, manifest: dict[str, str] | None) -> list[str]:
    """The reference preflight files, all six native shards, the manifest and its entries."""
    names = {
        "config.json",
        "model.safetensors.index.json",
        deployment.model.manifest,
        f"exl3/plan/{deployment.model.exl3_plan}",
        *NATIVE_SHARDS,
        *(manifest or {}),
    }
    return sorted(name for name in names if not _PART_RE.match(name))


def part_files(files: Mapping[str, object]) -> list[str]:
    return sorted(name for name in files if _PART_RE.match(name))


@dataclass(frozen=True)
class CheckpointState:
    """How far one node's checkpoint is from done."""

    missing: list[str]
    assemblable: list[str]
    unverified: list[str]
    corrupt: list[str]
    parts: list[str]

    @property
    def complete(self) -> bool:
        return not (self.missing or self.assemblable or self.unverified or self.corrupt)


def assess(deployment: Deployment, observed: CheckpointFacts, manifest: dict[str, str] | None) -> CheckpointState:
    files = observed.files
    parts = part_files(files)
    shards_with_parts = {match.group("shard") for part in parts if (match := _PART_RE.match(part))}
    absent = [name for name in expected_files(deployment, manifest) if name not in files]
    assemblable = [name for name in absent if name in PARTED_SHARDS and name in shards_with_parts]
    missing = [name for name in absent if name not in assemblable]
    expected_hashes = manifest or {}
    present_listed = [name for name in expected_hashes if name in files]
    corrupt = [name for name in present_listed if _mismatch(files[name].sha256, expected_hashes[name])]
    unverified = [name for name in present_listed if files[name].sha256 is None]
    return CheckpointState(missing, assemblable, sorted(unverified), sorted(corrupt), parts)


def _mismatch(actual: str | None, expected: str) -> bool:
    return actual is not None and actual.lower() != expected.lower()


def plan_checkpoint(deployment: Deployment, facts: Facts) -> Outcome:
    """Checkpoint actions for every reachable node; workers after the head they copy from."""
    outcome = Outcome()
    head = deployment.head
    head_facts = facts.nodes[head.name].checkpoint
    head_manifest = head_facts.manifest
    head_done = ""
    if facts.nodes[head.name].reachable:
        head_outcome = _plan_hub_node(deployment, head, head_facts, head_manifest)
        # Workers copy verified files; they need not wait for pruning or plan staging.
        head_done = _last_id(head_outcome, exclude=("prune", "stage-plan"))
        outcome.extend(head_outcome)
    for _, node in deployment.ranked_nodes[1:]:
        node_facts = facts.nodes[node.name]
        if not node_facts.reachable:
            continue
        manifest = node_facts.checkpoint.manifest or head_manifest
        if deployment.source_of(node) == "hub":
            outcome.extend(_plan_hub_node(deployment, node, node_facts.checkpoint, manifest))
        else:
            outcome.extend(_plan_peer_node(deployment, node, node_facts.checkpoint, manifest, head, head_done))
    return outcome


def _last_id(outcome: Outcome, exclude: tuple[str, ...]) -> str:
    skipped = tuple(f"{COMPONENT}.{step}@" for step in exclude)
    ids = [action.id for action in outcome.actions if not action.id.startswith(skipped)]
    return ids[-1] if ids else ""


def _plan_hub_node(
    deployment: Deployment, node: Node, observed: CheckpointFacts, manifest: dict[str, str] | None
) -> Outcome:
    state = assess(deployment, observed, manifest)
    model = deployment.model
    actions: list[Action] = []
    refetch = state.missing + state.corrupt
    if refetch:
        actions.append(
            _action(
                "download",
                "create",
                node,
                f"download {model.repo}@{model.revision} into {node.model_dir}",
                _files_cause(state, len(expected_files(deployment, manifest))),
                actions,
            )
        )
    to_assemble = state.assemblable or [name for name in state.missing if name in PARTED_SHARDS]
    if to_assemble:
        actions.append(
            _action(
                "reassemble",
                "create",
                node,
                f"reassemble {', '.join(to_assemble)} from their .partNN files (streaming)",
                "the Hub stores these shards as parts (50 GB per-file limit)",
                actions,
            )
        )
    actions += _verify_and_prune(deployment, node, state, actions)
    return _with_plan_staging(deployment, node, observed, actions)


def _plan_peer_node(
    deployment: Deployment,
    node: Node,
    observed: CheckpointFacts,
    manifest: dict[str, str] | None,
    head: Node,
    head_done: str,
) -> Outcome:
    state = assess(deployment, observed, manifest)
    actions: list[Action] = []
    absent = state.missing + state.assemblable + state.corrupt
    if absent:
        actions.append(
            _action(
                "copy",
                "create",
                node,
                f"copy the checkpoint from {head.name} over the fabric into {node.model_dir} (resumable, no parts)",
                _files_cause(state, len(expected_files(deployment, manifest))),
                [],
                after=head_done,
            )
        )
    # Parts are never copied to a worker, so any found there are leftovers to prune.
    worker_state = CheckpointState([], [], state.unverified, [], state.parts)
    actions += _verify_and_prune(deployment, node, worker_state, actions, force_verify=bool(absent))
    return _with_plan_staging(deployment, node, observed, actions)


def _verify_and_prune(
    deployment: Deployment,
    node: Node,
    state: CheckpointState,
    earlier: list[Action],
    force_verify: bool = False,
) -> list[Action]:
    actions: list[Action] = []
    if earlier or force_verify or state.unverified:
        cause = (
            "new files must match the manifest before serving"
            if earlier or force_verify
            else f"{len(state.unverified)} files not verified since they changed: {shorten(state.unverified)}"
        )
        actions.append(
            _action(
                "verify",
                "run",
                node,
                f"verify files against {deployment.model.manifest} (sha256, hash cache); re-fetch any that differ",
                cause,
                [*earlier, *actions],
            )
        )
    parted_refetch = any(name in PARTED_SHARDS for name in state.missing + state.corrupt)
    if (state.parts or parted_refetch) and not deployment.model.keep_parts:
        actions.append(
            _action(
                "prune",
                "remove",
                node,
                "delete the .partNN files of reassembled shards",
                "model.keep_parts is false and the native shards are verified",
                [*earlier, *actions],
            )
        )
    return actions


def _with_plan_staging(deployment: Deployment, node: Node, observed: CheckpointFacts, actions: list[Action]) -> Outcome:
    outcome = Outcome(actions=list(actions))
    if actions or not observed.plan_staged:
        outcome.actions.append(
            _action(
                "stage-plan",
                "create",
                node,
                f"stage {deployment.state_dir}/plans/{deployment.model.exl3_plan} with banks under /model/exl3",
                "the staged EXL3 plan is missing or differs from the model's"
                if not observed.plan_staged
                else "the checkpoint changes, so the staged plan is rewritten from it",
                actions,
            )
        )
    if not outcome.actions:
        outcome.in_sync.append(
            InSync(node.name, COMPONENT, "all expected files present and verified; EXL3 plan staged")
        )
    return outcome


def _action(
    step: str,
    verb: Verb,
    node: Node,
    summary: str,
    cause: str,
    earlier: list[Action],
    after: str = "",
) -> Action:
    """An action that runs after the last of `earlier` (or after `after`, another node's step)."""
    depends = (earlier[-1].id,) if earlier else ((after,) if after else ())
    return Action(action_id(COMPONENT, step, node.name), COMPONENT, verb, node.name, summary, cause, depends)


def _files_cause(state: CheckpointState, total: int) -> str:
    parts = []
    absent = state.missing + state.assemblable
    if absent:
        parts.append(f"{len(absent)} of {total} expected files missing: {shorten(absent)}")
    if state.corrupt:
        parts.append(f"sha256 mismatch (re-fetched, nothing else deleted): {shorten(state.corrupt)}")
    return "; ".join(parts)


def rewrite_exl3_plan(plan_text: str) -> str:
    """Point the plan's bank dirs at the read-only /model mount; nothing else changes.

    Reference: p["qdir"] = ":".join("/model/exl3/" + d.split("/")[-1] for d in p["qdir"].split(":"))
    """
    plan = json.loads(plan_text)
    plan["qdir"] = ":".join(
        "/model/exl3/" + directory.rstrip("/").split("/")[-1] for directory in plan["qdir"].split(":")
    )
    return json.dumps(plan, indent=1) + "\n"
