"""The checkpoint on every node: download, reassemble parts, verify, copy to peers, stage the plan.

The head downloads from the Hub; a worker copies from the head over the fabric (or downloads
itself when its model_source is hub). A node's checkpoint is done when every expected file is
present and every manifest entry matches its sha256; then its EXL3 plan is staged into the
state dir with bank paths rewritten for the /model mount.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from reconciler import hub
from reconciler.actions import Action, Blocker, InSync, Outcome, Verb, action_id, shorten
from reconciler.errors import NodeCommandError
from reconciler.execution import ApplyContext, Executor
from reconciler.facts.files import CheckpointFacts, HubFacts, parse_manifest
from reconciler.facts.gather import hub_facts
from reconciler.facts.node import Facts
from reconciler.serving import rewrite_exl3_plan
from reconciler.spec import Deployment, Node, SshTarget
from reconciler.transport.base import check, run_program

COMPONENT = "checkpoint"
NATIVE_SHARDS = [f"model-0000{index}-of-00006.safetensors" for index in range(1, 7)]
# The Hub caps one file at 50 GB, so these two Engram shards are stored as .partNN files.
PARTED_SHARDS = NATIVE_SHARDS[4:]
_PART_RE = re.compile(r"^(?P<shard>.+\.safetensors)\.part(?P<index>[0-9]{2})$")


GB = 1000**3
# The reference README's figures for a full checkpoint, used when the Hub cannot say.
FULL_SIZE_HEAD = 700 * GB
FULL_SIZE_WORKER = 470 * GB


def is_part(name: str) -> bool:
    return _PART_RE.match(name) is not None


def part_files(files: Mapping[str, object]) -> list[str]:
    return sorted(name for name in files if is_part(name))


@dataclass(frozen=True)
class Expectation:
    """What a complete checkpoint holds: files (never parts), known sizes, expected sha256."""

    files: list[str]
    sizes: dict[str, int]
    hashes: dict[str, str]


def expectation(deployment: Deployment, manifest: dict[str, str] | None, hub: HubFacts | None) -> Expectation:
    """Reference preflight files, six native shards, the manifest's entries and every Hub file.

    Shards 5 and 6 are on the Hub only as parts: their size is the sum of their parts, their
    hash comes from the manifest. Every other LFS file is checked against the Hub's sha256.
    """
    hub_files = hub.files if hub is not None else {}
    names = {
        "config.json",
        "model.safetensors.index.json",
        deployment.model.manifest,
        f"exl3/plan/{deployment.model.exl3_plan}",
        *NATIVE_SHARDS,
        *(manifest or {}),
        *hub_files,
    }
    sizes = {name: info.size for name, info in hub_files.items() if not is_part(name)}
    for name, info in hub_files.items():
        if (match := _PART_RE.match(name)) is not None:
            sizes[match.group("shard")] = sizes.get(match.group("shard"), 0) + info.size
    hashes = {name: info.sha256 for name, info in hub_files.items() if info.sha256 and not is_part(name)}
    hashes.update(manifest or {})
    return Expectation(sorted(name for name in names if not is_part(name)), sizes, hashes)


@dataclass(frozen=True)
class CheckpointState:
    """How far one node's checkpoint is from done."""

    missing: list[str]
    assemblable: list[str]
    unverified: list[str]
    corrupt: list[str]
    parts: list[str]
    missing_bytes: int
    sizes_known: bool

    @property
    def complete(self) -> bool:
        return not (self.missing or self.assemblable or self.unverified or self.corrupt)


def assess(observed: CheckpointFacts, expect: Expectation) -> CheckpointState:
    files = observed.files
    parts = part_files(files)
    shards_with_parts = {match.group("shard") for part in parts if (match := _PART_RE.match(part))}
    absent = [name for name in expect.files if name not in files]
    assemblable = [name for name in absent if name in PARTED_SHARDS and name in shards_with_parts]
    missing = [name for name in absent if name not in assemblable]
    present = [name for name in expect.hashes if name in files]
    corrupt = sorted(name for name in present if _mismatch(files[name].sha256, expect.hashes[name]))
    unverified = sorted(name for name in present if files[name].sha256 is None)
    refetch = missing + corrupt
    missing_bytes = sum(expect.sizes.get(name, 0) for name in refetch)
    sizes_known = all(name in expect.sizes for name in refetch)
    return CheckpointState(missing, assemblable, unverified, corrupt, parts, missing_bytes, sizes_known)


def _mismatch(actual: str | None, expected: str) -> bool:
    return actual is not None and actual.lower() != expected.lower()


def human_bytes(count: int) -> str:
    for unit, size in (("TB", 1000**4), ("GB", GB), ("MB", 1000**2), ("kB", 1000)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"


def plan_checkpoint(deployment: Deployment, facts: Facts, deep_verify: bool = False) -> Outcome:
    """Checkpoint actions for every reachable node; workers after the head they copy from."""
    outcome = Outcome()
    head = deployment.head
    head_facts = facts.nodes[head.name].checkpoint
    if head_facts.hub is None and head_facts.hub_error is not None:
        return plan_without_hub(deployment, facts, head_facts.hub_error)
    head_done = ""
    if facts.nodes[head.name].reachable:
        expect = expectation(deployment, head_facts.manifest, head_facts.hub)
        head_outcome = _plan_hub_node(deployment, head, head_facts, expect, deep_verify)
        head_done = _last_id(head_outcome, exclude=("prune", "stage-plan"))
        outcome.extend(head_outcome)
    for _, node in deployment.ranked_nodes[1:]:
        node_facts = facts.nodes[node.name]
        if not node_facts.reachable:
            continue
        observed = node_facts.checkpoint
        expect = expectation(deployment, observed.manifest or head_facts.manifest, head_facts.hub)
        if deployment.source_of(node) == "hub":
            outcome.extend(_plan_hub_node(deployment, node, observed, expect, deep_verify))
        else:
            outcome.extend(_plan_peer_node(deployment, node, observed, expect, head, head_done, deep_verify))
    return outcome


def plan_without_hub(deployment: Deployment, facts: Facts, error: str) -> Outcome:
    """The Hub was needed (no listing cached) and failed: nothing can be fetched or fully checked.

    A node whose files match the manifest and whose plan is staged keeps serving: the blocker
    then holds only the checkpoint. A node missing anything holds the ranks too, since they
    cannot start on it; a group that already runs is left alone either way.
    """
    outcome = Outcome()
    head_manifest = facts.nodes[deployment.head.name].checkpoint.manifest
    incomplete: list[str] = []
    for _, node in deployment.ranked_nodes:
        observed = facts.nodes[node.name]
        if not observed.reachable:
            continue
        checkpoint = observed.checkpoint
        state = assess(checkpoint, expectation(deployment, checkpoint.manifest or head_manifest, None))
        if state.complete and checkpoint.plan_staged:
            reason = f"files on disk match {deployment.model.manifest}; not checked against the Hub"
            outcome.in_sync.append(InSync(node.name, COMPONENT, reason))
        else:
            incomplete.append(node.name)
    hint = "the next pass asks the Hub again; check model.endpoint, the network and the token"
    for name in incomplete:
        message = f"checkpoint incomplete and the Hub cannot be asked: {error}"
        outcome.blockers.append(Blocker(name, COMPONENT, message, hint))
    if not incomplete:
        message = f"cannot check the checkpoint against the Hub: {error}"
        hint = f"the files on disk match {deployment.model.manifest}, so the ranks keep serving; {hint}"
        outcome.blockers.append(Blocker(deployment.head.name, COMPONENT, message, hint, holds_ranks=False))
    return outcome


def _last_id(outcome: Outcome, exclude: tuple[str, ...]) -> str:
    skipped = tuple(f"{COMPONENT}.{step}@" for step in exclude)
    ids = [action.id for action in outcome.actions if not action.id.startswith(skipped)]
    return ids[-1] if ids else ""


def _preflight(node: Node, observed: CheckpointFacts, state: CheckpointState, role_full_size: int) -> Blocker | None:
    """Refuse before any byte is written when the missing files cannot fit."""
    if observed.disk_free is None or not (state.missing or state.corrupt or state.assemblable):
        return None
    present = sum(info.size for info in observed.files.values())
    need = state.missing_bytes if state.sizes_known else max(role_full_size - present, 0)
    if need <= observed.disk_free:
        return None
    basis = "" if state.sizes_known else f" (sizes unknown: full size ~{human_bytes(role_full_size)} assumed)"
    return Blocker(
        node.name,
        COMPONENT,
        f"needs {human_bytes(need)} free in {node.model_dir} for the missing files{basis}, "
        f"has {human_bytes(observed.disk_free)}",
        "free space, or point nodes[].model_dir at a larger disk; nothing was written",
    )


def _plan_hub_node(
    deployment: Deployment, node: Node, observed: CheckpointFacts, expect: Expectation, deep_verify: bool
) -> Outcome:
    state = assess(observed, expect)
    full = FULL_SIZE_HEAD if node.role == "head" else FULL_SIZE_WORKER
    blocker = _preflight(node, observed, state, full)
    if blocker is not None:
        return Outcome(blockers=[blocker])
    model = deployment.model
    actions: list[Action] = []
    refetch = state.missing + state.corrupt
    if refetch:
        size = f", {human_bytes(state.missing_bytes)}" if state.sizes_known else ""
        summary = f"download {len(refetch)} files{size} of {model.repo}@{model.revision} into {node.model_dir}"
        actions.append(_action("download", "create", node, summary, _files_cause(state, len(expect.files)), actions))
    to_assemble = state.assemblable or [name for name in state.missing if name in PARTED_SHARDS]
    if to_assemble:
        summary = f"reassemble {', '.join(to_assemble)} from their .partNN files (streaming)"
        cause = "the Hub stores these shards as parts (50 GB per-file limit)"
        actions.append(_action("reassemble", "create", node, summary, cause, actions))
    actions += _verify_and_prune(deployment, node, state, actions, deep_verify=deep_verify)
    return _with_plan_staging(deployment, node, observed, actions)


def _plan_peer_node(
    deployment: Deployment,
    node: Node,
    observed: CheckpointFacts,
    expect: Expectation,
    head: Node,
    head_done: str,
    deep_verify: bool,
) -> Outcome:
    state = assess(observed, expect)
    blocker = _preflight(node, observed, state, FULL_SIZE_WORKER)
    if blocker is not None:
        return Outcome(blockers=[blocker])
    actions: list[Action] = []
    absent = state.missing + state.assemblable + state.corrupt
    if absent:
        size = f" ({human_bytes(state.missing_bytes)})" if state.sizes_known else ""
        summary = f"copy {len(absent)} files{size} from {head.name} over the fabric into {node.model_dir} (resumable)"
        cause = _files_cause(state, len(expect.files))
        actions.append(_action("copy", "create", node, summary, cause, [], after=head_done))
    # Parts are never copied to a worker, so any found there are leftovers to prune.
    worker_state = replace(state, missing=[], assemblable=[], corrupt=[])
    actions += _verify_and_prune(deployment, node, worker_state, actions, force=bool(absent), deep_verify=deep_verify)
    return _with_plan_staging(deployment, node, observed, actions)


def _verify_and_prune(
    deployment: Deployment,
    node: Node,
    state: CheckpointState,
    earlier: list[Action],
    force: bool = False,
    deep_verify: bool = False,
) -> list[Action]:
    actions: list[Action] = []
    if earlier or force or state.unverified or deep_verify:
        if earlier or force:
            cause = "new files must match their sha256 before serving"
        elif state.unverified:
            cause = f"{len(state.unverified)} files changed since last verified: {shorten(state.unverified)}"
        else:
            cause = "deep verify requested: every file is read again"
        summary = (
            f"verify files against {deployment.model.manifest} and the Hub's sha256; re-fetch only those that differ"
        )
        actions.append(_action("verify", "run", node, summary, cause, [*earlier, *actions]))
    parted_refetch = any(name in PARTED_SHARDS for name in state.missing + state.corrupt)
    if (state.parts or parted_refetch) and not deployment.model.keep_parts:
        summary = "delete the .partNN files of reassembled shards"
        cause = "model.keep_parts is false and the native shards are verified"
        actions.append(_action("prune", "remove", node, summary, cause, [*earlier, *actions]))
    return actions


def _with_plan_staging(deployment: Deployment, node: Node, observed: CheckpointFacts, actions: list[Action]) -> Outcome:
    outcome = Outcome(actions=list(actions))
    if actions or not observed.plan_staged:
        cause = (
            "the staged EXL3 plan is missing or differs from the model's"
            if not observed.plan_staged
            else "the checkpoint changes, so the staged plan is rewritten from it"
        )
        summary = f"stage {deployment.state_dir}/plans/{deployment.model.exl3_plan} with banks under /model/exl3"
        outcome.actions.append(_action("stage-plan", "create", node, summary, cause, actions))
    if not outcome.actions:
        outcome.in_sync.append(
            InSync(node.name, COMPONENT, "all expected files present and verified; EXL3 plan staged")
        )
    return outcome


def _action(
    step: str, verb: Verb, node: Node, summary: str, cause: str, earlier: list[Action], after: str = ""
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
    node = action.node
    if ctx.node(node).ssh is not None:
        observed = ctx.facts.nodes[node].checkpoint
        state = assess(observed, expectation(ctx.deployment, observed.manifest, observed.hub))
        fetched = fetch_on_node(ctx, node, patterns_for(state.missing + state.corrupt), force=state.corrupt)
        return f"{len(fetched)} files fetched by {node} itself"
    model = ctx.deployment.model
    model_dir = ctx.model_dir(node)
    observed = ctx.facts.nodes[node].checkpoint
    state = assess(observed, expectation(ctx.deployment, observed.manifest, observed.hub))
    forget(model_dir, state.corrupt)
    # Reference: once the native shards exist, their parts are not fetched again.
    have_shards = all(name in observed.files for name in PARTED_SHARDS)
    refetch = state.missing + state.corrupt
    only = None if not observed.files else patterns_for(refetch)
    ctx.progress.line(f"    {node}: downloading {model.repo}@{model.revision} into {model_dir}")
    listing = hub.fetch(model, model_dir, exclude_parts=have_shards, report=ctx.progress.line, only=only)
    _save_listing(ctx, node, listing)
    return f"{model.repo}@{listing.commit[:12]} in {model_dir}"


def patterns_for(names: list[str]) -> list[str]:
    """Repo paths to fetch for these model files: a parted shard comes as its parts."""
    return [f"{name}.part[0-9][0-9]" if name in PARTED_SHARDS else name for name in names]


def fetch_on_node(ctx: ApplyContext, node: str, patterns: list[str], force: list[str]) -> list[str]:
    """A hub-sourced worker downloads for itself: the head lists, the worker fetches (stdlib, Range resume)."""
    model = ctx.deployment.model
    listing = hub.list_files(model)
    have_shards = all(name in ctx.facts.nodes[node].checkpoint.files for name in PARTED_SHARDS)
    wanted = [item for item in listing.files if any(fnmatch.fnmatchcase(item.path, p) for p in patterns)]
    if have_shards:
        wanted = [item for item in wanted if not is_part(item.path) or item.path.split(".part")[0] in force]
    files = [
        {"path": i.path, "size": i.size, "etag": i.etag, "sha256": i.sha256, "force": i.path in force} for i in wanted
    ]
    args = {
        "endpoint": hub.endpoint(model) or "https://huggingface.co",
        "repo": model.repo,
        "commit": listing.commit,
        "token": hub.token(model),
        "model_dir": ctx.model_dir(node),
        "files": files,
    }
    result = run_program(ctx.transport(node), "fetch", "fetch", args, timeout=24 * 3600, on_line=ctx.node_lines(node))
    return list(result["fetched"])


def _save_listing(ctx: ApplyContext, node: str, listing: hub.HubListing) -> None:
    """Keep the Hub's listing in STATE_DIR: later plans and verifies need no Hub request."""
    content = hub_facts(listing).model_dump_json() + "\n"
    ctx.ops(node, "write_file", {"path": ctx.state_path(node, "hub-files.json"), "content": content})


def forget(model_dir: str, names: list[str]) -> None:
    """Make the Hub client fetch these files again: its metadata would call them complete."""
    for name in names:
        for path in (Path(model_dir) / name, Path(model_dir) / hub.DOWNLOAD_CACHE / f"{name}.metadata"):
            path.unlink(missing_ok=True)


def _reassemble(ctx: ApplyContext, action: Action) -> str:
    node = action.node
    files = ctx.facts.nodes[node].checkpoint.files
    shards = [name for name in PARTED_SHARDS if name not in files or name in _corrupt_on(ctx, node)]
    args = {
        "model_dir": ctx.model_dir(node),
        "shards": shards,
        "expected": _expected_hashes(ctx, node),
        "keep_parts": ctx.deployment.model.keep_parts,
        "cache": ctx.state_path(node, "hashcache.json"),
    }
    built = ctx.ops(node, "reassemble", args)
    return ", ".join(f"{name} ({human_bytes(size)})" for name, size in built.items())


def _corrupt_on(ctx: ApplyContext, node: str) -> list[str]:
    observed = ctx.facts.nodes[node].checkpoint
    return assess(observed, expectation(ctx.deployment, observed.manifest, observed.hub)).corrupt


def _expected_hashes(ctx: ApplyContext, node: str) -> dict[str, str]:
    """Manifest entries (the node's own manifest) plus the Hub's sha256 of every other LFS file."""
    model_dir = ctx.model_dir(node)
    text = ctx.ops(node, "read_text", {"path": f"{model_dir}/{ctx.deployment.model.manifest}"}).get("text")
    if not text:
        raise NodeCommandError(f"{node}: {ctx.deployment.model.manifest} missing in {model_dir}", _INCOMPLETE_HINT)
    head = ctx.deployment.head.name
    cached = ctx.ops(head, "read_text", {"path": ctx.state_path(head, "hub-files.json")}).get("text")
    listing = HubFacts.model_validate_json(cached) if cached else ctx.facts.nodes[head].checkpoint.hub
    return expectation(ctx.deployment, parse_manifest(text), listing).hashes


def _hash(ctx: ApplyContext, node: str, names: list[str], deep: bool) -> dict[str, str | None]:
    args = {"model_dir": ctx.model_dir(node), "files": names, "cache": ctx.state_path(node, "hashcache.json")}
    result: dict[str, str | None] = ctx.ops(node, "hash_files", {**args, "deep": deep}, timeout=6 * 3600)
    return result


def _differing(expected: dict[str, str], actual: dict[str, str | None]) -> tuple[list[str], list[str]]:
    missing = sorted(name for name in expected if actual.get(name) is None)
    wrong = sorted(name for name in expected if actual.get(name) not in (None, expected[name]))
    return missing, wrong


def _verify(ctx: ApplyContext, action: Action) -> str:
    """Hash what changed (or everything, deep), then re-fetch exactly the files that differ."""
    node = action.node
    expected = _expected_hashes(ctx, node)
    missing, wrong = _differing(expected, _hash(ctx, node, sorted(expected), ctx.deep_verify))
    if missing:
        raise NodeCommandError(f"{node}: files missing after the transfer: {shorten(missing)}", _INCOMPLETE_HINT)
    if wrong:
        ctx.progress.line(f"    {node}: sha256 mismatch, re-fetching only: {shorten(wrong)}")
        _refetch(ctx, node, wrong)
        missing, still_wrong = _differing({n: expected[n] for n in wrong}, _hash(ctx, node, wrong, True))
        if missing or still_wrong:
            bad = shorten(missing + still_wrong)
            raise NodeCommandError(f"{node}: still differs after re-fetching: {bad}", "check the disk and the source")
        return f"{len(expected)} files verified; re-fetched {len(wrong)}: {shorten(wrong)}"
    return f"{len(expected)} files match their sha256"


def _refetch(ctx: ApplyContext, node: str, names: list[str]) -> None:
    if ctx.deployment.source_of(ctx.node(node)) == "peer":
        _rsync(ctx, node, names)
        return
    if ctx.node(node).ssh is not None:
        fetch_on_node(ctx, node, patterns_for(names), force=names)
        parted = [name for name in names if name in PARTED_SHARDS]
        if parted:
            ctx.ops(node, "reassemble", {"model_dir": ctx.model_dir(node), "shards": parted})
        return
    model_dir = ctx.model_dir(node)
    forget(model_dir, names)
    parted = [name for name in names if name in PARTED_SHARDS]
    hub.fetch(ctx.deployment.model, model_dir, exclude_parts=False, report=ctx.progress.line, only=patterns_for(names))
    if parted:
        ctx.ops(node, "reassemble", {"model_dir": model_dir, "shards": parted})


_INCOMPLETE_HINT = "run `reconciler apply` again: it re-fetches exactly the files named (nothing else is deleted)"


def _copy(ctx: ApplyContext, action: Action) -> str:
    destination = _rsync(ctx, action.node, None)
    return f"copied to {action.node}:{destination}"


def _rsync(ctx: ApplyContext, node: str, only: list[str] | None) -> str:
    """rsync head -> worker over the worker's SSH target; resumable; parts and caches excluded.

    With `only`, exactly those files are copied again, ignoring size and time (a flipped byte
    keeps both), so nothing else on the worker is touched.
    """
    head = ctx.deployment.head
    worker = ctx.node(node)
    if worker.ssh is None:
        raise NodeCommandError(f"{node}: a peer copy needs an ssh: target", "add nodes[].ssh for this worker")
    target = worker.ssh
    destination = ctx.model_dir(node)
    ctx.ops(node, "mkdirs", {"paths": [destination]})
    argv = rsync_argv(target, ctx.model_dir(head.name), destination, only)
    ctx.progress.line(f"    {head.name} -> {node}: rsync over {target.host}")
    # rsync's progress goes to stdout; redirect it to stderr so it streams like ours.
    command = ["sh", "-c", 'exec "$@" 1>&2', "rsync", *argv]
    result = ctx.transport(head.name).run(command, timeout=24 * 3600, on_line=ctx.node_lines(f"{head.name}->{node}"))
    check(result, head.name, "rsync to " + node)
    return destination


def rsync_argv(target: SshTarget, source_dir: str, destination: str, only: list[str] | None) -> list[str]:
    """The copy's argv: remote paths stay data, whatever characters they hold.

    `--protect-args` (rsync >= 3.0; `--secluded-args` since 3.2.7, which keeps the old name)
    sends the remote paths inside rsync's protocol instead of through the remote shell, so a
    model dir with spaces or `;` can never run anything on the worker.
    """
    ssh = ["ssh", "-p", str(target.port), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]
    ssh += ["-o", f"UserKnownHostsFile={os.path.expanduser(target.known_hosts)}"]
    if target.identity_file:
        ssh += ["-i", os.path.expanduser(target.identity_file), "-o", "IdentitiesOnly=yes"]
    remote = f"{target.user + '@' if target.user else ''}{target.host}:{destination.rstrip('/')}/"
    argv = ["rsync", "-a", "--protect-args", "--partial", "--info=progress2"]
    argv += ["--exclude", "*.safetensors.part[0-9][0-9]", "--exclude", ".cache/", "-e", shlex.join(ssh)]
    source = f"{source_dir.rstrip('/')}/"
    if only is None:
        return [*argv, source, remote]
    return [*argv, "-R", "--ignore-times", *(f"{source}./{name}" for name in only), remote]


def _stage_plan(ctx: ApplyContext, action: Action) -> str:
    node = action.node
    plan_name = ctx.deployment.model.exl3_plan
    source = f"{ctx.model_dir(node)}/exl3/plan/{plan_name}"
    text = ctx.ops(node, "read_text", {"path": source}).get("text")
    if text is None:
        raise NodeCommandError(f"{node}: {source} is missing; the checkpoint is incomplete", _INCOMPLETE_HINT)
    ctx.ops(node, "mkdirs", {"paths": [ctx.state_path(node, "plans"), ctx.state_path(node, "cache")]})
    target = ctx.state_path(node, "plans", plan_name)
    # World-readable like the checkpoint it comes from: the engine in the container reads it.
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
