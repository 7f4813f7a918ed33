"""Files on nodes are private and written safely: a 0700 state dir, 0600 files, temporary files
created exclusively and never through a symlink, reads that refuse FIFOs and devices."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from reconciler import nodeside
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
