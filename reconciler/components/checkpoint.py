"""The checkpoint on every node, one revision (commit) at a time: staged beside, swapped in whole.

The commit to serve is desired state (reconciler/facts/revisions.py). Each node keeps it in a directory
of its own, `<model_dir>@<commit>`: files that did not change are hardlinked from a revision the
node already has, only the rest is downloaded on the head (or by a hub-sourced worker) and
copied to peers, then reassembled, verified and its EXL3 plan staged. Nothing in a revision the
ranks serve is written, renamed or removed meanwhile; the rank group restarts onto the new one
(its config hash covers the commit), and only once it is ready does model_dir link to it and
older revisions beyond `model.keep_revisions` go.

A file found corrupt in a revision being served is restored by atomic replacement (a fresh file
renamed over it), and the group restarts unless the file is one the engine never reads: it may
have read the bad bytes, at load or later (the Engram tables are read from disk while serving).
"""

from __future__ import annotations

import fnmatch

from reconciler.actions import (
    Action,
    Blocker,
    Component,
    Copy,
    Download,
    InSync,
    Link,
    Outcome,
    Pin,
    Prune,
    Reassemble,
    Shard,
    StagePlan,
    Step,
    StepPayload,
    Verb,
    Verify,
    action,
    shorten,
)
from reconciler.components.assessment import (
    FULL_SIZE_HEAD,
    FULL_SIZE_WORKER,
    PARTED_SHARDS,
    CheckpointState,
    Expectation,
    NodeView,
    assess,
    expectation,
    rewritten_plan,
    shard_of,
    staged_plan_current,
    views_of,
)
from reconciler.components.revisionswitch import switch_and_prune
from reconciler.components.routing import PeerSource, copy_route, peer_source, pipelined_cause
from reconciler.facts.files import FileFacts, HubFacts, RevisionFacts
from reconciler.facts.node import Facts
from reconciler.facts.revisions import is_commit, pinned, revision_dir, short
from reconciler.fsutil import human_bytes
from reconciler.nodeside.statedir import StateDir
from reconciler.record import MutableRecord, Record, field
from reconciler.repofiles import HubFile
from reconciler.spec import Deployment, Node

COMPONENT = Component.CHECKPOINT


# Deep verify everywhere (True), nowhere (False), or on these nodes only.
DeepVerify = bool | frozenset[str]


def plan_checkpoint(
    deployment: Deployment, facts: Facts, commit: str | None, deep_verify: DeepVerify = False
) -> Staging:
    """Bring every reachable node to revision `commit`: the actions before the rank group may
    restart onto it, and those for after it is ready (link model_dir, prune old revisions)."""
    head = deployment.head
    views = views_of(deployment, facts)
    if not views or views[0].node.name != head.name:
        return Staging()
    head_view = views[0]
    listings = head_view.observed.hub
    listing = listings.get(commit) if commit is not None else None
    if commit is None or listing is None:
        error = head_view.observed.hub_error or "the Hub was not asked (no listing for this revision)"
        return plan_without_hub(deployment, facts, error)
    staging = Staging(commit=commit)
    expect = expectation(deployment, listing.manifest, listing)
    head_done = ""
    relay: tuple[NodeView, str] | None = None
    for view in views:
        # The head and hub-sourced workers download; a peer-sourced worker copies from a peer.
        kind = deployment.source_of(view.node)
        source = peer_source(deployment, facts, head_view, head_done, relay, view.node) if kind == "peer" else None
        deep = deep_verify if isinstance(deep_verify, bool) else view.node.name in deep_verify
        outcome = _plan_node(_NodeSteps(deployment, view, expect, listings, commit, source, deep))
        staging.extend(outcome)
        if kind == "head":
            head_done = _last_copyable(outcome.actions)
        elif kind == "peer" and not outcome.blockers:
            relay = (view, _last_copyable(outcome.actions))
    if not any(blocker.node == head.name for blocker in staging.blockers):
        staging.actions[:0] = _pin(deployment, head_view, commit)
    for view in views:
        staging.after_ready += switch_and_prune(deployment, view, commit)
    return staging


class Staging(Outcome):
    """The checkpoint's conclusion: the revision it brings every node to, the actions to run
    before the rank group may restart onto it and those for after it is ready, and why the
    group must restart even if nothing else changes (a corrupt file it may have read)."""

    commit: str | None = None
    after_ready: list[Action] = field(default_factory=list)
    restart: list[str] = field(default_factory=list)


class Placement(Record):
    """What a rank mounts: the revision directory, its staged plans, and the commit."""

    model_path: str
    plans_path: str
    commit: str | None


def placements(deployment: Deployment, facts: Facts, commit: str | None) -> dict[str, Placement]:
    """Where each rank finds revision `commit` (None: what each node serves now)."""
    found: dict[str, Placement] = {}
    for view in views_of(deployment, facts):
        serving, _ = view.serving()
        # Without a revision to serve, a node that has no revisions yet serves model_dir itself.
        chosen = commit if commit is not None else serving if view.observed.link is not None else None
        found[view.node.name] = (
            Placement(revision_dir(view.model_dir, chosen), view.layout.plans_of(chosen), chosen)
            if chosen is not None
            else Placement(view.model_dir, view.layout.plans, serving)
        )
    return found


def plan_without_hub(deployment: Deployment, facts: Facts, error: str) -> Staging:
    """The Hub was needed and failed: nothing can be fetched, the target revision is unknown.

    A node whose served revision matches its manifest and has its plan staged keeps serving:
    the blocker then holds only the checkpoint (the ranks stay on what they serve). A node
    missing anything holds the ranks too; a group that already runs is left alone either way.
    """
    staging = Staging()
    incomplete: list[str] = []
    for view in views_of(deployment, facts):
        node = view.node
        commit, tree = view.serving()
        state = assess(tree.files, expectation(deployment, tree.manifest, None)) if tree is not None else None
        staged = tree is not None and (view.observed.link is None or staged_plan_current(tree))
        if state is not None and state.complete and staged:
            shown = short(commit) if commit else "its checkpoint"
            reason = f"serving {shown}: files on disk match {deployment.model.manifest}; not checked against the Hub"
            staging.in_sync.append(InSync(node.name, COMPONENT, reason))
        else:
            incomplete.append(node.name)
    hint = "the next pass asks the Hub again; check model.endpoint, the network and the token"
    message = f"checkpoint incomplete and the Hub cannot be asked: {error}"
    staging.blockers += [Blocker(name, COMPONENT, message, hint) for name in incomplete]
    if not incomplete:
        message = f"cannot check the checkpoint against the Hub: {error}"
        hint = f"the files on disk match {deployment.model.manifest}, so the ranks keep serving; {hint}"
        staging.blockers.append(Blocker(deployment.head.name, COMPONENT, message, hint, holds_ranks=False))
    return staging


def _last_copyable(actions: list[Action]) -> str:
    """The step after which a peer may copy from the node: the files are there and verified
    (pruning the parts and staging the plan change nothing a peer copies)."""
    ids = [item.id for item in actions if item.step not in (Step.PRUNE, Step.STAGE_PLAN)]
    return ids[-1] if ids else ""


def _pin(deployment: Deployment, head: NodeView, commit: str) -> list[Action]:
    """Record what a branch or tag of the spec resolved to, before anything is fetched for it."""
    model = deployment.model
    if is_commit(model.revision) or pinned(model, head.observed) == commit:
        return []
    record = head.observed.record
    before = record.resolved.commit if record is not None and record.resolved is not None else None
    summary = f"pin revision {model.revision} to {short(commit)} (a branch moves only when the spec or the user says)"
    cause = f"{model.revision} was pinned to {short(before)}" if before else f"{model.revision} is not pinned yet"
    payload = Pin(record=head.layout.checkpoint_record, repo=model.repo, revision=model.revision, commit=commit)
    return [action(payload, head.node.name, "update" if before else "create", summary, cause)]


class _NodeSteps(MutableRecord):
    """One node's staging as it is planned: what it works from, and the actions so far, each
    after the one before it."""

    deployment: Deployment
    view: NodeView
    expect: Expectation
    listings: dict[str, HubFacts]
    commit: str
    source: PeerSource | None
    deep: bool
    actions: list[Action] = field(default_factory=list)

    def add(self, payload: StepPayload, verb: Verb, summary: str, cause: str, after: str = "") -> None:
        """The next action, after the last one so far and after `after` (another node's step)."""
        depends = tuple(item for item in (self.actions[-1].id if self.actions else "", after) if item)
        self.actions.append(action(payload, self.view.node.name, verb, summary, cause, depends))


def _plan_node(steps: _NodeSteps) -> Staging:
    """The actions that make `commit` complete on one node, in its own revision directory."""
    deployment, view, expect, commit = steps.deployment, steps.view, steps.expect, steps.commit
    node, target = view.node, revision_dir(view.model_dir, commit)
    tree = view.observed.revisions.get(commit)
    files = tree.files if tree is not None else {}
    state = assess(files, expect)
    serving_commit, _ = view.serving()
    links = _linkable(steps, state.refetch)
    # What no other revision here holds is fetched: from here on, the missing and corrupt files.
    fetch_state = assess(files, expect, linked=links)
    fetch = fetch_state.refetch
    blocker = _preflight(view, fetch_state, bool(fetch or state.assemblable))
    if blocker is not None:
        return Staging(blockers=[blocker])
    why = ""
    if serving_commit is not None and serving_commit != commit:
        moved = f"{len(fetch)} files change, {human_bytes(fetch_state.missing_bytes)}" if fetch else "no file changes"
        why = f"revision {short(serving_commit)} -> {short(commit)}: {moved}"
    if links:
        linked_bytes = sum(expect.sizes.get(name, 0) for name in links)
        summary = (
            f"stage {short(commit)} beside {short(serving_commit) if serving_commit else 'the files here'}: "
            f"link {len(links)} unchanged files ({human_bytes(linked_bytes)}) into {_shown(node, commit)}"
        )
        payload = Link(target_dir=target, files=dict(sorted(links.items())))
        cause = why or "these files are the same in a revision the node already has"
        steps.add(payload, "create", summary, cause)
    if fetch:
        _fetch(steps, fetch_state, why)
    assemble = [*state.assemblable, *(name for name in fetch if name in PARTED_SHARDS)]
    if assemble and steps.source is None:
        # Behind the head's own download: each shard once its parts have landed, meanwhile.
        pipelined = node.ssh is None and any(name in fetch for name in assemble)
        summary = f"reassemble {', '.join(assemble)} from their .partNN files (streaming)"
        cause = "the Hub stores these shards as parts (50 GB per-file limit)"
        if pipelined:
            summary += ", each as soon as its parts are downloaded"
            cause += "; pipelined behind the download: the rest downloads meanwhile"
        listing = steps.listings[commit]
        payload_assemble = Reassemble(
            model_dir=target,
            shards=[
                Shard(name=name, sha256=expect.hashes.get(name), parts=_parts(listing, name) if name in fetch else [])
                for name in assemble
            ],
            keep_parts=deployment.model.keep_parts,
            manifest=deployment.model.manifest,
            cache=view.layout.hash_cache,
            pipelined=pipelined,
        )
        steps.add(payload_assemble, "create", summary, cause)
    _verify_and_prune(steps, target, fetch_state)
    _plan_staging(steps, tree)
    serving_here = serving_commit == commit and view.observed.link == commit
    restart = _restart_cause(state.corrupt) if serving_here else None
    in_sync = [] if steps.actions else [InSync(node.name, COMPONENT, _in_sync_reason(deployment, view, commit))]
    return Staging(actions=steps.actions, in_sync=in_sync, restart=[restart] if restart else [])


def _shown(node: Node, commit: str) -> str:
    return f"{node.model_dir}@{short(commit)}"


def _in_sync_reason(deployment: Deployment, view: NodeView, commit: str) -> str:
    reason = f"revision {short(commit)} complete and verified; EXL3 plan staged"
    upstream = view.observed.upstream
    model = deployment.model
    if view.node.role == "head" and upstream is not None and upstream != commit and not is_commit(model.revision):
        reason += (
            f"; {model.revision} has moved upstream to {short(upstream)}: take it with "
            f"`reconciler apply --update-revision`, or pin model.revision: {upstream}"
        )
    return reason


def _linkable(steps: _NodeSteps, names: list[str]) -> dict[str, str]:
    """The files of the commit that another revision on this node holds with the same content:
    name -> that file's path. Same content means the same verified sha256, or for a small file
    without one the same git blob id in both revisions' listings."""
    expect, listings = steps.expect, steps.listings
    sources = _link_sources(steps.view, steps.commit)
    found: dict[str, str] = {}
    wanted = listings.get(steps.commit)
    for name in names:
        for source_commit, tree in sources:
            existing = tree.files.get(name)
            if existing is None or existing.size != expect.sizes.get(name, -1):
                continue
            if _same_content(name, existing, expect, wanted, listings.get(source_commit or "")):
                found[name] = f"{tree.path}/{name}"
                break
    return found


def _link_sources(view: NodeView, commit: str) -> list[tuple[str | None, RevisionFacts]]:
    """The revisions a new one may share files with, the served one first."""
    serving_commit, serving_tree = view.serving()
    sources: list[tuple[str | None, RevisionFacts]] = []
    if serving_tree is not None and serving_commit != commit:
        sources.append((serving_commit, serving_tree))
    sources += [
        (other, tree)
        for other, tree in sorted(view.observed.revisions.items())
        if other not in (commit, serving_commit)
    ]
    legacy = view.observed.legacy
    if legacy is not None and all(tree is not legacy for _, tree in sources):
        sources.append((view.observed.legacy_commit, legacy))
    return sources


def _same_content(
    name: str, existing: FileFacts, expect: Expectation, wanted: HubFacts | None, other: HubFacts | None
) -> bool:
    digest = expect.hashes.get(name)
    if digest is not None:
        return existing.sha256 is not None and existing.sha256 == digest
    if wanted is None or other is None or name not in wanted.files or name not in other.files:
        return False
    blob = wanted.files[name].blob_id
    return blob is not None and blob == other.files[name].blob_id


def _preflight(view: NodeView, state: CheckpointState, fetching: bool) -> Blocker | None:
    """Refuse before any byte is written when what must be fetched cannot fit (linked files cost nothing)."""
    node, observed = view.node, view.observed
    if observed.disk_free is None or not fetching:
        return None
    full = FULL_SIZE_HEAD if node.role == "head" else FULL_SIZE_WORKER
    need = state.missing_bytes if state.sizes_known else full
    if need <= observed.disk_free:
        return None
    basis = "" if state.sizes_known else f" (sizes unknown: full size ~{human_bytes(full)} assumed)"
    return Blocker(
        node.name,
        COMPONENT,
        f"needs {human_bytes(need)} free in {node.model_dir} for the missing files{basis}, "
        f"has {human_bytes(observed.disk_free)}",
        "free space, or point nodes[].model_dir at a larger disk; nothing was written",
    )


def _fetch(steps: _NodeSteps, state: CheckpointState, why: str) -> None:
    """Fetch the state's missing and corrupt files: a download, or a copy from the steps' source."""
    view, expect, source, listing = steps.view, steps.expect, steps.source, steps.listings[steps.commit]
    node, model, commit = view.node, steps.deployment.model, listing.commit
    fetch, fetch_bytes = state.refetch, state.missing_bytes
    chain = source.why if source is not None else ""
    cause = "; ".join(part for part in (why, _files_cause(state, len(expect.files)), chain) if part)
    size, where, target = human_bytes(fetch_bytes), _shown(node, commit), revision_dir(view.model_dir, commit)
    nothing_here = not view.observed.revisions.get(commit) and not _link_sources(view, commit)
    if source is not None:
        origin = source.origin
        summary = f"copy {len(fetch)} files ({size}) from {origin.node.name} into {where} {copy_route(source)}"
        pipelined = bool(source.after)
        if pipelined:
            summary += f", each file as soon as it is complete and verified on {origin.node.name}"
            cause = "; ".join(part for part in (cause, pipelined_cause(origin)) if part)
        payload_copy = Copy(
            source_node=origin.node.name,
            source_dir=revision_dir(origin.model_dir, commit),
            destination_dir=target,
            files=None if nothing_here else sorted(fetch),
            bytes=fetch_bytes,
            sizes={name: expect.sizes.get(name, 0) for name in sorted(fetch)},
            fabric=source.fabric,
            pipelined=pipelined,
            hashes={name: expect.hashes[name] for name in sorted(fetch) if name in expect.hashes},
            cache=view.layout.hash_cache,
        )
        steps.add(payload_copy, "create", summary, cause, after=source.after)
        return
    summary = f"download {len(fetch)} files, {size} of {model.repo}@{short(commit)} into {where}"
    everything = sorted(listing.files.values(), key=lambda item: item.path)
    payload = Download(
        repo=model.repo,
        commit=commit,
        model_dir=target,
        files=everything if nothing_here else repo_files(fetch, listing),
        refetch=state.corrupt,
        on_node=node.ssh is not None,
        cache=view.layout.hash_cache,
    )
    steps.add(payload, "create", summary, cause)


def repo_files(names: list[str], listing: HubFacts) -> list[HubFile]:
    """The repo files that bring these model files: a parted shard comes as its `.partNN` files.
    A name the listing lacks is nothing the Hub has at that commit: the verify after the
    download reports it missing."""
    files: list[HubFile] = []
    for name in names:
        if name in PARTED_SHARDS:
            files += [listing.files[path] for path in _parts(listing, name)]
        elif name in listing.files:
            files.append(listing.files[name])
    return files


def _parts(listing: HubFacts, shard: str) -> list[str]:
    """The repo paths of a parted shard's `.partNN` files, in order."""
    return sorted(path for path in listing.files if shard_of(path) == shard)


# Files the engine never reads: a bad byte in one cannot have reached a running group.
_NOT_READ_BY_THE_ENGINE = ("*.md", "*.txt", "*.sh", "*.safetensors.part[0-9][0-9]", ".gitattributes")


def _restart_cause(corrupt: list[str]) -> str | None:
    """The rule for a corrupt file under a serving group: restart unless the engine never reads it."""
    read = [name for name in corrupt if not any(fnmatch.fnmatchcase(name, p) for p in _NOT_READ_BY_THE_ENGINE)]
    if not read:
        return None
    return (
        f"sha256 mismatch in {shorten(read)}, which the serving group mounts: restored by atomic replacement, "
        "then the group restarts, because the engine may have read the bad bytes (weights load lazily and the "
        "disk-backed Engram tables are read while serving)"
    )


def _verify_and_prune(steps: _NodeSteps, target: str, state: CheckpointState) -> None:
    model = steps.deployment.model
    if steps.actions or state.unverified or steps.deep:
        if steps.actions:
            cause = "new files must match their sha256 before serving"
        elif state.unverified:
            cause = f"{len(state.unverified)} files changed since last verified: {shorten(state.unverified)}"
        else:
            cause = "deep verify requested: every file is read again"
        summary = (
            f"verify files against {model.manifest} and the Hub's sha256; the next plan re-fetches any that differ"
        )
        payload = Verify(
            model_dir=target,
            files=dict(sorted(steps.expect.hashes.items())),
            manifest=model.manifest,
            cache=steps.view.layout.hash_cache,
            deep=steps.deep,
        )
        steps.add(payload, "run", summary, cause)
    parted = any(name in PARTED_SHARDS for name in state.refetch)
    if (state.parts or parted) and not model.keep_parts and steps.source is None:
        summary = "delete the .partNN files of reassembled shards"
        cause = "model.keep_parts is false and the native shards are verified"
        steps.add(Prune(model_dir=target), "remove", summary, cause)


def _plan_staging(steps: _NodeSteps, tree: RevisionFacts | None) -> None:
    deployment, view, commit, actions = steps.deployment, steps.view, steps.commit, steps.actions
    staged = staged_plan_current(tree)
    if not actions and staged:
        return
    cause = (
        "the staged EXL3 plan is missing or differs from the model's"
        if not staged
        else "the checkpoint changes, so the staged plan is rewritten from it"
    )
    plan_name = deployment.model.exl3_plan
    shown = StateDir(deployment.state_dir).staged_plan(short(commit), plan_name)
    summary = f"stage {shown} with banks under /model/exl3"
    payload = StagePlan(
        source=f"{revision_dir(view.model_dir, commit)}/exl3/plan/{plan_name}",
        target=view.layout.staged_plan(commit, plan_name),
        content=rewritten_plan(tree.exl3_plan if tree is not None else None) if not actions else None,
    )
    steps.add(payload, "create", summary, cause)


def _files_cause(state: CheckpointState, total: int) -> str:
    parts = []
    absent = state.missing + state.assemblable
    if absent:
        parts.append(f"{len(absent)} of {total} expected files missing: {shorten(absent)}")
    if state.corrupt:
        parts.append(
            f"sha256 mismatch (restored by atomic replacement, nothing else deleted): {shorten(state.corrupt)}"
        )
    return "; ".join(parts)
