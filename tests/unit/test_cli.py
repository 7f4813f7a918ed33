"""The command line: exit codes, JSON output, and errors without tracebacks."""

from __future__ import annotations

import io
import json
import re
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from reconciler.cli import deploy, main
from reconciler.errors import FactsError, JsoncError, ReadError, ReconcilerError
from reconciler.facts.node import load_facts
from reconciler.plan import plan
from reconciler.spec import schema_text
from tests.scenarios import CONVERGED_FACTS, EMPTY_FACTS, FIXTURES, ROOT, SPEC_PATH, reference_deployment, with_serving

THREE_ERRORS = str(FIXTURES / "specs/three-errors.yaml")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_validate_accepts_the_shipped_spec(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "validate", "--spec", str(SPEC_PATH))
    assert code == 0
    assert "valid (2 nodes" in out
    assert "warning:" in err
    assert "model.revision" in err


def test_validate_reports_every_located_problem_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "validate", "--spec", THREE_ERRORS)
    assert code == 1
    located = [line for line in err.splitlines() if line.startswith(f"error: {THREE_ERRORS}:")]
    assert [line.split(":")[2] for line in located] == ["9", "11", "13"]
    assert err.count("hint:") == 4


def test_validate_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "validate", "--spec", THREE_ERRORS, "--json")
    data = json.loads(out)
    assert code == 1
    assert data["ok"] is False
    assert [p["path"] for p in data["problems"]] == ["nodes[1].fabric.ip", "image.ref", "serving.port"]
    code, out, _ = run(capsys, "validate", "--spec", str(SPEC_PATH), "--json")
    assert code == 0
    assert json.loads(out)["ok"] is True


def test_default_spec_path_comes_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECONCILER_SPEC", THREE_ERRORS)
    assert run(capsys, "validate")[0] == 1
    monkeypatch.delenv("RECONCILER_SPEC")
    monkeypatch.chdir(ROOT)
    assert run(capsys, "validate")[0] == 0


def test_malformed_yaml_never_prints_a_traceback(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("nodes: [\n  {name: a\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "reconciler", "validate", "--spec", str(broken)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"{broken}:3:1: malformed YAML" in result.stderr


def test_plan_from_empty_facts_prints_a_bring_up_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "--spec", str(SPEC_PATH), "--facts", str(EMPTY_FACTS), "--detailed-exitcode")
    assert code == 2
    tail = out.rstrip().splitlines()[-3:]
    assert tail[0] == "Plan: 15 to add, 2 to change, 0 to replace, 0 to destroy, 5 to run.", "pruning parts is no loss"
    assert tail[1] == (
        "Moves: download 460.0 GB, copy over the fabric 460.0 GB; disk needed at most: spark-head 600.0 GB, "
        "spark-worker 460.0 GB."
    )
    assert (
        tail[2]
        == "The API answers 11-13 minutes (a first start on Sparks; none recorded here yet) after the ranks start."
    )
    assert out.index("start dsv41-r1") < out.index("start dsv41-r0") < out.index("wait until GET /v1/models")


def test_plan_from_converged_facts_says_no_changes_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "--spec", str(SPEC_PATH), "--facts", str(CONVERGED_FACTS), "--detailed-exitcode")
    assert code == 0
    assert "No changes." in out


def test_plan_without_detailed_exitcode_exits_0_on_changes(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "plan", "--spec", str(SPEC_PATH), "--facts", str(EMPTY_FACTS))[0] == 0


def test_plan_verbose_says_why_parts_are_in_sync(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "plan", "--spec", str(SPEC_PATH), "--facts", str(CONVERGED_FACTS), "--verbose")
    assert "= ranks on spark-worker: dsv41-r1 running, config current" in out


def test_plan_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "plan", "--spec", str(SPEC_PATH), "--facts", str(EMPTY_FACTS), "--json", "--detailed-exitcode"
    )
    data = json.loads(out)
    assert code == 2
    assert data["changes"] is True
    assert [a["id"] for a in data["actions"]][-3:] == [
        "ranks.smoke@spark-head",
        "checkpoint.switch@spark-head",
        "checkpoint.switch@spark-worker",
    ]


def test_plan_with_unreadable_facts_fails_clearly(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "facts.json"
    bad.write_text('{"version": 1, "nodes": {"spark-head": {"homee": "/x"}}}', encoding="utf-8")
    code, _, err = run(capsys, "plan", "--spec", str(SPEC_PATH), "--facts", str(bad), "--detailed-exitcode")
    assert code == 1
    assert "homee" in err
    assert "hint:" in err


def test_plan_with_facts_for_other_nodes_fails_clearly(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    other = tmp_path / "facts.json"
    other.write_text('{"version": 1, "nodes": {"spark-head": {}}}', encoding="utf-8")
    code, _, err = run(capsys, "plan", "--spec", str(SPEC_PATH), "--facts", str(other))
    assert code == 1
    assert "spark-worker" in err


def test_live_plan_reports_an_unreachable_worker_as_a_blocker(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Loopback only: a closed local port refuses at once; no other address is ever contacted.
    # No ssh config: this machine's own ~/.ssh/config must not move the connection.
    monkeypatch.setenv("RECONCILER_SSH_CONFIG", "none")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("", encoding="utf-8")
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "nodes:\n"
        f"  - {{name: h, role: head, model_dir: {tmp_path}/m}}\n"
        f"  - {{name: w, ssh: {{host: 127.0.0.1, port: {closed_port}, known_hosts: {known_hosts}}}}}\n"
        f"state_dir: {tmp_path}/state\n",
        encoding="utf-8",
    )
    code, out, _ = run(capsys, "plan", "--spec", str(spec), "--detailed-exitcode")
    assert code == 1
    assert "! w: node unreachable: w: SSH to " in out
    assert f"@127.0.0.1:{closed_port}: cannot connect: " in out


def test_schema_check_and_write(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "schema.json"
    assert run(capsys, "schema", "--out", str(target), "--check")[0] == 1
    assert run(capsys, "schema", "--out", str(target))[0] == 0
    assert target.read_text(encoding="utf-8") == schema_text()
    assert run(capsys, "schema", "--out", str(target), "--check")[0] == 0


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("answer", "goes_ahead"), [("yes\n", True), ("y\n", False), ("\n", False)])
def test_apply_asks_on_a_terminal_before_a_group_restart_even_when_its_output_is_piped(
    monkeypatch: pytest.MonkeyPatch, answer: str, goes_ahead: bool
) -> None:
    restart = plan(with_serving(reference_deployment(), kv_bytes=2_000_000_000), load_facts(CONVERGED_FACTS))
    asked, piped = io.StringIO(), io.StringIO()  # `reconciler apply | tee log`: stdout is no terminal
    monkeypatch.setattr(sys, "stdin", Terminal(answer))
    monkeypatch.setattr(sys, "stdout", piped)
    monkeypatch.setattr(sys, "stderr", asked)
    assert deploy.confirm(restart) is goes_ahead
    assert "restarts or stops the rank group" in asked.getvalue()
    assert ("nothing was changed" in asked.getvalue()) is not goes_ahead
    assert piped.getvalue() == "", "the question goes where a person sees it"


def test_without_a_terminal_a_disruptive_plan_needs_yes(monkeypatch: pytest.MonkeyPatch) -> None:
    restart = plan(with_serving(reference_deployment(), kv_bytes=2_000_000_000), load_facts(CONVERGED_FACTS))
    said = io.StringIO()
    monkeypatch.setattr(sys, "stdin", io.StringIO("yes\n"))  # a pipe's "yes" is no answer
    monkeypatch.setattr(sys, "stderr", said)
    assert deploy.confirm(restart) is False
    assert "this plan restarts or stops the rank group" in said.getvalue()
    assert "nobody to ask (stdin is not a terminal)" in said.getvalue()
    assert "add --yes to the same command" in said.getvalue()


def test_a_harmless_plan_asks_nothing_anywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    harmless = plan(reference_deployment(), load_facts(CONVERGED_FACTS))
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert deploy.confirm(harmless)
    monkeypatch.setattr(sys, "stdin", Terminal(""))
    assert deploy.confirm(harmless)


@pytest.mark.parametrize(
    ("raised", "exit_code", "says"),
    [
        # A reader's finding that no caller turned into a located problem: the bug is ours.
        (JsoncError("expected a value", 3, 7), 1, "internal error: JsoncError: line 3, column 7: expected a value"),
        (FactsError("facts.json:1:1: malformed JSON", "regenerate it"), 1, "facts.json:1:1: malformed JSON"),
    ],
)
def test_a_readers_error_that_reaches_the_cli_is_reported_as_a_bug(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    raised: ReconcilerError,
    exit_code: int,
    says: str,
) -> None:
    def handler(_args: object) -> int:
        raise raised

    monkeypatch.setattr(deploy, "validate", handler)
    code, _, err = run(capsys, "validate", "--spec", str(SPEC_PATH))
    assert code == exit_code
    assert says in err
    assert ("internal error" in err) == isinstance(raised, ReadError)


def status_report(**nodes: Mapping[str, object]) -> dict[str, object]:
    base = {"rank": 0, "role": "head", "reachable": True, "error": None, "mem_available_gib": 10.0, "containers": []}
    base |= {"guard": {"running": True, "trip": None}, "hold": None, "host": {}, "host_changes": []}
    base |= {"components": {}, "pending_steps": {}}
    return {
        "deployment": "dsv41",
        "converged": False,
        "nodes": {name: {**base, **changes} for name, changes in nodes.items()},
        "api": "http://x:8000",
        "health": None,
        "conditions": ["spark-worker: node unreachable: timed out"],
    }


def test_status_names_nodes_it_cannot_see_unknown_in_a_table_that_fits_100_columns() -> None:
    from reconciler.cli.observe import render_status

    long_error = "spark-worker: SSH to root@198.18.10.11:22: cannot connect: " + "x" * 80
    report = status_report(
        **{"spark-head": {}, "spark-worker": {"rank": 1, "reachable": False, "error": long_error}},
    )
    report["conditions"] = [f"spark-worker: node unreachable: {long_error}"]
    text = render_status(report)
    assert text.startswith("deployment dsv41: UNKNOWN: spark-worker not answering\n")
    table = text.split("\n\n")[1].splitlines()
    assert all(len(line) <= 100 for line in table), table
    assert "UNKNOWN" in table[2]
    assert "0 steps pending" not in text
    assert text.count(long_error) == 1, "the cause once, among the conditions"


def test_status_with_nothing_pending_but_blocked_parts_says_so() -> None:
    from reconciler.cli.observe import render_status

    components = {"checkpoint": "blocked: the Hub has no commit 7a3f0c1e"}
    text = render_status(status_report(**{"spark-head": {"components": components}}))
    assert "NOT converged (nothing can be planned: see the conditions below)" in text


def test_plan_json_carries_the_spec_s_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "--spec", str(SPEC_PATH), "--facts", str(CONVERGED_FACTS), "--json")
    assert code == 0
    warnings = json.loads(out)["warnings"]
    assert [warning["path"] for warning in warnings] == ["model.revision"]


def test_a_saved_plan_remembers_its_spec_and_apply_file_reads_that_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other.yaml"
    other.write_text(SPEC_PATH.read_text(encoding="utf-8").replace("\nname: dsv41", "\nname: other"), encoding="utf-8")
    saved = tmp_path / "tonight.plan"
    code, _, err = run(capsys, "plan", "--spec", str(other), "--facts", str(EMPTY_FACTS), "--out", str(saved))
    assert code == 0, err
    assert json.loads(saved.read_text(encoding="utf-8"))["spec_path"] == str(other.resolve())
    applied: list[str] = []

    def converge(deployment: object, _request: object) -> object:
        applied.append(getattr(deployment, "name", ""))
        raise ReconcilerError("stop here", "the test ends the apply")

    monkeypatch.setattr(deploy, "_converge", converge)
    monkeypatch.delenv("RECONCILER_SPEC", raising=False)
    assert run(capsys, "apply", str(saved), "--yes")[0] == 1
    assert applied == ["other"], "the plan's own spec, not the default one"


def test_a_saved_plan_whose_spec_is_gone_says_so(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    moved = tmp_path / "moved.yaml"
    moved.write_text(SPEC_PATH.read_text(encoding="utf-8"), encoding="utf-8")
    saved = tmp_path / "p.plan"
    assert run(capsys, "plan", "--spec", str(moved), "--facts", str(EMPTY_FACTS), "--out", str(saved))[0] == 0
    moved.unlink()
    code, _, err = run(capsys, "apply", str(saved), "--yes")
    assert code == 1
    assert f"was made from {moved.resolve()}, which is not there" in err
    assert "--spec" in err


def test_a_restart_s_outage_comes_from_the_last_start_recorded_here(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from reconciler.starts import keep_start

    state = tmp_path / "state"
    text = SPEC_PATH.read_text(encoding="utf-8").replace("\nstate_dir: ", f"\nstate_dir: {state}  # ", 1)
    text = re.sub(r"(?m)^  kv_bytes: .*$", "  kv_bytes: 2.0GB", text)
    spec = tmp_path / "spec.yaml"
    spec.write_text(text, encoding="utf-8")
    code, out, _ = run(capsys, "plan", "--spec", str(spec), "--facts", str(CONVERGED_FACTS))
    assert code == 0
    assert out.rstrip().endswith("The API is down for 11-13 minutes (a first start on Sparks; none recorded here yet).")
    record = {"at": "2026-12-04T10:00:00Z", "cause_kind": "planned", "ready_s": 662.0, "phases": {"engine_load": 650}}
    keep_start(state / "starts.json", record)
    code, out, _ = run(capsys, "plan", "--spec", str(spec), "--facts", str(CONVERGED_FACTS), "--json")
    assert json.loads(out)["api_outage"] == "The API is down for about 11m02s (the last start recorded here)."


def test_a_held_tripped_head_with_both_containers_still_fits_100_columns() -> None:
    from reconciler.cli.observe import render_status

    stopped = {"status": "exited", "exit_code": 137}
    head = {
        "containers": [
            {"name": "dsv41-r0", **stopped},
            {"name": "dsv41-front", "status": "running", "exit_code": None},
        ],
        "hold": {"since": "2026-12-04T23:36:21Z"},
        "guard": {"running": True, "trip": {"at": "2026-12-04T23:35:58+0000"}},
        "mem_available_gib": 118.25,
        "pending_steps": {"ranks": 3},
    }
    table = render_status(status_report(**{"spark-head": head})).split("\n\n")[1].splitlines()
    assert table[1].split() == [
        "spark-head", "r0", "r0", "exited", "(exit", "137),", "front", "running", "held", "118.2", "GiB", "TRIPPED",
        "3", "steps", "pending",
    ]  # fmt: skip
    assert all(len(line) <= 100 for line in table), table
