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
from reconciler.cli.parser import build_parser
from reconciler.constants import UNIT_NAME
from reconciler.errors import ReconcilerError
from reconciler.nodeside import ops
from reconciler.plan import plan
from reconciler.service import UnitSettings, render_unit
from tests.scenarios import empty_facts, reference_deployment
from tests.unit.test_service import FakeSystemctl

COMMIT_A, COMMIT_B, COMMIT_C = "a" * 40, "b" * 40, "c" * 40


def revision(path: str, *, serving: bool = False, size: int = 10, partial: int = 0) -> ops.RevisionUsage:
    return {"path": path, "bytes": size, "freed": size, "serving": serving, "partial_bytes": partial}


def test_storage_releases_only_a_revision_neither_served_wanted_nor_kept() -> None:
    found: ops.Footprint = {
        "state_dir": None,
        "engine_cache_bytes": 0,
        "guard_running": False,
        "model_dir": "/m/M",
        "model_dir_kind": "link",
        "revisions": [
            revision(f"/m/M@{COMMIT_A}", serving=True),
            revision(f"/m/M@{COMMIT_B}", partial=5),
            revision(f"/m/M@{COMMIT_C}"),
            revision(f"/m/M@{'d' * 40}"),
        ],
        "pulled": [],
    }
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
    assert "Released 1 of 1: 9.0 GB freed." in lifecycle.render_storage(items[1:], items[1:])


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
    found = ops.footprint({"state_dir": str(state), "model_dir": str(model_dir)})
    by_path = {item["path"]: item for item in found["revisions"]}
    assert found["model_dir_kind"] == "link"
    assert by_path[str(served)]["serving"]
    assert not by_path[str(older)]["serving"]
    assert by_path[str(older)]["bytes"] >= 170_000
    assert 70_000 <= by_path[str(older)]["freed"] < 100_000, "the shared file stays with the served revision"
    assert by_path[str(older)]["partial_bytes"] == 20_000
    assert found["engine_cache_bytes"] >= 30_000
    assert found["state_dir"] is not None
    assert found["pulled"] == []
    assert not found["guard_running"]


def test_a_footprint_of_nothing_creates_nothing(tmp_path: Path) -> None:
    found = ops.footprint({"state_dir": str(tmp_path / "state"), "model_dir": str(tmp_path / "M")})
    assert found["state_dir"] is None
    assert found["revisions"] == []
    assert found["model_dir_kind"] == "absent"
    assert list(tmp_path.iterdir()) == []


def test_remove_trees_takes_the_state_and_the_checkpoint_never_the_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    served = tmp_path / f"M@{COMMIT_A}"
    served.mkdir()
    (served / "f").write_text("x")
    (tmp_path / "M").symlink_to(served.name)
    (tmp_path / "state").mkdir()
    (tmp_path / "other").mkdir()
    refused = ops.remove_trees({"state_dir": "~", "model_dir": "~/M", "remove": ["state"]})
    assert refused["removed"] == []
    assert tmp_path.is_dir()
    ops.remove_trees({"state_dir": "~/state", "model_dir": "~/M", "remove": ["state"]})
    assert not (tmp_path / "state").exists()
    assert served.is_dir(), "the checkpoint stays without 'checkpoint'"
    removed = ops.remove_trees({"state_dir": "~/state", "model_dir": "~/M", "remove": ["checkpoint"]})
    assert sorted(removed["removed"]) == sorted([str(served), str(tmp_path / "M")])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["other"]


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
    assert lifecycle._our_unit(tmp_path, str(spec)) is None
    settings = UnitSettings("/usr/bin/reconciler", str(spec.resolve()), "me", "/home/me", ())
    (tmp_path / UNIT_NAME).write_text(render_unit(settings), encoding="utf-8")
    assert lifecycle._our_unit(tmp_path, str(spec)) == tmp_path / UNIT_NAME
    assert lifecycle._our_unit(tmp_path, str(tmp_path / "another.yaml")) is None


def test_the_service_is_stopped_disabled_then_its_unit_removed(tmp_path: Path) -> None:
    unit = tmp_path / UNIT_NAME
    unit.write_text("[Unit]\n", encoding="utf-8")
    systemctl = FakeSystemctl()
    ran = service.uninstall(unit, systemd_running=True, run=systemctl)
    assert systemctl.commands == [f"systemctl disable --now {UNIT_NAME}", "systemctl daemon-reload"]
    assert ran == systemctl.commands
    assert not unit.exists()
    unit.write_text("[Unit]\n", encoding="utf-8")
    assert service.uninstall(unit, systemd_running=False, run=FakeSystemctl()) == []
    assert not unit.exists()
    unit.write_text("[Unit]\n", encoding="utf-8")
    with pytest.raises(ReconcilerError, match="failed"):
        service.uninstall(unit, systemd_running=True, run=FakeSystemctl("disable"))
    assert unit.exists(), "a service that would not stop keeps its unit"


def test_uninstall_without_the_right_to_remove_the_unit_removes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked before anything goes: a user who may not remove the unit loses nothing else."""
    unit = tmp_path / UNIT_NAME
    unit.write_text("", encoding="utf-8")
    writable = {str(tmp_path): False}
    monkeypatch.setattr(os, "access", lambda path, _mode: writable.get(str(path), True))
    removed: list[lifecycle.Removal] = []
    monkeypatch.setattr(lifecycle, "_remove", lambda _d, _t, removal: removed.append(removal))
    planned = lifecycle.UninstallPlan(
        removals=[
            lifecycle.Removal("n", "container", "dsv41-r1"),
            lifecycle.Removal(lifecycle.HERE, "service", UNIT_NAME, "", str(unit)),
        ]
    )
    with pytest.raises(ReconcilerError, match="this user may not write") as refused:
        lifecycle.uninstall(reference_deployment(), {}, planned, say=lambda _line: None)
    assert refused.value.hint == "run `sudo reconciler uninstall`; nothing was removed"
    assert removed == []
    assert unit.exists()


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
    assert not cli_lifecycle.ask("Uninstall removes 5 things", yes=False)
    err = capsys.readouterr().err
    assert "error: Uninstall removes 5 things, and there is nobody to ask (stdin is not a terminal)" in err
    assert "add --yes to the same command" in err
    assert cli_lifecycle.ask("anything", yes=True)


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


def test_under_sudo_home_is_the_invoking_users(monkeypatch: pytest.MonkeyPatch) -> None:
    import pwd

    me = pwd.getpwnam("nobody")  # any account but root: the test may run as root
    monkeypatch.setenv("HOME", "/somewhere/else")
    monkeypatch.setenv("SUDO_USER", me.pw_name)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    cli_lifecycle.as_invoking_user_home()
    assert os.environ["HOME"] == me.pw_dir
    monkeypatch.setenv("HOME", "/somewhere/else")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    cli_lifecycle.as_invoking_user_home()
    assert os.environ["HOME"] == "/somewhere/else", "without sudo nothing changes"
