"""Checkpoint planning with the Hub's listing: sizes, preflight, Hub hashes, deep verify."""

from __future__ import annotations

from reconciler.actions import Step
from reconciler.facts.files import FileFacts
from reconciler.facts.node import Facts, load_facts
from reconciler.plan import Plan, plan
from tests.scenarios import COMMIT, CONVERGED_FACTS, empty_facts, reference_deployment, with_node, with_tree_files

HEAD, WORKER = "spark-head", "spark-worker"


def plan_of(facts: Facts, *, deep_verify: bool = False) -> Plan:
    return plan(reference_deployment(), facts, deep_verify=deep_verify)


def with_disk_free(facts: Facts, node: str, free: int) -> Facts:
    checkpoint = facts.nodes[node].checkpoint.model_copy(update={"disk_free": free})
    return with_node(facts, node, checkpoint=checkpoint)


def test_download_and_copy_say_how_much() -> None:
    result = plan_of(empty_facts())
    download = next(a for a in result.actions if a.id == "checkpoint.download@spark-head")
    assert "download 41 files, 460.0 GB" in download.summary
    copy = next(a for a in result.actions if a.id == "checkpoint.copy@spark-worker")
    assert "(460.0 GB)" in copy.summary


def test_preflight_blocks_before_any_byte_when_the_head_disk_is_too_small() -> None:
    result = plan_of(with_disk_free(empty_facts(), HEAD, 100_000_000_000))
    assert not any(a.node == HEAD and a.component == "checkpoint" for a in result.actions)
    blocker = next(b for b in result.blockers if b.node == HEAD)
    assert "needs 460.0 GB free" in blocker.message
    assert "has 100.0 GB" in blocker.message
    assert "model_dir" in blocker.hint
    assert not any(a.component == "ranks" for a in result.actions)
    assert any(b.component == "ranks" and "wait for checkpoint" in b.message for b in result.blockers)


def test_without_a_listing_nothing_is_fetched_and_the_blocker_says_why() -> None:
    facts = empty_facts()
    head = facts.nodes[HEAD].checkpoint.model_copy(update={"hub": {}})
    result = plan_of(with_node(facts, HEAD, checkpoint=head))
    assert not any(a.component == "checkpoint" for a in result.actions)
    blocker = next(b for b in result.blockers if b.node == HEAD and b.component == "checkpoint")
    assert "no listing for this revision" in blocker.message


def test_a_worker_disk_too_small_blocks_only_the_copy_and_the_ranks() -> None:
    result = plan_of(with_disk_free(empty_facts(), WORKER, 10_000_000_000))
    assert any(a.id == "checkpoint.download@spark-head" for a in result.actions)
    assert not any(a.node == WORKER and a.component == "checkpoint" for a in result.actions)
    assert [b.node for b in result.blockers if b.component == "checkpoint"] == [WORKER]


def test_non_manifest_lfs_files_are_checked_against_the_hubs_sha256() -> None:
    converged = load_facts(CONVERGED_FACTS)
    bank = "exl3/qn/L00.part.safetensors"
    expected = converged.nodes[HEAD].checkpoint.hub[COMMIT].files[bank].sha256
    result = plan_of(with_tree_files(converged, HEAD, {bank: FileFacts(size=5_000_000_000, sha256="f" * 64)}))
    download = next(a for a in result.actions if a.id == "checkpoint.download@spark-head")
    assert "sha256 mismatch" in download.cause
    assert bank in download.cause
    assert expected != "f" * 64


def test_deep_verify_plans_a_verify_on_every_node_of_a_converged_deployment() -> None:
    result = plan_of(load_facts(CONVERGED_FACTS), deep_verify=True)
    verifies = [a for a in result.actions if a.step is Step.VERIFY]
    assert [a.node for a in verifies] == [HEAD, WORKER]
    assert all("deep verify" in a.cause for a in verifies)
    assert not any(a.component == "ranks" for a in result.actions)
    assert not plan_of(load_facts(CONVERGED_FACTS)).has_changes
