"""What every command shares: lazy start-up, help with examples and defaults, exit codes
(usage errors 1, Ctrl-C 130), shell completion, and the status table and its exit code."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from reconciler import commands
from reconciler.cli import main, observe
from reconciler.cli.completion import bash_script, tree, zsh_script
from reconciler.cli.parser import HelpFormatter, build_parser
from reconciler.facts.node import load_facts
from reconciler.plan import plan
from tests.scenarios import EMPTY_FACTS, ROOT, SPEC_PATH, reference_deployment

# What a command that only reads a spec or a facts file must never load: each costs start-up
# time (docker and paramiko most), and none is needed to parse YAML or to plan.
HEAVY = ("docker", "paramiko", "httpx", "huggingface_hub", "requests", "watchfiles", "tenacity", "matplotlib")


def loaded_after(*argv: str) -> set[str]:
    """Top-level modules loaded by running the command in a fresh interpreter."""
    return {name.split(".")[0] for name in modules_after(*argv)}


def modules_after(*argv: str) -> set[str]:
    """Every module loaded by running the command in a fresh interpreter."""
    code = (
        "import sys, io, contextlib\n"
        "from reconciler.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        f"    try:\n        main({list(argv)!r})\n    except SystemExit:\n        pass\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    env = {name: value for name, value in os.environ.items() if name != "PYDANTIC_DISABLE_PLUGINS"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, check=True)
    return set(result.stdout.split())


@pytest.mark.parametrize(
    "argv",
    [
        ["--version"],
        ["--help"],
        ["completion", "bash"],
        ["validate", "--spec", str(SPEC_PATH)],
        ["plan", "--spec", str(SPEC_PATH), "--facts", str(EMPTY_FACTS)],
    ],
)
def test_commands_that_touch_no_node_load_no_node_client(argv: list[str]) -> None:
    assert loaded_after(*argv) & set(HEAVY) == set()


def test_version_and_help_do_not_even_load_pydantic_or_yaml() -> None:
    for argv in (["--version"], ["--help"], ["plan", "--help"]):
        assert modules_after(*argv) & {"pydantic", "yaml", "pydantic_core"} == set()


# What planning from a file never needs, each a measurable part of its start-up: the executors'
# side of apply (progress, transports), the saved plan's payload validator and the Pi config
# editor. (pydantic's plugin loader still imports importlib.metadata, and email and zipfile with
# it, even with plugins disabled: that is pydantic's, left as it is.)
NOT_FOR_A_PLAN = (
    "reconciler.execution",
    "reconciler.progress",
    "reconciler.transport",
    "reconciler.transport.base",
    "reconciler.savedplan",
    "pydantic.type_adapter",
    "reconciler.pi.jsonc",
)


@pytest.mark.parametrize(
    "argv",
    [["validate", "--spec", str(SPEC_PATH)], ["plan", "--spec", str(SPEC_PATH), "--facts", str(EMPTY_FACTS)]],
)
def test_validate_and_plan_from_a_file_load_only_what_they_use(argv: list[str]) -> None:
    assert modules_after(*argv) & set(NOT_FOR_A_PLAN) == set()


def test_no_model_field_has_a_builtin_list_factory() -> None:
    """pydantic reads a default factory's signature, and `list`'s is parsed from its text (start-up)."""
    import pydantic

    import reconciler.plan
    import reconciler.savedplan  # noqa: F401  (loads every model a plan holds)

    def models(cls: type[pydantic.BaseModel]) -> Iterator[type[pydantic.BaseModel]]:
        for sub in cls.__subclasses__():
            yield sub
            yield from models(sub)

    ours = [model for model in models(pydantic.BaseModel) if model.__module__.startswith("reconciler.")]
    assert len(ours) > 30  # the spec's and the facts' (payloads are records: no factory reaches pydantic)
    for model in ours:
        for name, info in model.model_fields.items():
            assert info.default_factory is not list, (model.__name__, name)


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--spec", "x.yaml", "--facts", "f.json", "-v", "--json"],
        ["apply", "saved.plan", "--yes", "--wait", "30"],
        ["status", "--watch"],
        ["pi", "install", "http://10.0.0.1:8000", "--set-default"],
        ["bench", "compare", "a.json", "b.json"],
        ["logs", "r0", "--tail", "5"],
        ["init", "--worker", "me@spark2"],
        ["completion", "zsh"],
        ["plan", "--bogus"],
        ["plan", "--facts"],
        ["pi"],
        ["paln"],
        ["--json", "plan", "--spec", "x"],
        ["-h"],
        ["--help", "plan"],
        ["--version"],
        ["--vers"],
        ["--version", "--bogus"],
        ["plan", "-h"],
        [],
    ],
)
def test_the_tree_for_one_command_line_parses_it_as_the_whole_tree(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from reconciler.cli.parser import parse

    def outcome(parser: argparse.ArgumentParser) -> tuple[object, str, str]:
        try:
            result: object = vars(parse(parser, list(argv)))
        except SystemExit as exited:
            result = exited.code
        captured = capsys.readouterr()
        return result, captured.out, captured.err

    assert outcome(build_parser(argv)) == outcome(build_parser())


# --- help -----------------------------------------------------------------------------------------


def subcommands(parser: argparse.ArgumentParser, path: str = "") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield f"{path} {name}".strip(), child
                yield from subcommands(child, f"{path} {name}")


def test_every_subcommand_has_a_description_an_example_and_shows_its_defaults() -> None:
    found = list(subcommands(build_parser()))
    assert len(found) >= 19  # 16 commands, 3 pi actions
    for name, parser in found:
        text = parser.format_help()
        assert parser.description, name
        assert re.search(r'examples:\n  (sudo "\$\(command -v reconciler\)"|(sudo )?reconciler) ', text), name
        for action in parser._actions:
            shown = action.default not in (None, False, argparse.SUPPRESS) and action.option_strings
            if shown and action.help != argparse.SUPPRESS:
                assert "default" in HelpFormatter("x")._get_help_string(action), (name, action.dest)


def test_plan_help_shows_the_wait_default_of_apply(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["apply", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "(default: 600)" in out
    assert "reconciler apply tonight.plan" in out


# --- exit codes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--detailed-exitcode", "--no-such-option"],
        ["no-such-command"],
        ["status", "--watch", "soon"],
        ["status", "--watch", "0"],
        ["bench", "--reps", "0", "--out", "x.json"],
    ],
)
def test_a_usage_error_exits_1_not_2_which_means_changes(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 1
    assert "--help" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "usage"), [([], "usage: reconciler [-h]"), (["pi"], "usage: reconciler pi ")])
def test_no_command_shows_the_help(argv: list[str], usage: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(usage)
    assert "examples:" in out or "ACTION" in out


@pytest.mark.parametrize(
    ("argv", "meant"),
    [
        (["aplly"], "did you mean `reconciler apply`?"),
        (["staus"], "did you mean `reconciler status`"),
        (["pi", "instal"], "did you mean `reconciler pi install`"),
        (["xyzzy"], "`reconciler --help` lists the commands"),
    ],
)
def test_a_mistyped_command_is_named_with_the_one_meant(
    argv: list[str], meant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert f"unknown {'action' if len(argv) > 1 else 'command'} '{argv[-1]}'" in err
    assert meant in err
    assert "choose from" not in err, "one line, not the list of every command"


def test_an_unknown_option_is_reported_by_its_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["plan", "--bogus"])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("usage: reconciler plan ")
    assert "`reconciler plan --help`" in err


def test_ctrl_c_in_a_handler_exits_130(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from reconciler.cli import deploy

    def interrupted(_args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(deploy, "validate", interrupted)
    assert main(["validate"]) == 130
    assert "run the command again" in capsys.readouterr().err


@contextmanager
def silent_server(key: str) -> Iterator[tuple[int, threading.Event]]:
    """Accepts connections, reads each request and never answers: a command talking to it waits
    until interrupted. Yields the port and an event set once a whole request carrying `key` came
    in (a request of another test that happened onto this port does not count)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()
    asked = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                connection = listener.accept()[0]
            except TimeoutError:
                continue
            held.append(connection)
            if f"Bearer {key}".encode() in _request_head(connection):
                asked.set()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], asked
    finally:
        stop.set()
        thread.join()
        for connection in held:
            connection.close()
        listener.close()


def _request_head(connection: socket.socket) -> bytes:
    """A request's bytes up to the end of its headers (what came, if the peer stops sooner)."""
    connection.settimeout(5)
    head = b""
    while b"\r\n\r\n" not in head:
        try:
            more = connection.recv(4096)
        except TimeoutError:
            break
        if not more:
            break
        head += more
    return head


def wait_until_asleep(pid: int) -> None:
    """Until the process sleeps (state S): once it has sent its whole request, the one thing it
    sleeps in is the wait for the answer. A Ctrl-C that lands before that wait begins is one
    CPython sees only when the wait ends (the handler runs between two bytecodes, and the
    system call was not yet there to be interrupted): a person's Ctrl-C meets a command that
    waits, and so does this test's."""
    deadline = time.monotonic() + 60
    while Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "S":
        assert time.monotonic() < deadline, "the command never settled into waiting for its answer"
        time.sleep(0.01)


# `python -m reconciler` with Python's own Ctrl-C handler, as from a terminal: a test run started
# in the background (`cmd &` in a script) hands its children SIGINT ignored, and Python then
# installs no KeyboardInterrupt handler.
AS_FROM_A_TERMINAL = [
    sys.executable,
    "-c",
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('reconciler', run_name='__main__', alter_sys=True)",
]


def test_ctrl_c_on_a_real_process_exits_130(tmp_path: Path) -> None:
    key = "k" * 32
    (tmp_path / "key").write_text(key + "\n", encoding="utf-8")
    with silent_server(key) as (port, asked):
        process = subprocess.Popen(
            [*AS_FROM_A_TERMINAL, "smoke", f"http://127.0.0.1:{port}", "--key-file", str(tmp_path / "key")],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # Not a fixed pause: on a loaded machine the imports alone may outlast it, and a Ctrl-C
        # there is Python's, not the command's.
        assert asked.wait(60), "the command never sent its first request"
        wait_until_asleep(process.pid)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 130, err
    assert "Traceback" not in err


# --- status ---------------------------------------------------------------------------------------


def status_report(*, converged: bool) -> dict[str, Any]:
    deployment = reference_deployment()
    current = plan(deployment, load_facts(EMPTY_FACTS))
    components = {name: commands._components(current, name) for name in ("spark-head", "spark-worker")}
    steps = {
        name: {c: len(s) for c, s in commands._pending_steps(current, name).items()}
        for name in ("spark-head", "spark-worker")
    }
    node = {
        "rank": 0,
        "role": "head",
        "reachable": True,
        "error": None,
        "mem_available_gib": 118.25,
        "containers": [{"name": "dsv41-r0", "status": "running", "exit_code": None}],
        "guard": {"running": True, "trip": None},
        "hold": None,
    }
    worker = {**node, "rank": 1, "role": "worker", "containers": [], "guard": {"running": False, "trip": None}}
    return {
        "deployment": "dsv41",
        "loop": None,
        "api": "http://127.0.0.1:8000",
        "tls_fingerprint": None,
        "health": 200 if converged else None,
        "liveness": None,
        "converged": converged,
        "nodes": {
            "spark-head": {
                **node,
                "components": {} if converged else components["spark-head"],
                "pending_steps": {} if converged else steps["spark-head"],
            },
            "spark-worker": {
                **worker,
                "components": {} if converged else components["spark-worker"],
                "pending_steps": {} if converged else steps["spark-worker"],
            },
        },
        "pending": [],
        "conditions": [],
        "summary": "",
    }


def test_each_component_shows_its_first_pending_step_not_its_last() -> None:
    deployment = reference_deployment()
    current = plan(deployment, load_facts(EMPTY_FACTS))
    checkpoint = [a for a in current.actions if a.node == "spark-head" and a.component == "checkpoint"]
    assert len(checkpoint) > 2
    state = commands._components(current, "spark-head")["checkpoint"]
    assert state.startswith(f"pending: {checkpoint[0].summary}")
    assert f"(+{len(checkpoint) - 1} more steps)" in state


def test_status_renders_a_table_a_person_scans() -> None:
    text = observe.render_status(status_report(converged=False))
    lines = text.splitlines()
    assert lines[0].startswith("deployment dsv41: NOT converged (")
    header = next(line for line in lines if line.startswith("NODE"))
    for column in ("RANK", "CONTAINERS", "STATE", "MEM FREE", "GUARD", "SYNC"):
        assert column in header
    head_row = next(line for line in lines if line.startswith("spark-head "))
    assert "r0 running" in head_row
    assert "dsv41-r0" not in head_row, "the first line names the deployment"
    assert "118.2 GiB" in head_row
    assert "steps pending" in head_row
    assert "next step of each component:" in lines
    assert any(line.startswith("  checkpoint on spark-head: pending: ") for line in lines)
    assert "api: http://127.0.0.1:8000 (the front)" in lines
    assert not any(line.startswith("tls:") for line in lines)
    fingerprint = "AB:" * 31 + "CD"
    with_tls = observe.render_status({**status_report(converged=True), "tls_fingerprint": fingerprint})
    assert f"tls: sha256 fingerprint {fingerprint}" in with_tls.splitlines()


@pytest.mark.parametrize(("converged", "code"), [(True, 0), (False, 2)])
def test_status_exits_0_converged_2_not(
    converged: bool, code: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_session(monkeypatch, [status_report(converged=converged)])
    assert main(["status", "--spec", str(SPEC_PATH)]) == code
    out = capsys.readouterr().out
    assert ("NOT converged" in out) is not converged
    fake_session(monkeypatch, [status_report(converged=converged)])
    assert main(["status", "--spec", str(SPEC_PATH), "--json"]) == code
    assert json.loads(capsys.readouterr().out)["converged"] is converged


def test_status_watch_refreshes_until_ctrl_c_one_json_object_per_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_session(monkeypatch, [status_report(converged=False), status_report(converged=True)])
    naps: list[float] = []

    def nap(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", nap)
    assert main(["status", "--spec", str(SPEC_PATH), "--watch", "--json"]) == 130
    objects = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [o["converged"] for o in objects] == [False, True]
    assert naps == [5.0, 5.0]


def fake_session(monkeypatch: pytest.MonkeyPatch, reports: list[dict[str, Any]]) -> None:
    """commands.session and commands.status without nodes: each status call returns the next report."""
    pending = list(reports)

    @contextmanager
    def session(_deployment: object) -> Iterator[dict[str, object]]:
        yield {}

    def status(*_args: object, **_kwargs: object) -> dict[str, Any]:
        return pending.pop(0) if len(pending) > 1 else pending[0]

    monkeypatch.setattr(commands, "session", session)
    monkeypatch.setattr(commands, "status", status)


# --- completion -------------------------------------------------------------------------------


def bash_complete(script: Path, *words: str) -> list[str]:
    program = (
        f"source {script}\n"
        'COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1))\n'
        "_reconciler\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    result = subprocess.run(["bash", "-c", program, "bash", *words], capture_output=True, text=True, check=True)
    return result.stdout.split()


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tree(build_parser())
    directory = tmp_path_factory.mktemp("completion")
    (directory / "reconciler.bash").write_text(bash_script(root), encoding="utf-8")
    (directory / "_reconciler").write_text(zsh_script(root), encoding="utf-8")
    return {"bash": directory / "reconciler.bash", "zsh": directory / "_reconciler"}


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["reconciler", "pl"], ["plan"]),
        (["reconciler", "pi", ""], ["install", "uninstall", "status"]),
        (["reconciler", "plan", "--det"], ["--detailed-exitcode"]),
        (["reconciler", "smoke", "--checks", ""], ["all", "protocol"]),
        (["reconciler", "logs", ""], ["r0", "r1", "memguard"]),
        (["reconciler", "completion", "z"], ["zsh"]),
        (["reconciler", "plan", "--spec", "x.yaml", "--verb"], ["--verbose"]),
        (["reconciler", "st"], ["status", "stop", "start", "storage"]),
        # the command's positional slots, counted as argparse counts them
        (["reconciler", "logs", "r0", "--"], ["--help", "--spec", "--node", "--follow", "--tail"]),
        (["reconciler", "logs", "r0", ""], ["-h", "--help", "--spec", "--node", "-f", "--follow", "--tail"]),
        (["reconciler", "bench", "--conc", "1", "2", "--out", "x.json", ""], ["compare"]),
        (["reconciler", "bench", "--kinds", "code", ""], ["code", "prose", "random"]),
        (["reconciler", "smoke", "--checks="], ["--checks=all", "--checks=protocol"]),
        (["reconciler", "plan", "--de"], ["--detailed-exitcode"]),
    ],
)
def test_bash_completion_offers_commands_options_and_values(
    scripts: dict[str, Path], words: list[str], expected: list[str]
) -> None:
    assert bash_complete(scripts["bash"], *words) == expected


def test_bash_completion_offers_files_for_a_path_option(scripts: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "deployment.yaml").write_text("", encoding="utf-8")
    assert bash_complete(scripts["bash"], "reconciler", "plan", "--spec", f"{tmp_path}/dep") == [
        f"{tmp_path}/deployment.yaml"
    ]
    assert bash_complete(scripts["bash"], "reconciler", "bench", "compare", f"{tmp_path}/d") == [
        f"{tmp_path}/deployment.yaml"
    ]
    assert bash_complete(scripts["bash"], "reconciler", "apply", f"{tmp_path}/d") == [f"{tmp_path}/deployment.yaml"]


def test_bash_completion_marks_file_candidates_as_file_names(scripts: dict[str, Path]) -> None:
    """So bash adds the slash after a directory and quotes a name with a space."""
    assert "compopt -o filenames" in scripts["bash"].read_text(encoding="utf-8")


ZSH = shutil.which("zsh") or "/usr/bin/zsh"
needs_zsh = pytest.mark.skipif(not Path(ZSH).exists(), reason="no zsh here (`make unit` installs it as root)")


def zsh_complete(script: Path, *words: str) -> list[str]:
    """The script's logic under zsh, with the completion system's builtins recorded instead of
    drawn: _describe prints its "name:description" lines, compadd its words, _files FILES."""
    program = (
        '_describe() { print -l -- "${(@P)4}"; }\n'
        "compadd() { local p=''; [[ $1 == -P ]] && { p=$2; shift 2; }; [[ $1 == -- ]] && shift; "
        'print -l -- "${@/#/$p}"; }\n'
        "_files() { print FILES; }\n"
        'words=("$@"); CURRENT=${#words}\n'
        f"source {script}\n"
    )
    env = {**os.environ, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    result = subprocess.run([ZSH, "-f", "-c", program, "zsh", *words], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@needs_zsh
def test_zsh_completion_describes_commands_and_options(scripts: dict[str, Path]) -> None:
    commands_offered = zsh_complete(scripts["zsh"], "reconciler", "")
    assert "plan:show what apply would change" in commands_offered
    assert any(line.startswith("install-service:") for line in commands_offered)
    offered = [line.split(":")[0] for line in zsh_complete(scripts["zsh"], "reconciler", "pi", "")]
    assert offered == ["install", "uninstall", "status"]
    options = zsh_complete(scripts["zsh"], "reconciler", "status", "--")
    assert any(line.startswith("--watch:refresh every SECONDS") for line in options)
    assert zsh_complete(scripts["zsh"], "reconciler", "smoke", "--checks", "") == ["all", "protocol"]
    assert zsh_complete(scripts["zsh"], "reconciler", "plan", "--spec", "") == ["FILES"]
    assert zsh_complete(scripts["zsh"], "reconciler", "smoke", "--checks=") == ["--checks=all", "--checks=protocol"]
    assert zsh_complete(scripts["zsh"], "reconciler", "bench", "compare", "") == ["FILES"]
    assert zsh_complete(scripts["zsh"], "reconciler", "logs", "r0", "")[0].startswith("-h:")


@needs_zsh
def test_zsh_script_parses() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "reconciler", "completion", "zsh"], capture_output=True, text=True, cwd=ROOT, check=True
    )
    checked = subprocess.run([ZSH, "-n"], input=result.stdout, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize("argv", [["--verison"], ["pi", "--bogus"]])
def test_an_option_without_a_command_is_an_error_not_the_help(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 1


def test_bench_compare_has_help_of_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "compare", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: reconciler bench compare ")
    assert "--prefill" not in out, "not bench's options"
