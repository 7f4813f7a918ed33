"""After the group serves a new revision: model_dir links to it, the record keeps the history,
and revisions beyond `model.keep_revisions` go (only then: nothing served is ever moved)."""

from __future__ import annotations

from reconciler.actions import Action, PruneRevisions, Switch, action
from reconciler.components.assessment import NodeView
from reconciler.facts.revisions import pre_revisions_dir, revision_dir, short
from reconciler.spec import Deployment


def switch_and_prune(deployment: Deployment, view: NodeView, commit: str) -> list[Action]:
    """After the group serves `commit`: model_dir links to it, the record says so, and revisions
    beyond keep_revisions go (only then: nothing the group serves is ever moved or removed)."""
    actions: list[Action] = []
    observed = view.observed
    history = [commit, *[c for c in (observed.record.history if observed.record else []) if c != commit]]
    serving, _ = view.serving()
    if serving is not None and serving not in history:
        history.insert(1, serving)
    # A model_dir from before revisions moves aside: to the revision it holds when that is known
    # and not here already (then kept like any other revision), else to a directory pruned below.
    legacy_commit = observed.legacy_commit if observed.legacy is not None else None
    if legacy_commit == commit or legacy_commit in observed.revisions:
        legacy_commit = None
    legacy_to = None
    if observed.legacy is not None:
        legacy_to = revision_dir(view.model_dir, legacy_commit) if legacy_commit else pre_revisions_dir(view.model_dir)
    if observed.link != commit:
        moved = f"; the directory that was there moves to {legacy_to}" if legacy_to else ""
        summary = f"point {view.node.model_dir} at {short(commit)}{moved}"
        cause = "the group serves the new revision"
        payload = Switch(
            model_dir=view.model_dir,
            target=revision_dir(view.model_dir, commit),
            legacy_to=legacy_to,
            record=view.layout.checkpoint_record,
            repo=deployment.model.repo,
            history=history,
        )
        actions.append(action(payload, view.node.name, "update", summary, cause))
    kept = history[1 : 1 + deployment.model.keep_revisions]
    known = {*observed.revisions, *([legacy_commit] if legacy_commit else [])}
    doomed = sorted(c for c in known if c != commit and c not in kept)
    leftovers = [pre_revisions_dir(view.model_dir)] if legacy_to == pre_revisions_dir(view.model_dir) else []
    if doomed or leftovers:
        names = ", ".join([*(short(c) for c in doomed), *leftovers])
        summary = f"remove revisions {names} (model.keep_revisions: {deployment.model.keep_revisions})"
        cause = f"the group serves {short(commit)}; kept: {', '.join(short(c) for c in kept) or 'none'}"
        payload_prune = PruneRevisions(
            model_dir=view.model_dir,
            remove=[revision_dir(view.model_dir, c) for c in doomed],
            shared_only=leftovers,
        )
        depends = (actions[-1].id,) if actions else ()
        actions.append(action(payload_prune, view.node.name, "remove", summary, cause, depends))
    return actions
