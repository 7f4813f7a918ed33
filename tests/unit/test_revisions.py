"""Model revisions as desired state: pinned branches, staging beside the served revision,
rollback to a kept one without a download, pruning after the new group is ready."""

from __future__ import annotations

import io
import json
from pathlib import Path

from reconciler import apply
from reconciler.actions import Link, Pin, PruneRevisions, Step, Switch, action
from reconciler.facts.files import CheckpointRecord, Resolved
from reconciler.facts.node import Facts, NodeFacts, load_facts
from reconciler.facts.revisions import desired_commit
from reconciler.plan import Plan, plan, render_text
from tests.scenarios import (
    COMMIT,
    COMMIT_B,
    CONVERGED_FACTS,
    reference_deployment,
    revision_tree,
    running_on,
    with_container,
    with_node,
    with_revision,
    with_revision_b,
)

HEAD, WORKER = "spark-head", "spark-worker"


def ids(result: Plan) -> list[str]:
    return [action.id for action in result.actions]


def serving_b_with_a_kept(facts: Facts) -> Facts:
    """Every node serves COMMIT_B from its directory and still holds COMMIT beside it."""
    deployment = reference_deployment()
    listing_b = facts.nodes[HEAD].checkpoint.hub[COMMIT_B]
    for _, node in deployment.ranked_nodes:
        observed = facts.nodes[node.name]
        assert observed.home is not None
        tree_b = revision_tree(node, observed.home, listing_b)
        checkpoint = observed.checkpoint
        record = (checkpoint.record or CheckpointRecord(repo=deployment.model.repo)).model_copy(
            update={"history": [COMMIT_B, COMMIT]}
        )
        revisions = {**checkpoint.revisions, COMMIT_B: tree_b}
        facts = with_node(
            facts,
            node.name,
            checkpoint=checkpoint.model_copy(update={"revisions": revisions, "link": COMMIT_B, "record": record}),
        )
    return running_on(deployment, facts, COMMIT_B)


def test_a_revision_change_stages_only_what_changed_then_restarts_then_switches() -> None:
    result = plan(with_revision(reference_deployment(), COMMIT_B), with_revision_b(load_facts(CONVERGED_FACTS)))
    text = render_text(result)
    assert "revision 61f9933a -> 7a3f0c1e: 2 files change, 48.1 GB" in text
    link = next(a for a in result.actions if a.step is Step.LINK and a.node == WORKER)
    assert isinstance(link.payload, Link)
    assert len(link.payload.files) == 39
    assert all(source.endswith(name) and f"@{COMMIT}/" in source for name, source in link.payload.files.items())
    copy = next(a for a in result.actions if a.step is Step.COPY)
    assert copy.payload.files == ["config.json", "model-00003-of-00006.safetensors"]  # type: ignore[union-attr]
    order = ids(result)
    assert order.index("checkpoint.stage-plan@spark-worker") < order.index("ranks.stop-dsv41-r0@spark-head")
    assert order.index("ranks.smoke@spark-head") < order.index("checkpoint.switch@spark-head")
    assert not any(a.step is Step.PRUNE_REVISIONS for a in result.actions), "keep_revisions 1 keeps the old one"


def test_rolling_back_to_a_kept_revision_downloads_nothing() -> None:
    facts = serving_b_with_a_kept(with_revision_b(load_facts(CONVERGED_FACTS)))
    back = plan(with_revision(reference_deployment(), COMMIT), facts)
    steps = {action.step for action in back.actions}
    assert not steps & {Step.DOWNLOAD, Step.COPY, Step.LINK, Step.VERIFY}
    assert Step.START_RANK in steps
    switch = next(a for a in back.actions if a.step is Step.SWITCH and a.node == HEAD)
    assert isinstance(switch.payload, Switch)
    assert switch.payload.target.endswith(f"@{COMMIT}")
    assert switch.payload.history[:2] == [COMMIT, COMMIT_B]


def test_after_the_switch_revisions_beyond_keep_revisions_are_pruned() -> None:
    facts = serving_b_with_a_kept(with_revision_b(load_facts(CONVERGED_FACTS)))
    deployment = with_revision(reference_deployment(), COMMIT)
    none_kept = deployment.model_copy(update={"model": deployment.model.model_copy(update={"keep_revisions": 0})})
    result = plan(none_kept, facts)
    prune = next(a for a in result.actions if a.step is Step.PRUNE_REVISIONS and a.node == WORKER)
    assert isinstance(prune.payload, PruneRevisions)
    assert prune.payload.remove == [f"{prune.payload.model_dir}@{COMMIT_B}"]
    assert prune.depends_on == ("checkpoint.switch@spark-worker",)


def test_a_branch_stays_on_its_pinned_commit_when_the_publisher_pushes() -> None:
    facts = with_revision_b(load_facts(CONVERGED_FACTS))
    head = facts.nodes[HEAD].checkpoint
    moved = with_node(facts, HEAD, checkpoint=head.model_copy(update={"upstream": COMMIT_B}))
    result = plan(reference_deployment(), moved)
    assert not result.has_changes
    reason = next(i.reason for i in result.in_sync if i.node == HEAD and i.component == "checkpoint")
    assert "main has moved upstream to 7a3f0c1e" in reason
    assert "--update-revision" in reason
    taken = plan(reference_deployment(), moved, update_revision=True)
    assert ids(taken)[0] == "checkpoint.pin@spark-head"
    assert "main was pinned to 61f9933a" in taken.actions[0].cause


def test_a_pre_revisions_model_dir_is_its_own_commit_and_is_adopted_by_links() -> None:
    """A checkpoint downloaded before revisions were kept: model_dir is a real directory. The
    deployment stays on its commit, links it into a revision directory (no byte fetched), and
    moves the old directory aside only after the group serves from the new one."""
    facts = load_facts(CONVERGED_FACTS)
    deployment = reference_deployment()
    for name in (HEAD, WORKER):
        checkpoint = facts.nodes[name].checkpoint
        tree = checkpoint.revisions[COMMIT]
        legacy = tree.model_copy(update={"path": tree.path.split("@")[0], "staged_plan": None})
        facts = with_node(
            facts,
            name,
            checkpoint=checkpoint.model_copy(
                update={"revisions": {}, "link": None, "legacy": legacy, "legacy_commit": COMMIT, "record": None}
            ),
        )
        old = facts.nodes[name].containers[0]
        facts = with_container(facts, name, labels={**old.labels, "io.spark-reconciler.config-hash": "v1:" + "0" * 64})
    assert desired_commit(deployment.model, facts.nodes[HEAD].checkpoint) == COMMIT
    result = plan(deployment, facts)
    steps = [action.step for action in result.actions if action.node == WORKER and action.component == "checkpoint"]
    assert steps[:1] == [Step.LINK]
    assert Step.COPY not in steps
    assert Step.DOWNLOAD not in {action.step for action in result.actions}
    switch = next(a for a in result.actions if a.step is Step.SWITCH and a.node == HEAD)
    assert isinstance(switch.payload, Switch)
    assert switch.payload.legacy_to is not None
    assert switch.payload.legacy_to.endswith(".pre-revisions")
    assert ids(result).index("ranks.smoke@spark-head") < ids(result).index("checkpoint.switch@spark-head")


def test_a_pin_for_another_repo_or_revision_is_not_used() -> None:
    facts = with_revision_b(load_facts(CONVERGED_FACTS))
    head = facts.nodes[HEAD].checkpoint
    record = CheckpointRecord(repo="someone/else", resolved=Resolved(revision="main", commit=COMMIT))
    other = head.model_copy(update={"record": record, "upstream": COMMIT_B, "link": None})
    assert desired_commit(reference_deployment().model, other) == COMMIT_B


def test_the_record_the_executors_write_reads_back_as_facts(tmp_path: Path) -> None:
    """Pin and switch write STATE_DIR/checkpoint.json; the probe must read it back, or the pin
    is planned again on every pass."""
    from reconciler.execution import ApplyContext, Progress
    from reconciler.transport.local import LocalTransport

    deployment = reference_deployment().model_copy(update={"state_dir": str(tmp_path)})
    facts = Facts(nodes={HEAD: NodeFacts(home=str(tmp_path)), WORKER: NodeFacts(home=str(tmp_path))})
    ctx = ApplyContext(deployment, facts, {HEAD: LocalTransport(HEAD)}, Progress(io.StringIO()))
    record = str(tmp_path / "checkpoint.json")
    pin = Pin(record=record, repo=deployment.model.repo, revision="main", commit=COMMIT)
    apply.EXECUTORS[Pin](ctx, action(pin, HEAD, "create", "pin", "test"))
    read = CheckpointRecord.model_validate(json.loads((tmp_path / "checkpoint.json").read_text()))
    assert read.resolved is not None
    assert read.resolved.commit == COMMIT
