"""The checkpoint on every node: download, reassemble parts, verify, copy to peers, stage the plan.

The head downloads from the Hub; a worker copies from the head over the fabric (or downloads
itself when its model_source is hub). A node's checkpoint is done when every expected file is
present and every manifest entry matches its sha256; then its EXL3 plan is staged into the
state dir with bank paths rewritten for the /model mount.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from reconciler.actions import Action, InSync, Outcome, Verb, action_id, shorten
from reconciler.components import hub
from reconciler.errors import NodeCommandError
from reconciler.execution import ApplyContext, Executor
from reconciler.facts.files import CheckpointFacts, parse_manifest
from reconciler.facts.node import Facts
from reconciler.serving import rewrite_exl3_plan
from reconciler.spec import Deployment, Node
from reconciler.transport.base import check

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


def _download(ctx: ApplyContext, action: Action) -> str:
    if ctx.node(action.node).ssh is not None:
        raise NodeCommandError(
            f"{action.node}: downloading on a remote node is not supported yet",
            "set model_source: peer for this worker (the head copies the checkpoint over the fabric)",
        )
    model = ctx.deployment.model
    model_dir = ctx.model_dir(action.node)
    observed = ctx.facts.nodes[action.node].checkpoint
    state = assess(ctx.deployment, observed, observed.manifest)
    _forget(model_dir, state.corrupt)
    # Reference: once the native shards exist, their parts are not fetched again.
    have_shards = all(name in observed.files for name in PARTED_SHARDS)
    ctx.progress.line(f"    {action.node}: downloading {model.repo}@{model.revision} into {model_dir}")
    hub.download_snapshot(model, model_dir, exclude_parts=have_shards)
    return f"{model.repo}@{model.revision} in {model_dir}"


def _forget(model_dir: str, corrupt: list[str]) -> None:
    """Make the Hub client fetch corrupt files again: its metadata would call them complete."""
    for name in corrupt:
        for path in (Path(model_dir) / name, Path(model_dir) / ".cache/huggingface/download" / f"{name}.metadata"):
            path.unlink(missing_ok=True)


def _reassemble(ctx: ApplyContext, action: Action) -> str:
    files = ctx.facts.nodes[action.node].checkpoint.files
    shards = [name for name in PARTED_SHARDS if name not in files]
    built = ctx.ops(action.node, "reassemble", {"model_dir": ctx.model_dir(action.node), "shards": shards})
    return ", ".join(f"{name} ({size} bytes)" for name, size in built.items())


def _verify(ctx: ApplyContext, action: Action) -> str:
    node = action.node
    model_dir = ctx.model_dir(node)
    text = ctx.ops(node, "read_text", {"path": f"{model_dir}/{ctx.deployment.model.manifest}"}).get("text")
    if not text:
        raise NodeCommandError(f"{node}: {ctx.deployment.model.manifest} missing in {model_dir}", _INCOMPLETE_HINT)
    manifest = parse_manifest(text)
    args = {"model_dir": model_dir, "files": sorted(manifest), "cache": ctx.state_path(node, "hashcache.json")}
    hashes = ctx.ops(node, "hash_files", {**args, "deep": ctx.deep_verify}, timeout=6 * 3600)
    missing = sorted(name for name, digest in hashes.items() if digest is None)
    wrong = sorted(name for name, digest in hashes.items() if digest is not None and digest != manifest[name])
    if missing or wrong:
        problems = [f"missing: {shorten(missing)}"] if missing else []
        problems += [f"sha256 mismatch: {shorten(wrong)}"] if wrong else []
        raise NodeCommandError(f"{node}: checkpoint verification failed ({'; '.join(problems)})", _INCOMPLETE_HINT)
    return f"{len(manifest)} files match {ctx.deployment.model.manifest}"


_INCOMPLETE_HINT = (
    "run `reconciler apply` again: the next plan re-fetches exactly the files named (nothing else is deleted)"
)


def _copy(ctx: ApplyContext, action: Action) -> str:
    head = ctx.deployment.head
    worker = ctx.node(action.node)
    if worker.ssh is None:
        raise NodeCommandError(f"{worker.name}: a peer copy needs an ssh: target", "add nodes[].ssh for this worker")
    target = worker.ssh
    destination = ctx.model_dir(worker.name)
    ctx.ops(worker.name, "mkdirs", {"paths": [destination]})
    ssh = ["ssh", "-p", str(target.port), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]
    ssh += ["-o", f"UserKnownHostsFile={os.path.expanduser(target.known_hosts)}"]
    if target.identity_file:
        ssh += ["-i", os.path.expanduser(target.identity_file), "-o", "IdentitiesOnly=yes"]
    remote = f"{target.user + '@' if target.user else ''}{target.host}:{destination}/"
    argv = ["rsync", "-a", "--partial", "--exclude", "*.safetensors.part[0-9][0-9]", "--exclude", ".cache/"]
    argv += ["-e", shlex.join(ssh), f"{ctx.model_dir(head.name).rstrip('/')}/", remote]
    ctx.progress.line(f"    {head.name} -> {worker.name}: rsync over {target.host}")
    check(ctx.transport(head.name).run(argv, timeout=24 * 3600), head.name, "rsync to " + worker.name)
    return f"copied to {worker.name}:{destination}"


def _stage_plan(ctx: ApplyContext, action: Action) -> str:
    node = action.node
    plan_name = ctx.deployment.model.exl3_plan
    source = f"{ctx.model_dir(node)}/exl3/plan/{plan_name}"
    text = ctx.ops(node, "read_text", {"path": source}).get("text")
    if text is None:
        raise NodeCommandError(f"{node}: {source} is missing; the checkpoint is incomplete", _INCOMPLETE_HINT)
    ctx.ops(node, "mkdirs", {"paths": [ctx.state_path(node, "plans"), ctx.state_path(node, "cache")]})
    target = ctx.state_path(node, "plans", plan_name)
    ctx.ops(node, "write_file", {"path": target, "content": rewrite_exl3_plan(text), "mode": 0o644})
    return f"staged {target}"


def _prune(ctx: ApplyContext, action: Action) -> str:
    removed = ctx.ops(action.node, "prune_parts", {"model_dir": ctx.model_dir(action.node)})["removed"]
    return f"deleted {len(removed)} part files"


EXECUTORS: dict[str, Executor] = {
    "download": _download,
    "reassemble": _reassemble,
    "verify": _verify,
    "copy": _copy,
    "stage-plan": _stage_plan,
    "prune": _prune,
}
