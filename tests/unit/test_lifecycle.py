"""The lifecycle's pure parts and node-side file work: what storage calls safe, what uninstall
finds and in which order it removes, the boot service's removal, the node's footprint (hard
links counted once), removal that never reaches the home, and asking before acting."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from reconciler import commands, lifecycle, service
from reconciler.actions import Component
from reconciler.cli import lifecycle as cli_lifecycle
from reconciler.cli.common import ask
from reconciler.cli.parser import build_parser
from reconciler.constants import UNIT_NAME
from reconciler.errors import ReconcilerError
from reconciler.nodeside import ops
from reconciler.plan import plan
from reconciler.service import UnitSettings, render_unit
from tests.scenarios import SPEC_PATH, converged_facts, empty_facts, reference_deployment
from tests.unit.test_service import FakeSystemctl

COMMIT_A, COMMIT_B, COMMIT_C = "a" * 40, "b" * 40, "c" * 40


def revision(path: str, *, serving: bool = False, size: int = 10, partial: int = 0) -> ops.RevisionUsage:
    return {"path": path, "bytes": size, "freed": size, "serving": serving, "partial_bytes": partial}


def holding(*revisions: ops.RevisionUsage) -> ops.Footprint:
    """A node's footprint with these revisions beside /m/M and nothing else."""
    return {
        "state_dir": None,
        "engine_cache_bytes": 0,
        "image_store_bytes": 0,
        "guard_running": False,
        "model_dir": "/m/M",
        "model_dir_kind": "link",
        "revisions": list(revisions),
        "pulled": [],
    }


def test_storage_releases_only_a_revision_neither_served_wanted_nor_kept() -> None:
    found = holding(
        revision(f"/m/M@{COMMIT_A}", serving=True),
        revision(f"/m/M@{COMMIT_B}", partial=5),
        revision(f"/m/M@{COMMIT_C}"),
        revision(f"/m/M@{'d' * 40}"),
    )
    items = lifecycle._revision_items("n", found, wanted=COMMIT_B, kept={COMMIT_C})
    assert [(item.status, item.releasable) for item in items] == [
        ("served", False),
        ("the spec's revision, being staged; 5 B unfinished or split", False),
        ("kept for a rollback (model.keep_revisions)", False),
        ("not served, not kept: safe to release", True),
    ]


def test_the_storage_report_says_what_is_safe_and_how_to_release_it() -> None:
    items = [
        lifecycle.Item("spark-head", "revision", "/m/M@a", 460_000_000_000, "served"),
        lifecycle.Item(
            "spark-head", "image", "r/e@sha256:0123", 9_000_000_000, "ours, no longer used", True, 9_000_000_000
        ),
    ]
    text = lifecycle.render_storage(items)
    assert text.splitlines()[0] == "spark-head:"
    assert "Safe to release: 1 item, 9.0 GB: `reconciler storage --release`." in text
    assert "Nothing is safe to release" in lifecycle.render_storage(items[:1])
    assert "Released 1 of 1: 9.0 GB freed." in lifecycle.render_storage(items, items[1:])
    assert "Released 0 of 1: 0 B freed." in lifecycle.render_storage(items, [])


def test_the_node_footprint_counts_a_hard_linked_file_once_and_frees_only_what_is_unshared(tmp_path: Path) -> None:
    model_dir = tmp_path / "M"
    served, older = tmp_path / f"M@{COMMIT_A}", tmp_path / f"M@{COMMIT_B}"
    served.mkdir()
    older.mkdir()
    (served / "shared.safetensors").write_bytes(b"x" * 100_000)
    os.link(served / "shared.safetensors", older / "shared.safetensors")
    (older / "own.safetensors").write_bytes(b"y" * 50_000)
    (older / "big.safetensors.part01").write_bytes(b"z" * 20_000)
    model_dir.symlink_to(served.name)
    state = tmp_path / "state"
    (state / "cache").mkdir(parents=True)
    (state / "cache" / "kernels").write_bytes(b"k" * 30_000)
    (state / "images" / "blobs" / "sha256").mkdir(parents=True)
    (state / "images" / "blobs" / "sha256" / ("ab" * 32)).write_bytes(b"i" * 40_000)
    found = ops.footprint({"state_dir": str(state), "model_dir": str(model_dir)})
    by_path = {item["path"]: item for item in found["revisions"]}
    assert found["model_dir_kind"] == "link"
    assert by_path[str(served)]["serving"]
    assert not by_path[str(older)]["serving"]
    assert by_path[str(older)]["bytes"] >= 170_000
    assert 70_000 <= by_path[str(older)]["freed"] < 100_000, "the shared file stays with the served revision"
    assert by_path[str(older)]["partial_bytes"] == 20_000
    assert found["engine_cache_bytes"] >= 30_000
    assert found["image_store_bytes"] >= 40_000
    assert found["state_dir"] is not None
    assert found["pulled"] == []
    assert not found["guard_running"]


def test_a_footprint_of_nothing_creates_nothing(tmp_path: Path) -> None:
    found = ops.footprint({"state_dir": str(tmp_path / "state"), "model_dir": str(tmp_path / "M")})
    assert found["state_dir"] is None
    assert found["revisions"] == []
    assert found["model_dir_kind"] == "absent"
    assert list(tmp_path.iterdir()) == []


def test_remove_trees_takes_what_it_wrote_and_the_checkpoint_never_the_home_or_yours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    served = tmp_path / f"M@{COMMIT_A}"
    served.mkdir()
    (served / "f").write_text("x")
    (tmp_path / "M").symlink_to(served.name)
    state = tmp_path / "state"
    (state / "cache").mkdir(parents=True)
    for name in ("api_key", "events.jsonl", "events.jsonl.2", "starts.json", "api_key.tmp-0123456789abcdef"):
        (state / name).write_text("x")
    (tmp_path / "other").mkdir()
    home = ops.remove_trees({"state_dir": "~", "model_dir": "~/M", "remove": ["state"]})
    assert home["removed"] == []
    assert "is the root, the home or a directory above the home" in home["left"][0]
    ops.remove_trees({"state_dir": "~/state", "model_dir": "~/M", "remove": ["state"]})
    assert not state.exists()
    assert served.is_dir(), "the checkpoint stays without 'checkpoint'"
    removed = ops.remove_trees({"state_dir": "~/state", "model_dir": "~/M", "remove": ["checkpoint"]})
    assert sorted(removed["removed"]) == sorted([str(served), str(tmp_path / "M")])
    assert removed["left"] == []
    assert sorted(path.name for path in tmp_path.iterdir()) == ["other"]


def test_a_checkpoint_or_a_file_of_yours_inside_the_state_dir_stays(tmp_path: Path) -> None:
    state = tmp_path / "dsv41"
    served = state / f"M@{COMMIT_A}"
    served.mkdir(parents=True)
    (served / "model.safetensors").write_text("weights")
    (state / "M").symlink_to(served.name)
    (state / "notes.txt").write_text("mine")
    (state / "plans").mkdir()
    (state / "memguard.log").write_text("log")
    result = ops.remove_trees({"state_dir": str(state), "model_dir": str(state / "M"), "remove": ["state"]})
    assert sorted(result["removed"]) == sorted([str(state / "plans"), str(state / "memguard.log")])
    assert sorted(line.split(":")[0] for line in result["left"]) == sorted(
        [str(served), str(state / "M"), str(state / "notes.txt")]
    )
    assert (served / "model.safetensors").read_text() == "weights"


def test_with_the_head_not_answering_no_revision_is_called_spare() -> None:
    found = holding(revision(f"/m/M@{COMMIT_A}", serving=True), revision(f"/m/M@{COMMIT_B}"))
    items = lifecycle._revision_items("n", found, wanted=None, kept=None)
    assert [item.releasable for item in items] == [False, False]
    assert "unknown while the head does not answer" in items[1].status


def test_the_spec_refuses_the_home_or_the_root_as_the_state_dir() -> None:
    from reconciler.errors import SpecError
    from reconciler.spec import parse_spec

    text = SPEC_PATH.read_text(encoding="utf-8")
    for bad in ("~", "~/", "/"):
        with pytest.raises(SpecError) as refused:
            parse_spec(text.replace("state_dir: ~/.dsv41-two-sparks", f'state_dir: "{bad}"'), "s.yaml")
        assert "not a directory of the reconciler's own" in str(refused.value.problems[0].render())


def test_rotate_key_refuses_when_the_front_waits_for_another_step_or_is_blocked() -> None:
    deployment = reference_deployment()
    made = plan(deployment, empty_facts())
    reason = lifecycle.front_not_ready(made)
    assert reason is not None
    assert reason.startswith("it waits for ")
    front_only = commands.only_components(plan(deployment, empty_facts()), frozenset({Component.FRONT}))
    assert lifecycle.front_not_ready(front_only) is None, "alone, its own steps wait for nothing"
    ready = plan(deployment, converged_facts(deployment))
    assert lifecycle.front_not_ready(ready) is None


def test_uninstall_removes_in_an_order_that_leaves_nothing_to_restart_the_rest() -> None:
    planned = lifecycle.UninstallPlan(
        removals=[
            lifecycle.Removal("n", "state", "/s"),
            lifecycle.Removal("n", "image", "r/e"),
            lifecycle.Removal("n", "container", "dsv41-r1"),
            lifecycle.Removal(lifecycle.HERE, "service", UNIT_NAME),
            lifecycle.Removal("n", "guard", "memory guard"),
        ],
        kept=[lifecycle.Removal("n", "checkpoint", "/m/M", "kept; --checkpoint removes it")],
    )
    kinds = [removal.kind for removal in lifecycle._in_order(planned.removals)]
    assert kinds == ["service", "guard", "container", "image", "state"]
    text = lifecycle.render_uninstall_plan(planned)
    assert text.splitlines()[1] == f"  - this machine: service {UNIT_NAME}"
    assert "  kept: n: checkpoint /m/M (kept; --checkpoint removes it)" in text
    nothing = lifecycle.render_uninstall_plan(lifecycle.UninstallPlan())
    assert nothing.startswith("Nothing to remove")


def test_only_the_boot_service_of_this_spec_is_ours_to_remove(tmp_path: Path) -> None:
    spec = tmp_path / "deployment.yaml"
    spec.write_text("", encoding="utf-8")
    assert lifecycle.our_unit(tmp_path, str(spec)) is None
    settings = UnitSettings("/usr/bin/reconciler", str(spec.resolve()), "me", "/home/me", ())
    (tmp_path / UNIT_NAME).write_text(render_unit(settings), encoding="utf-8")
    assert lifecycle.our_unit(tmp_path, str(spec)) == tmp_path / UNIT_NAME
    assert lifecycle.our_unit(tmp_path, str(tmp_path / "another.yaml")) is None


def test_the_service_is_stopped_disabled_then_its_unit_removed(tmp_path: Path) -> None:
    unit = tmp_path / UNIT_NAME
    systemctl = FakeSystemctl()
    ran = service.uninstall(unit, systemd_running=True, run=systemctl, as_root=True)
    assert systemctl.commands == [f"systemctl disable --now {UNIT_NAME}", f"rm -f {unit}", "systemctl daemon-reload"]
    assert ran == systemctl.commands
    as_owner = FakeSystemctl()
    service.uninstall(unit, systemd_running=False, run=as_owner, as_root=False)
    assert as_owner.commands == [f"sudo -n rm -f {unit}"], "not root: through sudo, and no systemctl without systemd"
    with pytest.raises(ReconcilerError, match="failed"):
        service.uninstall(unit, systemd_running=True, run=FakeSystemctl("disable"), as_root=True)


def test_without_root_or_sudo_nothing_is_removed_and_the_commands_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ReconcilerError, match="needs root, and sudo did not answer") as refused:
        service.check_can_remove(tmp_path / UNIT_NAME, run=FakeSystemctl("sudo"), interactive=False)
    assert f"sudo systemctl disable --now {UNIT_NAME}" in refused.value.hint
    service.check_can_remove(tmp_path / UNIT_NAME, run=FakeSystemctl(), interactive=False)


def test_a_running_loop_of_this_spec_is_found_by_its_command_line(tmp_path: Path) -> None:
    spec = tmp_path / "specs" / "deployment.yaml"
    spec.parent.mkdir()
    spec.write_text("", encoding="utf-8")
    proc = tmp_path / "proc"
    for pid, argv, cwd in (
        ("101", ["/venv/bin/python3", "/venv/bin/reconciler", "run", "--spec", str(spec)], "/"),
        ("102", ["/venv/bin/reconciler", "run"], str(tmp_path)),  # the default spec, from its cwd
        ("103", ["/venv/bin/reconciler", "run", "--spec", "/elsewhere.yaml"], "/"),
        ("104", ["/venv/bin/reconciler", "plan", "--spec", str(spec)], "/"),
        ("105", ["python", "-P", "-m", "reconciler", "run", f"--spec={spec}"], "/"),
    ):
        (proc / pid).mkdir(parents=True)
        (proc / pid / "cmdline").write_bytes("\0".join(argv).encode() + b"\0")
        (proc / pid / "cwd").symlink_to(cwd)
    assert sorted(service.loops_running(str(spec), proc)) == [101, 102, 105]


def test_uninstall_without_the_right_to_remove_the_unit_removes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked before anything goes: a user who may not remove the unit loses nothing else."""
    unit = tmp_path / UNIT_NAME
    unit.write_text("", encoding="utf-8")

    def refuse(_unit: Path) -> None:
        raise ReconcilerError("removing it needs root", "run sudo")

    monkeypatch.setattr(service, "check_can_remove", refuse)
    removed: list[lifecycle.Removal] = []

    def remove(_d: object, _t: object, removal: lifecycle.Removal) -> list[str]:
        removed.append(removal)
        return []

    monkeypatch.setattr(lifecycle, "_remove", remove)
    planned = lifecycle.UninstallPlan(
        removals=[
            lifecycle.Removal("n", "container", "dsv41-r1"),
            lifecycle.Removal(lifecycle.HERE, "service", UNIT_NAME, "", str(unit)),
        ]
    )
    with pytest.raises(ReconcilerError, match="needs root"):
        lifecycle.uninstall(reference_deployment(), {}, planned, spec_path=str(tmp_path / "s.yaml"), say=print)
    assert removed == []
    assert unit.exists()


def test_a_failed_removal_is_reported_and_the_rest_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deployment = reference_deployment().model_copy(update={"state_dir": str(tmp_path / "state")})

    def remove(_d: object, _t: object, removal: lifecycle.Removal) -> list[str]:
        if removal.kind == "image":
            raise ReconcilerError("conflict: image is being used by a container of yours", "")
        return ["/s/notes.txt: not written by the reconciler"] if removal.kind == "state" else []

    monkeypatch.setattr(lifecycle, "_remove", remove)
    monkeypatch.setattr(service, "loops_running", lambda _spec: [])
    planned = lifecycle.UninstallPlan(
        removals=[
            lifecycle.Removal("n", "state", "/s"),
            lifecycle.Removal("n", "image", "r/e"),
            lifecycle.Removal("n", "container", "dsv41-r1"),
        ]
    )
    said: list[str] = []
    outcome = lifecycle.uninstall(deployment, {}, planned, spec_path="s.yaml", say=said.append)
    assert [removal.kind for removal in outcome.done] == ["container", "state"]
    assert outcome.failed == [
        "n: image r/e: conflict: image is being used by a container of yours",
        "n: /s/notes.txt: not written by the reconciler",
    ]
    assert said[-1] == "removed n: state /s (in part: see below)"
    assert not (tmp_path / "state").exists(), "the lock taken to uninstall leaves no trace"


def test_a_loop_still_running_stops_uninstall_before_anything_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "loops_running", lambda _spec: [4242])
    monkeypatch.setattr(lifecycle, "_remove", lambda *_args: pytest.fail("nothing may be removed"))
    planned = lifecycle.UninstallPlan(removals=[lifecycle.Removal("n", "container", "dsv41-r1")])
    deployment = reference_deployment().model_copy(update={"state_dir": str(tmp_path / "state")})
    outcome = None
    with pytest.raises(ReconcilerError, match="pid 4242"):
        outcome = lifecycle.uninstall(deployment, {}, planned, spec_path="s.yaml", say=print)
    assert outcome is None


def test_rotate_key_runs_the_fronts_steps_alone() -> None:
    deployment = reference_deployment()
    made = plan(deployment, empty_facts())
    assert {action.component for action in made.actions} > {Component.FRONT}
    front = commands.only_components(made, frozenset({Component.FRONT}))
    assert front.actions
    assert {action.component for action in front.actions} == {Component.FRONT}
    ids = {action.id for action in front.actions}
    assert all(set(action.depends_on) <= ids for action in front.actions)


def test_without_a_terminal_the_question_is_answered_no_with_the_hint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("yes\n"))
    assert not ask("uninstall removes 5 things", yes=False)
    err = capsys.readouterr().err
    assert "error: uninstall removes 5 things, and there is nobody to ask (stdin is not a terminal)" in err
    assert "add --yes to the same command" in err
    assert ask("anything", yes=True)


@pytest.mark.parametrize(
    "argv",
    [
        ["rotate-key", "--yes", "--json"],
        ["storage", "--release", "-y"],
        ["uninstall", "--checkpoint", "--dry-run", "--json"],
    ],
)
def test_the_lifecycle_commands_parse(argv: list[str]) -> None:
    args = build_parser(argv).parse_args(argv)
    assert args.handler.startswith("lifecycle:")


def test_uninstall_refuses_to_run_under_sudo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUDO_USER", "me")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(ReconcilerError, match="run uninstall as me, not under sudo"):
        cli_lifecycle.refuse_sudo()
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    cli_lifecycle.refuse_sudo()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.delenv("SUDO_USER")
    cli_lifecycle.refuse_sudo()  # root itself owns the deployment: fine
