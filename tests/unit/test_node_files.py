"""Files on nodes are private and written safely: a 0700 state dir, 0600 files, temporary files
created exclusively and never through a symlink, reads that refuse FIFOs and devices."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from reconciler import nodeside
from reconciler.nodeside import common, copydaemon
from reconciler.nodeside import ops as node_ops
from reconciler.transport.base import run_program
from reconciler.transport.local import LocalTransport

NODE = LocalTransport("local")


def run(call: str, private_dir: Path | None = None, **args: Any) -> Any:
    """One operation exactly as apply sends it: through `ops.run`, naming the state dir."""
    request = {"call": call, "args": args, "private_dir": str(private_dir) if private_dir else None}
    return run_program(NODE, "ops", "run", request)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_the_state_dir_is_created_private_and_files_in_it_are_0600(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run("write_file", state, path=str(state / "hold.json"), content="{}\n")
    assert mode_of(state) == 0o700
    assert mode_of(state / "hold.json") == 0o600


def test_an_open_state_dir_left_by_the_reference_scripts_is_made_private(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)
    run("mkdirs", state, paths=[str(state / "plans")])
    assert mode_of(state) == 0o700


def test_a_symlink_at_the_target_is_replaced_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    state = tmp_path / "state"
    state.mkdir()
    (state / "api_key").symlink_to(victim)
    assert run("write_file", state, path=str(state / "api_key"), content="key\n", keep_existing=True)["written"]
    assert not victim.exists()
    assert not (state / "api_key").is_symlink()
    assert mode_of(state / "api_key") == 0o600


@pytest.fixture
def predictable_names(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    names = ["aaaa", "bbbb"]
    handed: list[str] = []

    def token(_size: int) -> str:
        handed.append(names[len(handed)])
        return handed[-1]

    monkeypatch.setattr("reconciler.nodeside.ops._token", token)
    return handed


def test_a_symlink_planted_at_the_temporary_name_cannot_redirect_the_key(
    tmp_path: Path, predictable_names: list[str]
) -> None:
    victim = tmp_path / "victim"
    target = tmp_path / "api_key"
    (tmp_path / "api_key.tmp-aaaa").symlink_to(victim)
    node_ops.atomic_write(str(target), b"secret\n")
    assert predictable_names == ["aaaa", "bbbb"]
    assert not victim.exists()
    assert target.read_bytes() == b"secret\n"
    assert mode_of(target) == 0o600


@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "huge"])
def test_reading_a_file_refuses_what_would_block_or_never_end(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "file"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path = Path("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(b"x" * 2048)
    answer = run("read_text", path=str(path), limit=1024)
    assert answer["text"] is None
    assert answer["error"]


def test_a_key_file_that_is_not_utf8_is_read_with_its_bytes_kept_for_the_check(tmp_path: Path) -> None:
    path = tmp_path / "api_key"
    path.write_bytes(b"abc\xffdef\n")
    assert run("read_text", path=str(path))["text"] is None
    assert run("read_text", path=str(path), errors="surrogateescape")["text"] == "abc\udcffdef\n"


def test_the_hash_cache_is_private(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "a.bin").write_bytes(b"x")
    cache = tmp_path / "state" / "hashcache.json"
    run("hash_files", tmp_path / "state", model_dir=str(model), files=["a.bin"], cache=str(cache))
    assert mode_of(cache) == 0o600


@pytest.mark.parametrize("module", ["probe", "ops"])
def test_a_shipped_program_names_state_files_without_the_package(tmp_path: Path, module: str) -> None:
    """A node has python3 and nothing of ours: the state-dir layout travels inside the program."""
    shipped = nodeside.source(module) + "\nprint(StateDir('/s/').hold)\n"
    result = subprocess.run(
        [sys.executable, "-I", "-"], input=shipped, capture_output=True, text=True, cwd=tmp_path, check=False
    )
    assert (result.returncode, result.stdout) == (0, "/s/hold.json\n"), result.stderr


def test_the_shipped_memory_guard_runs_from_its_state_dir_alone(tmp_path: Path) -> None:
    state = tmp_path / "state"
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 131072000 kB\nMemAvailable: 104857600 kB\n", encoding="utf-8")
    config = {"floor_gib": 1, "interval_s": 0.05, "labels": ["x=y"], "config_hash": "h", "meminfo": str(meminfo)}
    run("guard_start", state, state_dir=str(state), program=nodeside.source("memguard"), config=config)
    try:
        log = state / "memguard.log"
        deadline = time.monotonic() + 30
        while not (log.exists() and "memguard start" in log.read_text(encoding="utf-8")):
            assert time.monotonic() < deadline, "the guard never logged its start"
            time.sleep(0.05)
    finally:
        assert run("guard_stop", state, state_dir=str(state)) == {"stopped": True}


def sleeper(*argv: str) -> subprocess.Popen[bytes]:
    """A process of this test's own that waits to be stopped; its own session, like the node's daemons."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", *argv], start_new_session=True, close_fds=True
    )
    deadline = time.monotonic() + 10
    while b"time.sleep" not in Path(f"/proc/{process.pid}/cmdline").read_bytes():  # exec may still be under way
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return process


def test_a_stale_pid_file_never_stops_an_unrelated_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The pid a guard's or copy daemon's pid file names may since belong to another program."""
    state = tmp_path / "state"
    (state / "copy-daemon").mkdir(parents=True)
    unrelated = sleeper()
    try:
        (state / "memguard.pid").write_text(f"{unrelated.pid}\n")
        (state / "copy-daemon" / "daemon.pid").write_text(f"{unrelated.pid}\n")
        assert node_ops.guard_stop({"state_dir": str(state)}) == {"stopped": False}
        copydaemon.stop({"dir": str(state / "copy-daemon")})
        assert capsys.readouterr().out == '{"stopped": false}\n'
        time.sleep(0.2)
        assert unrelated.poll() is None, "a process that is not ours was signalled"
    finally:
        unrelated.kill()
        unrelated.wait()
    (state / "memguard.pid").write_text("1\n")
    assert common.pid_of(str(state / "memguard.pid")) is None, "init is never a process of ours"


def test_a_stale_pid_file_check_still_stops_our_own_guard(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    guard = sleeper(str(state / "memguard.py"), str(state))  # the guard's command line
    try:
        (state / "memguard.pid").write_text(f"{guard.pid}\n")
        reaper = threading.Thread(target=guard.wait)  # as init reaps a node's detached guard
        reaper.start()
        assert node_ops.guard_stop({"state_dir": str(state)}) == {"stopped": True}
        reaper.join(timeout=10)
        assert guard.returncode == -signal.SIGTERM
    finally:
        guard.kill()
        guard.wait()


def test_children_start_with_a_clean_environment_the_guard_gets_no_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret_of_the_session")
    monkeypatch.setenv("DSV41_API_KEY", "sk-secret-of-the-session")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/docker.sock")
    state = tmp_path / "state"
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 131072000 kB\nMemAvailable: 104857600 kB\n", encoding="utf-8")
    config = {"floor_gib": 1, "interval_s": 0.05, "labels": ["x=y"], "config_hash": "h", "meminfo": str(meminfo)}
    request = {
        "call": "guard_start",
        "args": {"state_dir": str(state), "program": nodeside.source("memguard"), "config": config},
    }
    # As a node runs it: `python3 -` in a session whose environment holds the secrets.
    started = subprocess.run(
        [sys.executable, "-"], input=nodeside.program("ops", "run", request), capture_output=True, check=True
    )
    pid = json.loads(started.stdout)["pid"]
    try:
        environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    finally:
        assert run("guard_stop", state, state_dir=str(state)) == {"stopped": True}
    names = {entry.split(b"=", 1)[0] for entry in environment if entry}
    assert not names & {b"HF_TOKEN", b"DSV41_API_KEY"}
    assert f"DOCKER_HOST=unix://{tmp_path}/docker.sock".encode() in environment, "the guard's way to the ranks"


@pytest.mark.parametrize("streaming", [False, True])
def test_children_start_with_a_clean_environment_a_local_node_command_gets_no_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, streaming: bool
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret_of_the_session")
    monkeypatch.setenv("DSV41_API_KEY", "sk-secret-of-the-session")
    monkeypatch.setenv("RECONCILER_SYSFS_ROOT", str(tmp_path))
    show = [sys.executable, "-c", "import os; print(' '.join(sorted(os.environ)))"]
    result = NODE.run(show, on_line=(lambda _line: None) if streaming else None)
    names = set(result.stdout.decode().split())
    assert not names & {"HF_TOKEN", "DSV41_API_KEY"}
    assert "RECONCILER_SYSFS_ROOT" in names, "where a testbed node's sysfs is"
