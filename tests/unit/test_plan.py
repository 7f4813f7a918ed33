"""The pure plan: golden texts, group ordering, and one scenario per component decision."""

from __future__ import annotations

import json

import pytest

from reconciler.actions import Action, Download, StopRank
from reconciler.components.memguard import guard_config_hash
from reconciler.facts.containers import ContainerFacts
from reconciler.facts.fabric import FabricFacts
from reconciler.facts.files import FileFacts, KeyFileFacts
from reconciler.facts.memory import GuardFacts
from reconciler.facts.node import Facts, Hold, load_facts
from reconciler.plan import Plan, plan, render_text
from reconciler.spec import Deployment
from tests.scenarios import (
    COMMIT,
    CONVERGED_FACTS,
    EMPTY_FACTS,
    GOLDEN_DIR,
    converged_facts,
    empty_facts,
    golden_scenarios,
    reference_deployment,
    with_container,
    with_hub_sha,
    with_node,
    with_serving,
    with_tree_files,
)

HEAD, WORKER = "spark-head", "spark-worker"
REGENERATE = "if the change is deliberate, run: .venv/bin/python tests/fixtures/regenerate.py"


def plan_of(facts: Facts, deployment: Deployment | None = None) -> Plan:
    return plan(deployment or reference_deployment(), facts)


def ids(result: Plan) -> list[str]:
    return [action.id for action in result.actions]


def position(result: Plan, action_id: str) -> int:
    return ids(result).index(action_id)


def by_id(result: Plan, action_id: str) -> Action:
    return result.actions[position(result, action_id)]


def assert_dependencies_come_first(result: Plan) -> None:
    seen: set[str] = set()
    for action in result.actions:
        assert set(action.depends_on) <= seen, f"{action.id} depends on a later action"
        seen.add(action.id)


@pytest.mark.parametrize("name", sorted(golden_scenarios()))
def test_golden_plan_text(name: str) -> None:
    deployment, facts = golden_scenarios()[name]
    expected = (GOLDEN_DIR / f"{name}.txt").read_text(encoding="utf-8")
    assert render_text(plan(deployment, facts)) == expected, REGENERATE


def test_committed_converged_fixture_matches_the_current_renderer() -> None:
    assert load_facts(CONVERGED_FACTS) == converged_facts(), REGENERATE


def test_converged_facts_give_no_changes() -> None:
    result = plan_of(load_facts(CONVERGED_FACTS))
    assert not result.has_changes
    assert not result.blockers
    assert render_text(result).endswith("No changes. The deployment matches the spec.\n")
    components = {(item.component, item.node) for item in result.in_sync}
    for node in (HEAD, WORKER):
        assert {("checkpoint", node), ("image", node), ("memguard", node), ("ranks", node)} <= components
    assert ("apikey", HEAD) in components
    assert ("front", HEAD) in components


def test_bring_up_from_empty_is_complete_and_ordered() -> None:
    result = plan_of(empty_facts())
    assert_dependencies_come_first(result)
    assert ids(result)[0] == "checkpoint.pin@spark-head"
    assert ids(result)[-7:] == [
        "ranks.start-dsv41-r1@spark-worker",
        "ranks.start-dsv41-r0@spark-head",
        "front.start-dsv41-front@spark-head",
        "ranks.wait-ready@spark-head",
        "ranks.smoke@spark-head",
        "checkpoint.switch@spark-head",
        "checkpoint.switch@spark-worker",
    ]
    assert by_id(result, "checkpoint.switch@spark-worker").depends_on == ("ranks.smoke@spark-head",)
    rank1 = by_id(result, "ranks.start-dsv41-r1@spark-worker")
    rank0 = by_id(result, "ranks.start-dsv41-r0@spark-head")
    assert rank1.id in rank0.depends_on
    assert {"checkpoint.stage-plan@spark-worker", "image.pull@spark-worker", "memguard.start@spark-worker"} <= set(
        rank1.depends_on
    )
    assert {"checkpoint.stage-plan@spark-head", "image.pull@spark-head", "apikey.create@spark-head"} <= set(
        rank0.depends_on
    )
    assert "apikey.create@spark-head" not in rank1.depends_on
    copy = by_id(result, "checkpoint.copy@spark-worker")
    assert copy.depends_on == ("checkpoint.verify@spark-head",)
    assert position(result, "memguard.start@spark-worker") < position(result, "memguard.start@spark-head")
    assert result.summary() == {"add": 15, "change": 2, "replace": 0, "destroy": 0, "stop": 0, "run": 5}


def test_every_action_has_node_component_verb_and_cause() -> None:
    for action in plan_of(empty_facts()).actions:
        assert action.node in {HEAD, WORKER}
        assert action.component in {"checkpoint", "image", "apikey", "memguard", "ranks", "front"}
        assert action.cause
        assert action.summary


def test_a_rank_exit_with_code_zero_restarts_the_whole_group_in_order() -> None:
    facts = with_container(load_facts(CONVERGED_FACTS), WORKER, status="exited", exit_code=0)
    result = plan_of(facts)
    assert [(a.verb, a.target) for a in result.actions] == [
        ("stop", "dsv41-r0"),
        ("replace", "dsv41-r1"),
        ("replace", "dsv41-r0"),
        ("run", ""),
        ("run", ""),
    ]
    assert "exited with code 0" in by_id(result, "ranks.start-dsv41-r1@spark-worker").cause
    assert "group restart" in by_id(result, "ranks.stop-dsv41-r0@spark-head").cause
    stop = by_id(result, "ranks.stop-dsv41-r0@spark-head").payload
    assert isinstance(stop, StopRank)
    assert stop.grace_s == 10, "after a failure there is nothing to finish: a short grace"
    planned = plan_of(load_facts(CONVERGED_FACTS), with_serving(reference_deployment(), gpu_util=0.8))
    assert [a.payload.grace_s for a in planned.actions if isinstance(a.payload, StopRank)] == [60, 60]


def test_a_spec_change_replaces_both_ranks_naming_the_changed_flag() -> None:
    result = plan_of(load_facts(CONVERGED_FACTS), with_serving(reference_deployment(), gpu_util=0.8))
    assert [(a.step, a.verb, a.target) for a in result.actions][:5] == [
        ("front.drain", "run", ""),
        ("ranks.stop", "stop", "dsv41-r0"),
        ("ranks.stop", "stop", "dsv41-r1"),
        ("ranks.start", "replace", "dsv41-r1"),
        ("ranks.start", "replace", "dsv41-r0"),
    ]
    assert "--gpu-memory-utilization 0.88 -> 0.8" in result.actions[1].cause


def test_a_planned_restart_drains_first_and_ends_the_drain_before_the_wait() -> None:
    result = plan_of(load_facts(CONVERGED_FACTS), with_serving(reference_deployment(), gpu_util=0.8))
    steps = [str(a.step) for a in result.actions]
    assert steps.index("front.drain") < steps.index("ranks.stop")
    assert steps.index("ranks.start") < steps.index("front.undrain") < steps.index("ranks.wait-ready")
    assert "serving.drain_s 120 s" in result.actions[0].summary
    assert_dependencies_come_first(result)


def test_no_drain_when_it_is_off_or_nothing_serves() -> None:
    off = plan_of(load_facts(CONVERGED_FACTS), with_serving(reference_deployment(), gpu_util=0.8, drain_s=0))
    assert not any(a.step in {"front.drain", "front.undrain"} for a in off.actions)
    crashed = with_container(load_facts(CONVERGED_FACTS), WORKER, status="exited", exit_code=1)
    unplanned = plan_of(crashed, with_serving(reference_deployment(), gpu_util=0.8))
    assert not any(a.step in {"front.drain", "front.undrain"} for a in unplanned.actions), "a failure never waits"


def test_a_drain_left_on_is_ended_without_a_restart() -> None:
    result = plan_of(with_node(load_facts(CONVERGED_FACTS), HEAD, front_draining=True))
    assert [(a.step, a.cause) for a in result.actions] == [
        ("front.undrain", "the front still answers 503 from a drain nobody ended (a restart cut short)")
    ]


def test_a_fabric_change_shows_as_a_group_restart_with_the_cause() -> None:
    moved = FabricFacts(ifname="enP2p1s0f1np1", ip="10.10.10.21", hcas=["roceP2p1s0f1"])
    result = plan_of(with_node(load_facts(CONVERGED_FACTS), WORKER, fabric=moved))
    cause = by_id(result, "ranks.start-dsv41-r1@spark-worker").cause
    assert "VLLM_HOST_IP 10.10.10.11 -> 10.10.10.21" in cause
    assert "NCCL_SOCKET_IFNAME enp1s0f1np1 -> enP2p1s0f1np1" in cause
    assert by_id(result, "ranks.stop-dsv41-r0@spark-head").cause.startswith("group restart")


def test_missing_rank_container_is_created_and_the_other_replaced() -> None:
    facts = with_node(load_facts(CONVERGED_FACTS), WORKER, containers=[])
    result = plan_of(facts)
    assert [(a.verb, a.target) for a in result.actions][:3] == [
        ("stop", "dsv41-r0"),
        ("create", "dsv41-r1"),
        ("replace", "dsv41-r0"),
    ]


def test_oom_killed_rank_says_so() -> None:
    facts = with_container(load_facts(CONVERGED_FACTS), HEAD, status="exited", exit_code=137, oom_killed=True)
    assert "OOM killer" in by_id(plan_of(facts), "ranks.start-dsv41-r0@spark-head").cause


def test_containers_we_do_not_own_are_never_touched() -> None:
    """Another tool's containers beside the ranks, running or exited: nothing to do, and none is
    named by any action."""
    converged = load_facts(CONVERGED_FACTS)
    others = [
        ContainerFacts(name="open-webui", id="f" * 64, image="ghcr.io/open-webui/open-webui", status="running"),
        ContainerFacts(name="old-vllm", id="e" * 64, image="vllm/vllm-openai", status="exited", exit_code=1),
    ]
    facts = with_node(converged, WORKER, containers=[*converged.nodes[WORKER].containers, *others])
    assert render_text(plan_of(facts)) == render_text(plan_of(converged))
    assert not plan_of(facts).has_changes


def test_a_foreign_container_holding_a_ranks_name_blocks_the_group_and_is_left_alone() -> None:
    """Someone's own `docker run --name dsv41-r1` where our rank 1 should be: Docker would refuse
    the create, so the plan says whose move it is instead of planning a start that must fail."""
    foreign = ContainerFacts(name="dsv41-r1", id="f" * 64, image="vllm/vllm-openai", status="running", labels={})
    facts = with_node(load_facts(CONVERGED_FACTS), WORKER, containers=[foreign])
    result = plan_of(facts)
    assert not [action for action in result.actions if action.component == "ranks"]
    (blocker,) = [blocker for blocker in result.blockers if blocker.component == "ranks"]
    assert blocker.node == WORKER
    assert "a container named dsv41-r1 is not the reconciler's (running, image vllm/vllm-openai)" in blocker.message
    assert "docker rm -f dsv41-r1" in blocker.hint
    assert "dsv41-r1" in render_text(result)


def test_an_owned_container_that_is_no_longer_a_rank_is_removed() -> None:
    converged = load_facts(CONVERGED_FACTS)
    stray = (
        converged.nodes[WORKER]
        .containers[0]
        .model_copy(
            update={
                "name": "dsv41-r2",
                "labels": {**converged.nodes[WORKER].containers[0].labels, "io.spark-reconciler.rank": "2"},
            }
        )
    )
    facts = with_node(converged, WORKER, containers=[*converged.nodes[WORKER].containers, stray])
    result = plan_of(facts)
    assert [(a.verb, a.target) for a in result.actions] == [("remove", "dsv41-r2")]


def test_an_unreachable_worker_blocks_the_group_without_touching_it() -> None:
    facts = with_node(load_facts(CONVERGED_FACTS), WORKER, reachable=False, error="ssh: timed out")
    result = plan_of(facts)
    assert not result.has_changes
    assert [(b.node, b.component) for b in result.blockers] == [(WORKER, "ranks")]
    assert "ssh: timed out" in result.blockers[0].message


def test_undetected_fabric_blocks_with_the_override_to_set() -> None:
    facts = with_node(empty_facts(), WORKER, fabric=FabricFacts())
    result = plan_of(facts)
    assert not any(a.component == "ranks" for a in result.actions)
    blocker = result.blockers[0]
    assert blocker.node == WORKER
    assert "fabric.ifname" in blocker.hint
    assert "rdma link" in blocker.hint


def test_spec_fabric_overrides_win_over_detection() -> None:
    deployment = reference_deployment()
    worker = deployment.nodes[1]
    override = worker.fabric.model_copy(update={"ip": "10.10.10.11", "ifname": "enp1s0f1np1", "hcas": ["rocep1s0f1"]})
    nodes = [deployment.nodes[0], worker.model_copy(update={"fabric": override})]
    facts = with_node(load_facts(CONVERGED_FACTS), WORKER, fabric=FabricFacts())
    result = plan(deployment.model_copy(update={"nodes": nodes}), facts)
    cause = by_id(result, "ranks.start-dsv41-r1@spark-worker").cause
    assert "NCCL_IB_HCA rocep1s0f1,roceP2p1s0f1 -> rocep1s0f1" in cause


def test_api_key_with_a_wrong_mode_is_fixed_not_rotated() -> None:
    facts = with_node(load_facts(CONVERGED_FACTS), HEAD, api_key=KeyFileFacts(present=True, empty=False, mode=0o644))
    result = plan_of(facts)
    assert [(a.id, a.verb) for a in result.actions] == [("apikey.chmod@spark-head", "update")]
    assert "0644" in result.actions[0].cause
    assert "kept" in result.actions[0].summary


def test_an_empty_key_file_is_recreated() -> None:
    facts = with_node(load_facts(CONVERGED_FACTS), HEAD, api_key=KeyFileFacts(present=True, empty=True, mode=0o600))
    result = plan_of(facts)
    assert ids(result)[0] == "apikey.create@spark-head"
    assert result.actions[0].cause == "key file is empty"


def test_a_changed_guard_floor_restarts_the_guards_only() -> None:
    deployment = reference_deployment()
    tighter = deployment.model_copy(update={"memguard": deployment.memguard.model_copy(update={"floor_gib": 1.5})})
    result = plan(tighter, load_facts(CONVERGED_FACTS))
    assert ids(result) == ["memguard.restart@spark-worker", "memguard.restart@spark-head"]


def test_a_disabled_guard_is_stopped() -> None:
    deployment = reference_deployment()
    off = deployment.model_copy(update={"memguard": deployment.memguard.model_copy(update={"enabled": False})})
    result = plan(off, load_facts(CONVERGED_FACTS))
    assert [(a.id, a.verb) for a in result.actions] == [
        ("memguard.stop@spark-worker", "remove"),
        ("memguard.stop@spark-head", "remove"),
    ]


def test_a_guard_trip_holds_the_group_instead_of_restarting_it() -> None:
    converged = load_facts(CONVERGED_FACTS)
    trip = {"at": "2026-11-29T21:04:05Z", "mem_available_gib": 0.83, "floor_gib": 1.0}
    guard = GuardFacts.model_validate(
        {"running": True, "config_hash": guard_config_hash(reference_deployment()), "trip": trip}
    )
    facts = with_container(with_node(converged, WORKER, guard=guard), WORKER, status="exited", exit_code=137)
    result = plan_of(facts)
    assert [(a.verb, a.target) for a in result.actions] == [("stop", "dsv41-r0")]
    assert "lower serving.kv_bytes or serving.gpu_util" in result.notes[0].lower()
    assert "0.83 GiB" in result.notes[0]


def test_a_hold_keeps_the_group_down_until_start() -> None:
    facts = with_node(empty_facts(), HEAD, hold=Hold(since="2026-11-29T21:00:00Z"))
    result = plan_of(facts)
    assert not any(a.component == "ranks" for a in result.actions)
    assert "reconciler start" in result.notes[0]


def test_a_corrupt_shard_is_restored_atomically_and_the_group_restarts() -> None:
    """The serving group may have read the bad bytes (weights load lazily, Engram tables are read
    from disk while serving): the file is replaced whole, then the group restarts, saying why."""
    converged = load_facts(CONVERGED_FACTS)
    corrupt = FileFacts(size=45_000_000_000, sha256="0" * 64)
    result = plan_of(with_tree_files(converged, HEAD, {"model-00003-of-00006.safetensors": corrupt}))
    download = by_id(result, "checkpoint.download@spark-head")
    assert "sha256 mismatch" in download.cause
    assert "model-00003-of-00006.safetensors" in download.cause
    assert [item.path for item in download.payload.files] == ["model-00003-of-00006.safetensors"]  # type: ignore[union-attr]
    assert ids(result)[:3] == [
        "checkpoint.download@spark-head",
        "checkpoint.verify@spark-head",
        "checkpoint.stage-plan@spark-head",
    ]
    stop = by_id(result, "ranks.stop-dsv41-r0@spark-head")
    assert "restored by atomic replacement" in stop.cause
    assert "may have read the bad bytes" in stop.cause
    assert "checkpoint.switch@spark-head" not in ids(result)


def test_a_corrupt_file_the_engine_never_reads_restarts_nothing() -> None:
    converged = load_facts(CONVERGED_FACTS)
    manifest_file = converged.nodes[HEAD].checkpoint.revisions[COMMIT].files["README.md"]
    changed = {"README.md": manifest_file.model_copy(update={"sha256": "0" * 64})}
    listing = with_hub_sha(converged, "README.md", "1" * 64)
    result = plan_of(with_tree_files(listing, HEAD, changed))
    assert "checkpoint.download@spark-head" in ids(result)
    assert not any(action.component == "ranks" for action in result.actions)


def test_an_unverified_file_is_verified_without_downloading() -> None:
    converged = load_facts(CONVERGED_FACTS)
    unverified = {"model-00001-of-00006.safetensors": FileFacts(size=45_000_000_000)}
    result = plan_of(with_tree_files(converged, WORKER, unverified))
    assert ids(result) == ["checkpoint.verify@spark-worker", "checkpoint.stage-plan@spark-worker"]


def test_leftover_parts_are_pruned_unless_kept() -> None:
    converged = load_facts(CONVERGED_FACTS)
    facts = with_tree_files(converged, HEAD, {"model-00005-of-00006.safetensors.part00": FileFacts(size=10)})
    assert "checkpoint.prune@spark-head" in ids(plan_of(facts))
    deployment = reference_deployment()
    keep = deployment.model_copy(update={"model": deployment.model.model_copy(update={"keep_parts": True})})
    assert not plan(keep, facts).has_changes


def test_parts_present_are_reassembled_not_downloaded() -> None:
    converged = load_facts(CONVERGED_FACTS)
    parts = {f"model-00006-of-00006.safetensors.part0{n}": FileFacts(size=10) for n in (0, 1)}
    facts = with_tree_files(converged, HEAD, parts, drop=["model-00006-of-00006.safetensors"])
    result = plan_of(facts)
    head_steps = [a.id for a in result.actions if a.node == HEAD and a.component == "checkpoint"]
    assert head_steps == [
        "checkpoint.reassemble@spark-head",
        "checkpoint.verify@spark-head",
        "checkpoint.prune@spark-head",
        "checkpoint.stage-plan@spark-head",
    ]


def test_a_worker_with_hub_source_downloads_itself() -> None:
    deployment = reference_deployment()
    worker = deployment.nodes[1].model_copy(update={"model_source": "hub"})
    hub = deployment.model_copy(update={"nodes": [deployment.nodes[0], worker]})
    result = plan(hub, empty_facts())
    assert "checkpoint.download@spark-worker" in ids(result)
    assert "checkpoint.copy@spark-worker" not in ids(result)
    assert by_id(result, "checkpoint.download@spark-worker").depends_on == ()


def test_missing_image_is_pulled_on_that_node_only() -> None:
    facts = with_node(load_facts(CONVERGED_FACTS), WORKER, images=[])
    assert ids(plan_of(facts)) == ["image.pull@spark-worker"]


def test_plan_json_is_complete_and_serialisable() -> None:
    data = json.loads(json.dumps(plan_of(empty_facts()).to_dict()))
    assert data["changes"] is True
    assert data["summary"]["add"] == 15
    assert {"id", "component", "verb", "node", "summary", "cause", "depends_on", "target"} <= set(data["actions"][0])
    assert [n["name"] for n in data["nodes"]] == [HEAD, WORKER]


def test_facts_round_trip_through_json() -> None:
    facts = converged_facts()
    assert Facts.model_validate_json(facts.to_json()) == facts


def test_stop_stops_the_running_ranks_even_when_something_else_blocks_them() -> None:
    """A hold written while a worker's disk is too full for a repair: the ranks still stop."""
    converged = load_facts(CONVERGED_FACTS)
    corrupt = {"model-00002-of-00006.safetensors": FileFacts(size=45_000_000_000, sha256="0" * 64)}
    facts = with_tree_files(converged, WORKER, corrupt)
    worker = facts.nodes[WORKER].checkpoint.model_copy(update={"disk_free": 10**9})
    facts = with_node(facts, WORKER, checkpoint=worker)
    held = with_node(facts, HEAD, hold=Hold(since="2026-11-29T21:00:00Z"))
    result = plan_of(held)
    assert any(b.component == "checkpoint" for b in result.blockers)
    assert {a.id for a in result.actions if a.component == "ranks"} == {
        "ranks.halt-dsv41-r0@spark-head",
        "ranks.halt-dsv41-r1@spark-worker",
    }


def test_a_plan_with_blocked_parts_never_says_the_deployment_matches() -> None:
    from reconciler.actions import Blocker, Component

    blocker = Blocker("spark-head", Component.CHECKPOINT, "the Hub was not asked", "check the network")
    blocked_only = Plan("dsv41", [], [], blockers=[blocker])
    text = render_text(blocked_only)
    assert "matches the spec" not in text
    assert "Nothing could be planned for checkpoint on spark-head: the deployment may still differ" in text
    mixed = plan(reference_deployment(), empty_facts())
    mixed.blockers.append(blocker)
    assert "to run. Not planned: checkpoint on spark-head.\n" in render_text(mixed)


def rendered_by_an_earlier_reconciler(facts: Facts, *, inputs_changed: bool = False) -> Facts:
    """The ranks as an earlier version rendered them: another config hash, and (unless
    `inputs_changed`, the owner's edit) the same spec and node inputs."""
    nodes = dict(facts.nodes)
    for name, observed in facts.nodes.items():
        containers = []
        for container in observed.containers:
            labels = dict(container.labels)
            if labels.get("io.spark-reconciler.role", "") == "":  # a rank
                labels["io.spark-reconciler.config-hash"] = "v2:rendered-by-0.0.9"
                if inputs_changed:
                    labels["io.spark-reconciler.inputs"] = "another spec"
            containers.append(container.model_copy(update={"labels": labels}))
        nodes[name] = observed.model_copy(update={"containers": containers})
    return facts.model_copy(update={"nodes": nodes})


def rank_steps(result: Plan) -> list[str]:
    return [action.id for action in result.actions if action.component == "ranks"]


def test_a_reconciler_upgrade_alone_is_held_for_the_owner_and_taken_by_apply() -> None:
    deployment = reference_deployment()
    upgraded = rendered_by_an_earlier_reconciler(load_facts(CONVERGED_FACTS))
    held = plan(deployment, upgraded, take_upgrade=False)
    assert rank_steps(held) == []
    assert any("this reconciler renders the ranks differently" in note for note in held.notes), held.notes
    assert any("`reconciler apply` restarts it onto this version" in note for note in held.notes)
    taken = plan(deployment, upgraded)
    assert [step for step in rank_steps(taken) if step.startswith("ranks.start-")], rank_steps(taken)
    assert any("reconciler upgrade" in action.cause for action in taken.actions if action.component == "ranks")


def test_an_owner_s_edit_or_a_failure_restarts_with_the_upgrade_even_under_the_loop() -> None:
    deployment = reference_deployment()
    edited = rendered_by_an_earlier_reconciler(load_facts(CONVERGED_FACTS), inputs_changed=True)
    assert rank_steps(plan(deployment, edited, take_upgrade=False))
    failed = with_container(
        rendered_by_an_earlier_reconciler(load_facts(CONVERGED_FACTS)), "spark-worker", status="exited", exit_code=1
    )
    assert rank_steps(plan(deployment, failed, take_upgrade=False))


def test_an_upgrade_does_not_hide_a_dead_engine_or_a_restart_cut_short() -> None:
    from reconciler.facts.node import Liveness

    deployment = reference_deployment()
    upgraded = rendered_by_an_earlier_reconciler(load_facts(CONVERGED_FACTS))
    dead = upgraded.model_copy(update={"liveness": Liveness(failures=3, detail="POST answered 500")})
    assert rank_steps(plan(deployment, dead, take_upgrade=False)), "a dead engine is restarted, upgrade and all"


def started_inputs(result: Plan) -> dict[str, str]:
    """Each started rank's name and the digest of what it is rendered from."""
    from reconciler.actions import StartRank
    from reconciler.serving import LABEL_INPUTS

    starts = [a.payload for a in result.actions if isinstance(a.payload, StartRank)]
    return {start.container.name: start.container.labels[LABEL_INPUTS] for start in starts}


def test_the_rendering_s_inputs_change_with_the_owner_s_edit_only() -> None:
    from reconciler.serving import LABEL_INPUTS

    deployment = reference_deployment()
    facts = load_facts(CONVERGED_FACTS)
    containers = [c for node in facts.nodes.values() for c in node.containers if c.name.startswith("dsv41-r")]
    running = {c.name: c.labels[LABEL_INPUTS] for c in containers}
    assert started_inputs(plan(deployment, rendered_by_an_earlier_reconciler(facts))) == running
    edited = started_inputs(plan(with_serving(deployment, kv_bytes=2_000_000_000), facts))
    assert edited
    assert not set(edited.values()) & set(running.values())


def test_a_bring_up_s_totals_say_what_it_fetches_copies_and_needs_on_disk() -> None:
    result = plan(reference_deployment(), load_facts(EMPTY_FACTS))
    totals = result.totals()
    downloaded = sum(item.size for a in result.actions if isinstance(a.payload, Download) for item in a.payload.files)
    assert totals["download_bytes"] == downloaded > 400 * 1000**3
    assert totals["copy_bytes"] == downloaded, "the worker gets every byte over the fabric"
    # The head holds the split shards whole beside their parts until the parts are deleted.
    assert totals["disk_bytes"]["spark-head"] > downloaded
    assert totals["disk_bytes"]["spark-worker"] == downloaded
    assert plan(reference_deployment(), load_facts(CONVERGED_FACTS)).totals()["disk_bytes"] == {}
