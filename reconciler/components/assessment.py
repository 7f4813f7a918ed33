"""What a node's checkpoint holds against what it should: the expected files and hashes, the
node's view (its trees by commit, its own absolute paths), and which files are missing,
unverified, corrupt or waiting to be reassembled. Pure: planning and `doctor` read it.
"""

from __future__ import annotations

from collections.abc import Container, Mapping

from reconciler.facts.files import CheckpointFacts, FileFacts, HubFacts, RevisionFacts
from reconciler.facts.node import Facts
from reconciler.facts.revisions import desired_commit
from reconciler.nodeside.ops import PART_RE
from reconciler.nodeside.statedir import StateDir
from reconciler.record import Record
from reconciler.serving import rewrite_exl3_plan
from reconciler.spec import Deployment, Node, expand_home

NATIVE_SHARDS = [f"model-0000{index}-of-00006.safetensors" for index in range(1, 7)]
# The Hub caps one file at 50 GB, so these two Engram shards are stored as .partNN files.
PARTED_SHARDS = NATIVE_SHARDS[4:]


GB = 1000**3
# Free space a full checkpoint needs on the head (download and reassembly) and on a worker
# (copy), used when the Hub cannot say.
FULL_SIZE_HEAD = 700 * GB
FULL_SIZE_WORKER = 470 * GB


def shard_of(path: str) -> str | None:
    """The shard a `.partNN` file is part of (None: not a part)."""
    match = PART_RE.match(path)
    return match.group("shard") if match else None


def is_part(name: str) -> bool:
    return shard_of(name) is not None


class Expectation(Record):
    """What a complete checkpoint holds: files (never parts), known sizes, expected sha256."""

    files: list[str]
    sizes: dict[str, int]
    hashes: dict[str, str]


def expectation(deployment: Deployment, manifest: dict[str, str] | None, hub: HubFacts | None) -> Expectation:
    """Four fixed files (config, index, manifest, EXL3 plan), six native shards, the manifest's
    entries and every Hub file.

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
        if (shard := shard_of(name)) is not None:
            sizes[shard] = sizes.get(shard, 0) + info.size
    hashes = {name: info.sha256 for name, info in hub_files.items() if info.sha256 and not is_part(name)}
    hashes.update(manifest or {})
    return Expectation(sorted(name for name in names if not is_part(name)), sizes, hashes)


class CheckpointState(Record):
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

    @property
    def refetch(self) -> list[str]:
        """What must be fetched: the missing files, then those whose bytes are wrong."""
        return [*self.missing, *self.corrupt]


def assess(files: Mapping[str, FileFacts], expect: Expectation, linked: Container[str] = ()) -> CheckpointState:
    """`linked`: files another revision on the node holds, which are never fetched."""
    parts = sorted(name for name in files if is_part(name))
    shards_with_parts = {shard_of(part) for part in parts}
    absent = [name for name in expect.files if name not in files]
    assemblable = [name for name in absent if name in PARTED_SHARDS and name in shards_with_parts]
    missing = [name for name in absent if name not in assemblable and name not in linked]
    present = [name for name in expect.hashes if name in files]
    corrupt = sorted(
        name for name in present if name not in linked and _mismatch(files[name].sha256, expect.hashes[name])
    )
    unverified = sorted(name for name in present if files[name].sha256 is None)
    refetch = missing + corrupt
    missing_bytes = sum(expect.sizes.get(name, 0) for name in refetch)
    sizes_known = all(name in expect.sizes for name in refetch)
    return CheckpointState(missing, assemblable, unverified, corrupt, parts, missing_bytes, sizes_known)


def _mismatch(actual: str | None, expected: str) -> bool:
    return actual is not None and actual.lower() != expected.lower()


class NodeView(Record):
    """A node's checkpoint as planning sees it: the facts and the node's own absolute paths."""

    node: Node
    observed: CheckpointFacts
    model_dir: str
    layout: StateDir

    def tree(self, commit: str) -> RevisionFacts | None:
        """Where the node has `commit`: its revision directory, or a pre-revisions model_dir."""
        if commit in self.observed.revisions:
            return self.observed.revisions[commit]
        legacy = self.observed.legacy
        return legacy if legacy is not None and self.observed.legacy_commit == commit else None

    def serving(self) -> tuple[str | None, RevisionFacts | None]:
        """The revision model_dir is now (the one the ranks serve when they run)."""
        observed = self.observed
        if observed.link is not None:
            return observed.link, observed.revisions.get(observed.link)
        return observed.legacy_commit, observed.legacy


def view_of(deployment: Deployment, facts: Facts, node: Node) -> NodeView | None:
    observed = facts.nodes[node.name]
    if not observed.reachable or observed.home is None:
        return None
    home = observed.home
    model_dir = expand_home(node.model_dir, home).rstrip("/")
    return NodeView(node, observed.checkpoint, model_dir, StateDir(expand_home(deployment.state_dir, home)))


def views_of(deployment: Deployment, facts: Facts) -> list[NodeView]:
    """The views of the nodes that answered with their home, in rank order."""
    views = (view_of(deployment, facts, node) for _, node in deployment.ranked_nodes)
    return [view for view in views if view is not None]


def checkpoint_on(deployment: Deployment, facts: Facts, node: Node) -> tuple[RevisionFacts | None, Expectation]:
    """A node's tree of the commit to serve (else of the one it serves) and what it must hold."""
    head = facts.nodes[deployment.head.name].checkpoint
    commit = desired_commit(deployment.model, head)
    listing = head.hub.get(commit) if commit is not None else None
    view = view_of(deployment, facts, node)
    if view is None:
        return None, expectation(deployment, None, listing)
    tree = view.tree(commit) if commit is not None else None
    if tree is None:
        tree = view.serving()[1]
    manifest = listing.manifest if listing is not None and listing.manifest else (tree.manifest if tree else None)
    return tree, expectation(deployment, manifest, listing)


def staged_plan_current(tree: RevisionFacts | None) -> bool:
    """Whether the staged EXL3 plan is the revision's plan rewritten for the /model mount."""
    return tree is not None and tree.staged_plan is not None and tree.staged_plan == rewritten_plan(tree.exl3_plan)


def rewritten_plan(plan_text: str | None) -> str | None:
    """The EXL3 plan as the ranks need it (its banks under /model); None when there is no plan
    or it is not one."""
    if plan_text is None:
        return None
    try:
        return rewrite_exl3_plan(plan_text)
    except (ValueError, KeyError, AttributeError, TypeError):
        return None
