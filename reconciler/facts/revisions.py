"""Which commit the deployment is on, and where a revision lives on a node. Pure.

`model.revision` is desired state. A 40-hex commit is what it says. A branch or tag is pinned to
the commit it pointed at when first converged (recorded on the head), so a publisher pushing to
`main` never starts a 462 GB download by itself: the deployment moves only when the spec changes
or the user asks (`apply --update-revision`). A deployment from before revisions were recorded
stays on the commit its files are from.

Each revision is a directory of its own beside the spec's model_dir, `<model_dir>@<commit>`, and
model_dir is a symlink to the one being served, so `~/models/DeepSeek-V4.1-Flash-Spark` still
holds the model for anyone looking, while a new revision is assembled next to it.
"""

from __future__ import annotations

import re

from reconciler.facts.files import CheckpointFacts
from reconciler.repofiles import GIT_ID
from reconciler.spec import Model


def is_commit(revision: str) -> bool:
    return re.match(GIT_ID, revision) is not None


def short(commit: str) -> str:
    return commit[:8]


def revision_dir(model_dir: str, commit: str) -> str:
    return f"{model_dir.rstrip('/')}@{commit}"


def pre_revisions_dir(model_dir: str) -> str:
    """Where a model_dir that was a real directory goes when it becomes a link."""
    return f"{model_dir.rstrip('/')}.pre-revisions"


def pinned(model: Model, head: CheckpointFacts) -> str | None:
    """The commit the head recorded for the spec's branch or tag, if it recorded one for it."""
    record = head.record
    resolved = record.resolved if record is not None and record.repo == model.repo else None
    return resolved.commit if resolved is not None and resolved.revision == model.revision else None


def desired_commit(model: Model, head: CheckpointFacts, *, update: bool = False) -> str | None:
    """The commit to serve; None when only the Hub could say and it has not (yet)."""
    if is_commit(model.revision):
        return model.revision
    if update:
        return head.upstream
    recorded = pinned(model, head)
    if recorded is not None:
        return recorded
    record = head.record
    if record is None or record.resolved is None:
        # First converge of this spec: what the node already serves or holds, if anything.
        held = head.link or head.legacy_commit
        if held is not None:
            return held
    return head.upstream
