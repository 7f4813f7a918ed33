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
from typing import Literal

from reconciler import hub
from reconciler.actions import (
    Action,
    Blocker,
    Copy,
    Download,
    HubFile,
    InSync,
    Outcome,
    Payload,
    Prune,
    Reassemble,
    Shard,
    StagePlan,
    Step,
    Verb,
    Verify,
    action,
    shorten,
)
from reconciler.errors import NodeCommandError
from reconciler.execution import ApplyContext, Executor, payload_of
from reconciler.facts.files import CheckpointFacts, HubFacts, parse_manifest
from reconciler.facts.node import Facts
from reconciler.serving import rewrite_exl3_plan
from reconciler.spec import Deployment, Model, Node, SshTarget, expand_home
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
    head_view = view_of(deployment, facts, head)
    if head_view is not None:
        expect = expectation(deployment, head_facts.manifest, head_facts.hub)
        head_outcome = _plan_hub_node(deployment, head_view, expect, head_facts.hub, deep_verify)
        head_done = _last_id(head_outcome, exclude=(Step.PRUNE, Step.STAGE_PLAN))
        outcome.extend(head_outcome)
    for _, node in deployment.ranked_nodes[1:]:
        view = view_of(deployment, facts, node)
        if view is None:
            continue
        expect = expectation(deployment, view.observed.manifest or head_facts.manifest, head_facts.hub)
        if deployment.source_of(node) == "hub":
            outcome.extend(_plan_hub_node(deployment, view, expect, head_facts.hub, deep_verify))
        elif head_view is not None:
            outcome.extend(_plan_peer_node(deployment, view, expect, head_view, head_done, deep_verify))
    return outcome


@dataclass(frozen=True)
class NodeView:
    """A node's checkpoint as planning sees it: the facts and the node's own absolute paths."""

    node: Node
    observed: CheckpointFacts
    model_dir: str
    state_dir: str


def view_of(deployment: Deployment, facts: Facts, node: Node) -> NodeView | None:
    observed = facts.nodes[node.name]
    if not observed.reachable or observed.home is None:
        return None
    home = observed.home
    model_dir = expand_home(node.model_dir, home).rstrip("/")
    return NodeView(node, observed.checkpoint, model_dir, expand_home(deployment.state_dir, home).rstrip("/"))


def staged_plan_current(deployment: Deployment, observed: CheckpointFacts) -> bool:
    """Whether the staged EXL3 plan is the model's plan rewritten for the /model mount."""
    del deployment
    if observed.exl3_plan is None or observed.staged_plan is None:
        return False
    try:
        return observed.staged_plan == rewrite_exl3_plan(observed.exl3_plan)
    except (ValueError, KeyError, AttributeError, TypeError):
        return False


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
        if state.complete and staged_plan_current(deployment, checkpoint):
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


def _last_id(outcome: Outcome, exclude: tuple[Step, ...]) -> str:
    ids = [item.id for item in outcome.actions if item.step not in exclude]
    return ids[-1] if ids else ""


def _preflight(view: NodeView, state: CheckpointState, role_full_size: int) -> Blocker | None:
    """Refuse before any byte is written when the missing files cannot fit."""
    node, observed = view.node, view.observed
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
    deployment: Deployment, view: NodeView, expect: Expectation, listing: HubFacts | None, deep_verify: bool
) -> Outcome:
    node, observed = view.node, view.observed
    state = assess(observed, expect)
    full = FULL_SIZE_HEAD if node.role == "head" else FULL_SIZE_WORKER
    blocker = _preflight(view, state, full)
    if blocker is not None:
        return Outcome(blockers=[blocker])
    model = deployment.model
    actions: list[Action] = []
    refetch = state.missing + state.corrupt
    if refetch:
        size = f", {human_bytes(state.missing_bytes)}" if state.sizes_known else ""
        summary = f"download {len(refetch)} files{size} of {model.repo}@{model.revision} into {node.model_dir}"
        payload = Download(
            repo=model.repo,
            commit=listing.commit if listing is not None else model.revision,
            model_dir=view.model_dir,
            files=repo_files(refetch, listing),
            whole_repo=not observed.files,
            refetch=state.corrupt,
            on_node=node.ssh is not None,
        )
        cause = _files_cause(state, len(expect.files))
        actions.append(_action(Step.DOWNLOAD, "create", node, summary, cause, payload, actions))
    to_assemble = state.assemblable or [name for name in state.missing if name in PARTED_SHARDS]
    if to_assemble:
        summary = f"reassemble {', '.join(to_assemble)} from their .partNN files (streaming)"
        cause = "the Hub stores these shards as parts (50 GB per-file limit)"
        assemble = Reassemble(
            model_dir=view.model_dir,
            shards=[Shard(name=name, sha256=expect.hashes.get(name)) for name in to_assemble],
            keep_parts=model.keep_parts,
            manifest=model.manifest,
            cache=f"{view.state_dir}/{HASH_CACHE}",
        )
        actions.append(_action(Step.REASSEMBLE, "create", node, summary, cause, assemble, actions))
    source = _Refetch(source="node-hub" if node.ssh is not None else "hub", commit=_commit(listing, model))
    actions += _verify_and_prune(deployment, view, state, expect, source, actions, deep_verify=deep_verify)
    return _with_plan_staging(deployment, view, actions)


def _commit(listing: HubFacts | None, model: Model) -> str:
    return listing.commit if listing is not None else model.revision


def repo_files(names: list[str], listing: HubFacts | None) -> list[HubFile]:
    """The repo files that bring these model files: a parted shard comes as its `.partNN` files."""
    files: list[HubFile] = []
    for name in names:
        if listing is None:
            files.append(HubFile(path=patterns_for([name])[0], size=None))
            continue
        if name in PARTED_SHARDS:
            parts = sorted(path for path in listing.files if _shard_of(path) == name)
            files += [
                HubFile(path=part, size=listing.files[part].size, sha256=listing.files[part].sha256) for part in parts
            ]
        elif name in listing.files:
            files.append(HubFile(path=name, size=listing.files[name].size, sha256=listing.files[name].sha256))
        else:
            files.append(HubFile(path=name, size=None))
    return files


def _shard_of(path: str) -> str | None:
    match = _PART_RE.match(path)
    return match.group("shard") if match else None


def _plan_peer_node(
    deployment: Deployment,
    view: NodeView,
    expect: Expectation,
    head: NodeView,
    head_done: str,
    deep_verify: bool,
) -> Outcome:
    node, observed = view.node, view.observed
    state = assess(observed, expect)
    blocker = _preflight(view, state, FULL_SIZE_WORKER)
    if blocker is not None:
        return Outcome(blockers=[blocker])
    actions: list[Action] = []
    absent = state.missing + state.assemblable + state.corrupt
    if absent:
        size = f" ({human_bytes(state.missing_bytes)})" if state.sizes_known else ""
        summary = (
            f"copy {len(absent)} files{size} from {head.node.name} over the fabric into {node.model_dir} (resumable)"
        )
        payload = Copy(
            source_node=head.node.name,
            source_dir=head.model_dir,
            destination_dir=view.model_dir,
            files=None if not observed.files else sorted(absent),
            bytes=state.missing_bytes,
        )
        cause = _files_cause(state, len(expect.files))
        actions.append(_action(Step.COPY, "create", node, summary, cause, payload, [], after=head_done))
    # Parts are never copied to a worker, so any found there are leftovers to prune.
    worker_state = replace(state, missing=[], assemblable=[], corrupt=[])
    source = _Refetch(source="peer", commit=_commit(None, deployment.model), peer_dir=head.model_dir)
    actions += _verify_and_prune(
        deployment, view, worker_state, expect, source, actions, force=bool(absent), deep_verify=deep_verify
    )
    return _with_plan_staging(deployment, view, actions)


@dataclass(frozen=True)
class _Refetch:
    source: Literal["hub", "peer", "node-hub"]
    commit: str
    peer_dir: str | None = None


def _verify_and_prune(
    deployment: Deployment,
    view: NodeView,
    state: CheckpointState,
    expect: Expectation,
    refetch: _Refetch,
    earlier: list[Action],
    force: bool = False,
    deep_verify: bool = False,
) -> list[Action]:
    node = view.node
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
        payload = Verify(
            model_dir=view.model_dir,
            files=dict(sorted(expect.hashes.items())),
            manifest=deployment.model.manifest,
            cache=f"{view.state_dir}/{HASH_CACHE}",
            deep=deep_verify,
            refetch_from=refetch.source,
            repo=deployment.model.repo,
            commit=refetch.commit,
            peer_dir=refetch.peer_dir,
        )
        actions.append(_action(Step.VERIFY, "run", node, summary, cause, payload, [*earlier, *actions]))
    parted_refetch = any(name in PARTED_SHARDS for name in state.missing + state.corrupt)
    if (state.parts or parted_refetch) and not deployment.model.keep_parts:
        summary = "delete the .partNN files of reassembled shards"
        cause = "model.keep_parts is false and the native shards are verified"
        payload_prune = Prune(model_dir=view.model_dir)
        actions.append(_action(Step.PRUNE, "remove", node, summary, cause, payload_prune, [*earlier, *actions]))
    return actions


def _with_plan_staging(deployment: Deployment, view: NodeView, actions: list[Action]) -> Outcome:
    node, observed = view.node, view.observed
    outcome = Outcome(actions=list(actions))
    staged = staged_plan_current(deployment, observed)
    if actions or not staged:
        cause = (
            "the staged EXL3 plan is missing or differs from the model's"
            if not staged
            else "the checkpoint changes, so the staged plan is rewritten from it"
        )
        summary = f"stage {deployment.state_dir}/plans/{deployment.model.exl3_plan} with banks under /model/exl3"
        payload = StagePlan(
            source=f"{view.model_dir}/exl3/plan/{deployment.model.exl3_plan}",
            target=f"{view.state_dir}/plans/{deployment.model.exl3_plan}",
            content=_rewritten(observed.exl3_plan) if not actions else None,
        )
        outcome.actions.append(_action(Step.STAGE_PLAN, "create", node, summary, cause, payload, actions))
    if not outcome.actions:
        outcome.in_sync.append(
            InSync(node.name, COMPONENT, "all expected files present and verified; EXL3 plan staged")
        )
    return outcome


def _rewritten(plan_text: str | None) -> str | None:
    """The staged plan as the ranks need it, when the model's plan is known and readable now."""
    if plan_text is None:
        return None
    try:
        return rewrite_exl3_plan(plan_text)
    except (ValueError, KeyError, AttributeError, TypeError):
        return None


def _action(
    step: Step,
    verb: Verb,
    node: Node,
    summary: str,
    cause: str,
    payload: Payload,
    earlier: list[Action],
    after: str = "",
) -> Action:
    """An action that runs after the last of `earlier` (or after `after`, another node's step)."""
    depends = (earlier[-1].id,) if earlier else ((after,) if after else ())
    return action(step, node.name, verb, summary, cause, payload, depends)


def _files_cause(state: CheckpointState, total: int) -> str:
    parts = []
    absent = state.missing + state.assemblable
    if absent:
        parts.append(f"{len(absent)} of {total} expected files missing: {shorten(absent)}")
    if state.corrupt:
        parts.append(f"sha256 mismatch (re-fetched, nothing else deleted): {shorten(state.corrupt)}")
    return "; ".join(parts)


# ------------------------------------------------------------------ executors: run the payload

HASH_CACHE = "hashcache.json"
_INCOMPLETE_HINT = "run `reconciler apply` again: it re-fetches exactly the files named (nothing else is deleted)"


def _download(ctx: ApplyContext, action: Action) -> str:
    download = payload_of(action, Download)
    if download.on_node:
        fetched = fetch_on_node(ctx, action.node, download.model_dir, download.files, download.commit, download.refetch)
        return f"{len(fetched)} files fetched by {action.node} itself"
    model = ctx.deployment.model
    forget(download.model_dir, download.refetch)
    only = None if download.whole_repo else [item.path for item in download.files]
    ctx.progress.line(
        f"    {action.node}: downloading {download.repo}@{download.commit[:12]} into {download.model_dir}"
    )
    listing = hub.fetch(model, download.model_dir, commit=download.commit, report=ctx.progress.line, only=only)
    _save_listing(ctx, action.node, listing)
    return f"{download.repo}@{listing.commit[:12]} in {download.model_dir}"


def patterns_for(names: list[str]) -> list[str]:
    """Repo paths to fetch for these model files: a parted shard comes as its parts."""
    return [f"{name}.part[0-9][0-9]" if name in PARTED_SHARDS else name for name in names]


def fetch_on_node(
    ctx: ApplyContext, node: str, model_dir: str, files: list[HubFile], commit: str, force: list[str]
) -> list[str]:
    """A hub-sourced worker downloads for itself with the node-side fetcher (stdlib, Range resume).

    Entries the plan could only name by pattern (no listing then) are listed now, at the commit.
    """
    model = ctx.deployment.model
    if any(item.size is None for item in files):
        listing = hub.list_files(model, commit)
        patterns = [item.path for item in files]
        wanted = [item for item in listing.files if any(fnmatch.fnmatchcase(item.path, p) for p in patterns)]
        files = [HubFile(path=item.path, size=item.size, sha256=item.sha256) for item in wanted]
        commit = listing.commit
    entries = [
        {
            "path": item.path,
            "size": item.size,
            "etag": item.sha256 or f"{commit[:16]}",
            "sha256": item.sha256,
            "force": (_shard_of(item.path) or item.path) in force,
        }
        for item in files
    ]
    args = {
        "endpoint": hub.endpoint(model) or "https://huggingface.co",
        "repo": model.repo,
        "commit": commit,
        "token": hub.token(model),
        "model_dir": model_dir,
        "files": entries,
    }
    result = run_program(ctx.transport(node), "fetch", "fetch", args, timeout=24 * 3600, on_line=ctx.node_lines(node))
    return list(result["fetched"])


def _save_listing(ctx: ApplyContext, node: str, listing: hub.HubListing) -> None:
    """Keep the Hub's listing in STATE_DIR: later plans and verifies need no Hub request."""
    content = listing.as_facts().model_dump_json() + "\n"
    ctx.ops(node, "write_file", {"path": ctx.state_path(node, "hub-files.json"), "content": content})


def forget(model_dir: str, names: list[str]) -> None:
    """Make the Hub client fetch these files again: its metadata would call them complete."""
    for name in names:
        for path in (Path(model_dir) / name, Path(model_dir) / hub.DOWNLOAD_CACHE / f"{name}.metadata"):
            path.unlink(missing_ok=True)


def _manifest_hashes(ctx: ApplyContext, node: str, model_dir: str, manifest: str) -> dict[str, str]:
    """The manifest as it is on the node now (the download may just have brought it)."""
    text = ctx.ops(node, "read_text", {"path": f"{model_dir}/{manifest}"}).get("text")
    if not isinstance(text, str):
        raise NodeCommandError(f"{node}: {manifest} missing in {model_dir}", _INCOMPLETE_HINT)
    return parse_manifest(text)


def _reassemble(ctx: ApplyContext, action: Action) -> str:
    reassemble = payload_of(action, Reassemble)
    expected = {shard.name: shard.sha256 for shard in reassemble.shards if shard.sha256}
    if len(expected) < len(reassemble.shards):
        manifest = _manifest_hashes(ctx, action.node, reassemble.model_dir, reassemble.manifest)
        expected = {**{s.name: manifest[s.name] for s in reassemble.shards if s.name in manifest}, **expected}
    args = {
        "model_dir": reassemble.model_dir,
        "shards": [shard.name for shard in reassemble.shards],
        "expected": expected,
        "keep_parts": reassemble.keep_parts,
        "cache": reassemble.cache,
    }
    built = ctx.ops(action.node, "reassemble", args)
    return ", ".join(f"{name} ({human_bytes(size)})" for name, size in built.items())


def _hash(ctx: ApplyContext, node: str, verify: Verify, names: list[str], deep: bool) -> dict[str, str | None]:
    args = {"model_dir": verify.model_dir, "files": names, "cache": verify.cache, "deep": deep}
    result: dict[str, str | None] = ctx.ops(node, "hash_files", args, timeout=6 * 3600)
    return result


def _differing(expected: dict[str, str], actual: dict[str, str | None]) -> tuple[list[str], list[str]]:
    missing = sorted(name for name in expected if actual.get(name) is None)
    wrong = sorted(name for name in expected if actual.get(name) not in (None, expected[name]))
    return missing, wrong


def _verify(ctx: ApplyContext, action: Action) -> str:
    """Hash what changed (or everything, deep), then re-fetch exactly the files that differ.

    The hashes are the plan's (the Hub's sha256) plus the manifest's entries as the file is on
    the node now: a fresh node gets the manifest with the download this verify follows.
    """
    node, verify = action.node, payload_of(action, Verify)
    manifest = _manifest_hashes(ctx, node, verify.model_dir, verify.manifest)
    expected = {**{name: digest for name, digest in verify.files.items() if digest}, **manifest}
    missing, wrong = _differing(expected, _hash(ctx, node, verify, sorted(expected), verify.deep))
    if missing:
        raise NodeCommandError(f"{node}: files missing after the transfer: {shorten(missing)}", _INCOMPLETE_HINT)
    if wrong:
        ctx.progress.line(f"    {node}: sha256 mismatch, re-fetching only: {shorten(wrong)}")
        _refetch(ctx, node, verify, wrong)
        missing, still_wrong = _differing({n: expected[n] for n in wrong}, _hash(ctx, node, verify, wrong, True))
        if missing or still_wrong:
            bad = shorten(missing + still_wrong)
            raise NodeCommandError(f"{node}: still differs after re-fetching: {bad}", "check the disk and the source")
        return f"{len(expected)} files verified; re-fetched {len(wrong)}: {shorten(wrong)}"
    return f"{len(expected)} files match their sha256"


def _refetch(ctx: ApplyContext, node: str, verify: Verify, names: list[str]) -> None:
    """Fetch again exactly the named files, from where the plan said this node's files come."""
    parted = [name for name in names if name in PARTED_SHARDS]
    if verify.refetch_from == "peer":
        assert verify.peer_dir is not None, "a peer verify carries the head's model dir"
        _rsync(ctx, node, verify.peer_dir, verify.model_dir, names)
        return
    if verify.refetch_from == "node-hub":
        fetch_on_node(
            ctx, node, verify.model_dir, [HubFile(path=p, size=None) for p in patterns_for(names)], verify.commit, names
        )
    else:
        forget(verify.model_dir, names)
        model = ctx.deployment.model
        hub.fetch(model, verify.model_dir, commit=verify.commit, report=ctx.progress.line, only=patterns_for(names))
    if parted:
        ctx.ops(node, "reassemble", {"model_dir": verify.model_dir, "shards": parted})


def _copy(ctx: ApplyContext, action: Action) -> str:
    copy = payload_of(action, Copy)
    destination = _rsync(ctx, action.node, copy.source_dir, copy.destination_dir, copy.files)
    return f"copied to {action.node}:{destination}"


def _rsync(ctx: ApplyContext, node: str, source_dir: str, destination: str, only: list[str] | None) -> str:
    """rsync head -> worker over the worker's SSH target; resumable; parts and caches excluded.

    With `only`, exactly those files are copied again, ignoring size and time (a flipped byte
    keeps both), so nothing else on the worker is touched.
    """
    head = ctx.deployment.head
    worker = ctx.node(node)
    if worker.ssh is None:
        raise NodeCommandError(f"{node}: a peer copy needs an ssh: target", "add nodes[].ssh for this worker")
    target = worker.ssh
    ctx.ops(node, "mkdirs", {"paths": [destination]})
    argv = rsync_argv(target, source_dir, destination, only)
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
    stage = payload_of(action, StagePlan)
    content = stage.content
    if content is None:
        text = ctx.ops(action.node, "read_text", {"path": stage.source}).get("text")
        if not isinstance(text, str):
            raise NodeCommandError(
                f"{action.node}: {stage.source} is missing; the checkpoint is incomplete", _INCOMPLETE_HINT
            )
        try:
            content = rewrite_exl3_plan(text)
        except (ValueError, KeyError, AttributeError, TypeError):
            raise NodeCommandError(
                f"{action.node}: {stage.source} is not an EXL3 plan (JSON with a qdir)", _INCOMPLETE_HINT
            ) from None
    directory = stage.target.rsplit("/", 1)[0]
    ctx.ops(action.node, "mkdirs", {"paths": [directory, f"{directory.rsplit('/', 1)[0]}/cache"]})
    # World-readable like the checkpoint it comes from: the engine in the container reads it.
    ctx.ops(action.node, "write_file", {"path": stage.target, "content": content, "mode": 0o644})
    return f"staged {stage.target}"


def _prune(ctx: ApplyContext, action: Action) -> str:
    removed = ctx.ops(action.node, "prune_parts", {"model_dir": payload_of(action, Prune).model_dir})["removed"]
    return f"deleted {len(removed)} part files"


EXECUTORS: dict[Step, Executor] = {
    Step.DOWNLOAD: _download,
    Step.REASSEMBLE: _reassemble,
    Step.VERIFY: _verify,
    Step.COPY: _copy,
    Step.STAGE_PLAN: _stage_plan,
    Step.PRUNE: _prune,
}
