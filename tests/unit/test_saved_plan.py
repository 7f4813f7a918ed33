"""Saved plans: the payloads a plan carries, their JSON (pinned by a golden file), and the
refusal of a plan whose facts or spec changed since it was made."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reconciler import savedplan
from reconciler.actions import Action, StartRank, Step
from reconciler.errors import ReconcilerError, StalePlanError
from reconciler.facts.gather import node_facts_from_probe, probe_args
from reconciler.facts.memory import MemoryFacts
from reconciler.facts.node import Facts, Hold, load_facts
from reconciler.plan import Plan, plan
from reconciler.transport.base import run_program
from reconciler.transport.local import LocalTransport
from tests.scenarios import (
    CONVERGED_FACTS,
    GOLDEN_DIR,
    empty_facts,
    reference_deployment,
    with_container,
    with_node,
    with_serving,
)

GOLDEN = GOLDEN_DIR / "saved-plan-empty.json"
CREATED = "2026-12-01T00:00:00Z"


def saved_empty() -> savedplan.SavedPlan:
    deployment = reference_deployment()
    facts = empty_facts()
    return savedplan.saved(plan(deployment, facts), deployment, facts, created_at=CREATED)


def test_the_saved_plan_json_is_pinned(tmp_path: Path) -> None:
    """Regenerate with tests/fixtures/regenerate.py after a deliberate change; review the diff."""
    path = tmp_path / "plan.json"
    savedplan.write(path, saved_empty())
    written = json.loads(path.read_text(encoding="utf-8"))
    written["made_by"] = "(version)"
    assert written == json.loads(GOLDEN.read_text(encoding="utf-8"))


def test_every_action_carries_the_payload_its_executor_runs() -> None:
    result = saved_empty().plan
    start = next(a for a in result.actions if a.step is Step.START_RANK and a.node == "spark-worker")
    assert isinstance(start.payload, StartRank)
    assert start.payload.container.command[:2] == ("vllm", "serve")
    assert "--headless" in start.payload.container.command
    download = next(a for a in result.actions if a.step is Step.DOWNLOAD)
    sizes = {item.path: item.size for item in download.payload.files}  # type: ignore[union-attr]
    assert "model-00005-of-00006.safetensors.part01" in sizes
    assert all(size is not None and size > 0 for size in sizes.values())


def test_a_saved_plan_reads_back_to_the_same_plan(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    written = saved_empty()
    savedplan.write(path, written)
    again = savedplan.read(path)
    assert again.plan.to_dict() == written.plan.to_dict()
    assert [a.payload for a in again.plan.actions] == [a.payload for a in written.plan.actions]
    assert again.facts == written.facts


def test_the_file_holds_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Facts from a real probe of a head whose key file exists: the key's content is nowhere in
    the saved plan, though the plan mounts the file and rotates nothing."""
    key = "Zq8rW3tY6uI9oP2aS5dF7gH1jK4lM0nBvC6xE3rT9yU"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    deployment = reference_deployment()
    state = tmp_path / "state"
    state.mkdir()
    (state / "api_key").write_text(key + "\n")
    (state / "api_key").chmod(0o644)
    args = {**probe_args(deployment, deployment.head), "state_dir": str(state), "key_file": str(state / "api_key")}
    raw = run_program(LocalTransport("local"), "probe", "print_probe", args)
    raw["docker"] = {"containers": [], "images": []}
    facts = with_node(empty_facts(), "spark-head", api_key=node_facts_from_probe(deployment.head, raw).api_key)
    path = tmp_path / "plan.json"
    savedplan.write(path, savedplan.saved(plan(deployment, facts), deployment, facts))
    text = path.read_text(encoding="utf-8")
    assert any(a.step is Step.CHMOD_KEY for a in savedplan.read(path).plan.actions)
    assert key not in text
    assert key[:12] not in text


def test_facts_that_move_by_themselves_do_not_make_a_plan_stale() -> None:
    deployment = reference_deployment()
    written = saved_empty()
    facts = empty_facts()
    node = facts.nodes["spark-head"]
    memory = MemoryFacts(total_kib=1, available_kib=2)
    checkpoint = node.checkpoint.model_copy(update={"disk_free": (node.checkpoint.disk_free or 0) + 10**9})
    moved = with_node(facts, "spark-head", memory=memory, checkpoint=checkpoint)
    moved = moved.model_copy(update={"taken_at": "later"})
    savedplan.check_current(written, deployment, moved, Path("p.json"), plan(deployment, moved))


def test_a_killed_rank_makes_the_saved_plan_stale_naming_what_changed() -> None:
    deployment = reference_deployment()
    converged = load_facts(CONVERGED_FACTS)
    written = savedplan.saved(plan(deployment, converged), deployment, converged)
    killed = with_container(converged, "spark-worker", status="exited", exit_code=137)
    with pytest.raises(StalePlanError) as stale:
        savedplan.check_current(written, deployment, killed, Path("p.json"), plan(deployment, killed))
    assert "spark-worker containers" in stale.value.message
    assert "reconciler plan --out p.json" in stale.value.hint


def test_an_edited_spec_makes_the_saved_plan_stale() -> None:
    written = saved_empty()
    edited = with_serving(reference_deployment(), kv_bytes=2_000_000_000)
    with pytest.raises(StalePlanError, match="another spec"):
        savedplan.check_current(written, edited, empty_facts(), Path("p.json"), plan(edited, empty_facts()))


@pytest.mark.parametrize("content", ["", "not json", "[]", '{"format": 99}', '{"format": 1, "plan": {}}'])
def test_a_file_that_is_not_a_saved_plan_is_an_error_naming_it(tmp_path: Path, content: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ReconcilerError) as error:
        savedplan.read(path)
    assert str(path) in error.value.message


def test_an_unrelated_image_pulled_since_does_not_make_the_plan_stale() -> None:
    deployment = reference_deployment()
    converged = load_facts(CONVERGED_FACTS)
    written = savedplan.saved(plan(deployment, converged), deployment, converged)
    pulled = with_node(converged, "spark-worker", images=[*converged.nodes["spark-worker"].images, "busybox:latest"])
    savedplan.check_current(written, deployment, pulled, Path("p.json"), plan(deployment, pulled))


def test_a_payload_edited_in_the_file_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """What is shown is summaries; what runs is payloads: an edited payload must not run."""
    deployment = reference_deployment()
    facts = empty_facts()
    path = tmp_path / "plan.json"
    savedplan.write(path, savedplan.saved(plan(deployment, facts), deployment, facts))
    data = json.loads(path.read_text(encoding="utf-8"))
    start = next(a for a in data["plan"]["actions"] if a["step"] == "ranks.start")
    start["payload"]["container"]["image"] = "docker.io/evil/miner:latest"
    path.write_text(json.dumps(data), encoding="utf-8")
    edited = savedplan.read(path)
    with pytest.raises(StalePlanError, match="was it edited"):
        savedplan.check_current(edited, deployment, facts, path, plan(deployment, facts))


@pytest.mark.parametrize("field", ["verb", "step"])
def test_an_action_with_an_unknown_verb_or_step_is_refused(tmp_path: Path, field: str) -> None:
    path = tmp_path / "plan.json"
    savedplan.write(path, saved_empty())
    data = json.loads(path.read_text(encoding="utf-8"))
    data["plan"]["actions"][0][field] = "destroy"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ReconcilerError, match="not a valid saved plan"):
        savedplan.read(path)


def test_a_step_edited_to_another_steps_name_is_refused(tmp_path: Path) -> None:
    """The step follows from the payload: a file naming another step for it was edited."""
    path = tmp_path / "plan.json"
    savedplan.write(path, saved_empty())
    data = json.loads(path.read_text(encoding="utf-8"))
    pull = next(a for a in data["plan"]["actions"] if a["step"] == "image.pull")
    pull["step"] = "memguard.start"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ReconcilerError, match="not a valid saved plan"):
        savedplan.read(path)


def test_an_edited_payload_of_the_wrong_kind_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    savedplan.write(path, saved_empty())
    data = json.loads(path.read_text(encoding="utf-8"))
    data["plan"]["actions"][0]["payload"] = {"kind": "no-such-thing"}
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ReconcilerError, match="not a valid saved plan"):
        savedplan.read(path)


@pytest.mark.parametrize(
    "where",
    [(), ("container",), ("container", "mounts", 0)],
    ids=["payload", "its container", "a mount of the container"],
)
def test_a_key_the_payload_does_not_declare_is_refused_at_any_depth(
    tmp_path: Path, where: tuple[str | int, ...]
) -> None:
    path = tmp_path / "plan.json"
    savedplan.write(path, saved_empty())
    data = json.loads(path.read_text(encoding="utf-8"))
    start = next(a for a in data["plan"]["actions"] if a["step"] == "ranks.start")
    part = start["payload"]
    for key in where:
        part = part[key]
    part["privileged_extra"] = True
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ReconcilerError, match="not a valid saved plan"):
        savedplan.read(path)


def test_actions_round_trip_through_their_dict_form() -> None:
    for item in saved_empty().plan.actions:
        assert Action.from_dict(item.to_dict()) == item


def test_plans_round_trip_through_their_dict_form() -> None:
    result = saved_empty().plan
    assert Plan.from_dict(result.to_dict()).to_dict() == result.to_dict()


def _saved_and_reread(tmp_path: Path, facts: Facts, edit: Callable[[dict[str, Any]], None]) -> savedplan.SavedPlan:
    """The plan of `facts`, saved, its JSON's plan part passed through `edit`, and read back."""
    deployment = reference_deployment()
    path = tmp_path / "plan.json"
    savedplan.write(path, savedplan.saved(plan(deployment, facts), deployment, facts))
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data["plan"])
    path.write_text(json.dumps(data), encoding="utf-8")
    return savedplan.read(path)


HELD = with_node(empty_facts(), "spark-head", hold=Hold(since="2026-12-01T00:00:00Z"))
WORKER_DOWN = with_node(empty_facts(), "spark-worker", reachable=False, error="ssh: timed out")


def test_a_saved_plan_whose_notes_were_edited_is_refused(tmp_path: Path) -> None:
    """The notes are shown at the confirmation prompt: an edited one would mislead it."""

    def reword(document: dict[str, Any]) -> None:
        assert document["notes"]
        document["notes"] = ["all clear: nothing to worry about"]

    edited = _saved_and_reread(tmp_path, HELD, reword)
    deployment = reference_deployment()
    with pytest.raises(StalePlanError, match=r"differs from what its facts give \(its notes\): was it edited"):
        savedplan.check_current(edited, deployment, HELD, tmp_path / "plan.json", plan(deployment, HELD))


def test_a_saved_plan_whose_blockers_were_emptied_is_refused(tmp_path: Path) -> None:
    """Blockers are shown at the prompt and decide the run's outcome (a blocked group is an error)."""

    def empty(document: dict[str, Any]) -> None:
        assert document["blockers"]
        document["blockers"] = []

    edited = _saved_and_reread(tmp_path, WORKER_DOWN, empty)
    deployment = reference_deployment()
    with pytest.raises(StalePlanError, match=r"\(its blockers\): was it edited"):
        savedplan.check_current(edited, deployment, WORKER_DOWN, tmp_path / "plan.json", plan(deployment, WORKER_DOWN))


@pytest.mark.parametrize("facts", [HELD, WORKER_DOWN], ids=["held", "worker down"])
def test_an_unedited_saved_plan_with_notes_and_blockers_still_applies(tmp_path: Path, facts: Facts) -> None:
    unedited = _saved_and_reread(tmp_path, facts, lambda _: None)
    deployment = reference_deployment()
    savedplan.check_current(unedited, deployment, facts, tmp_path / "plan.json", plan(deployment, facts))
    assert unedited.plan.to_dict() == plan(deployment, facts).to_dict()
