"""Node-side programs, shipped through `python3 -` exactly as on a remote node."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from reconciler.errors import NodeCommandError
from reconciler.facts.gather import node_facts_from_probe, probe_args
from reconciler.serving import rewrite_exl3_plan
from reconciler.transport.base import run_program
from reconciler.transport.local import LocalTransport
from tests.scenarios import reference_deployment

NODE = LocalTransport("local")


def ops(call: str, **args: Any) -> Any:
    return run_program(NODE, "ops", "run", {"call": call, "args": args})


def test_write_file_is_atomic_with_mode_and_never_replaces_a_kept_file(tmp_path: Path) -> None:
    target = tmp_path / "state" / "api_key"
    assert ops("write_file", path=str(target), content="first\n", mode=0o600, keep_existing=True)["written"]
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    assert not ops("write_file", path=str(target), content="second\n", mode=0o600, keep_existing=True)["written"]
    assert target.read_text() == "first\n"
    assert [p.name for p in target.parent.iterdir()] == ["api_key"]


def test_hash_cache_reads_no_data_for_an_unchanged_file(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    shard = model / "a.safetensors"
    shard.write_bytes(b"x" * 1000)
    cache = tmp_path / "hashcache.json"
    first = ops("hash_files", model_dir=str(model), files=["a.safetensors"], cache=str(cache))
    assert first["a.safetensors"] == hashlib.sha256(b"x" * 1000).hexdigest()
    # Same size, inode and mtime but different bytes: only a cache hit can return the old hash.
    stat = shard.stat()
    with open(shard, "r+b") as handle:
        handle.write(b"y")
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert ops("hash_files", model_dir=str(model), files=["a.safetensors"], cache=str(cache)) == first
    deep = ops("hash_files", model_dir=str(model), files=["a.safetensors"], cache=str(cache), deep=True)
    assert deep["a.safetensors"] == hashlib.sha256(b"y" + b"x" * 999).hexdigest()


def test_reassemble_concatenates_parts_in_order_and_prune_removes_only_parts(tmp_path: Path) -> None:
    shard = "model-00005-of-00006.safetensors"
    for index, content in enumerate([b"aa", b"bb", b"c"]):
        (tmp_path / f"{shard}.part{index:02d}").write_bytes(content)
    (tmp_path / "model-00006-of-00006.safetensors.part00").write_bytes(b"z")
    assert ops("reassemble", model_dir=str(tmp_path), shards=[shard]) == {shard: 5}
    assert (tmp_path / shard).read_bytes() == b"aabbc"
    removed = ops("prune_parts", model_dir=str(tmp_path))["removed"]
    assert removed == [f"{shard}.part00", f"{shard}.part01", f"{shard}.part02"]
    assert (tmp_path / "model-00006-of-00006.safetensors.part00").exists()


def test_probe_reports_revisions_plans_key_and_a_docker_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """model_dir links to one revision directory beside it; another sits there too; the staged
    plan of each is under STATE_DIR/plans/<commit>/; a hardlinked file keeps its verified hash."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    deployment = reference_deployment()
    served, other = "a" * 40, "b" * 40
    model = tmp_path / "models" / "DeepSeek-V4.1-Flash-Spark"
    revision = Path(f"{model}@{served}")
    (revision / "exl3/plan").mkdir(parents=True)
    plan_text = json.dumps({"qdir": "/x/exl3/qn:/x/exl3/q31"})
    (revision / "exl3/plan/J268-ho-v31-K5n.json").write_text(plan_text)
    (revision / "config.json").write_text("{}")
    Path(f"{model}@{other}").mkdir()
    os.link(revision / "config.json", Path(f"{model}@{other}") / "config.json")
    model.symlink_to(revision.name)
    state = tmp_path / "state"
    (state / "plans" / served).mkdir(parents=True)
    (state / "plans" / served / "J268-ho-v31-K5n.json").write_text(rewrite_exl3_plan(plan_text))
    (state / "api_key").write_text("k\n")
    (state / "api_key").chmod(0o644)
    ops("hash_files", model_dir=str(revision), files=["config.json"], cache=str(state / "hashcache.json"))
    args = {**probe_args(deployment, deployment.head), "model_dir": str(model), "state_dir": str(state)}
    args["key_file"] = str(state / "api_key")
    raw = run_program(NODE, "probe", "print_probe", args)
    assert set(raw["checkpoint"]["revisions"]) == {served, other}
    assert set(raw["checkpoint"]["revisions"][served]["files"]) == {"config.json", "exl3/plan/J268-ho-v31-K5n.json"}
    assert "error" in raw["docker"]
    key_file = raw["key_file"]
    version = key_file.pop("version")
    assert key_file == {"present": True, "size": 2, "mode": 0o644, "uid": os.getuid(), "gid": os.getgid()}
    assert version.endswith(":2")  # mtime ns, inode, size: never the content
    assert version.count(":") == 2
    facts = node_facts_from_probe(deployment.head, raw)
    assert not facts.reachable
    assert facts.error is not None
    assert "docker" in facts.error
    raw["docker"] = {"containers": [], "images": ["img@sha256:1"]}
    facts = node_facts_from_probe(deployment.head.model_copy(update={"model_dir": str(model)}), raw)
    checkpoint = facts.checkpoint
    assert checkpoint.link == served
    tree = checkpoint.revisions[served]
    assert tree.staged_plan == rewrite_exl3_plan(tree.exl3_plan or "")
    digest = hashlib.sha256(b"{}").hexdigest()
    assert tree.files["config.json"].sha256 == digest
    assert checkpoint.revisions[other].files["config.json"].sha256 == digest
    assert facts.api_key is not None
    assert (facts.api_key.present, facts.api_key.empty, facts.api_key.mode) == (True, False, 0o644)
    assert facts.images == ["img@sha256:1"]


def test_reassembly_verifies_each_shard_and_frees_its_parts_before_the_next(tmp_path: Path) -> None:
    shards = {"model-00005-of-00006.safetensors": [b"ab", b"cd"], "model-00006-of-00006.safetensors": [b"ef"]}
    for shard, chunks in shards.items():
        for index, chunk in enumerate(chunks):
            (tmp_path / f"{shard}.part{index:02d}").write_bytes(chunk)
    expected = {shard: hashlib.sha256(b"".join(chunks)).hexdigest() for shard, chunks in shards.items()}
    cache = tmp_path / "cache.json"
    args = {"model_dir": str(tmp_path), "shards": sorted(shards), "expected": expected, "cache": str(cache)}
    ops("reassemble", **args)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.json", *sorted(shards)]
    cached = json.loads(cache.read_text())
    assert {Path(path).name: entry[3] for path, entry in cached.items()} == expected


def test_a_reassembled_shard_that_does_not_match_keeps_its_parts(tmp_path: Path) -> None:
    shard = "model-00005-of-00006.safetensors"
    (tmp_path / f"{shard}.part00").write_bytes(b"abc")
    with pytest.raises(NodeCommandError) as failed:
        ops("reassemble", model_dir=str(tmp_path), shards=[shard], expected={shard: "0" * 64})
    assert "does not match the manifest" in failed.value.message
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{shard}.part00"]


def test_a_guard_pid_file_left_by_a_reboot_names_no_running_guard(tmp_path: Path) -> None:
    """After a reboot the pid file is still there and its pid belongs to whatever started with
    it (here: this test's own process): only a process running the guard's program is a guard."""
    from reconciler.nodeside.probe import process_alive

    pid_file = tmp_path / "memguard.pid"
    pid_file.write_text(f"{os.getpid()}\n")
    assert not process_alive(str(pid_file), [str(tmp_path / "memguard.py")])
    started_as = Path("/proc/self/cmdline").read_bytes().split(b"\0")[0].decode()
    assert process_alive(str(pid_file), [started_as])
    assert not process_alive(str(tmp_path / "absent.pid"), [started_as])


def test_the_fronts_admin_socket_is_found_under_a_home_relative_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default state dir is `~/.dsv41-two-sparks`: the drain switch's socket path arrives
    unexpanded and must still reach the front."""
    import socket
    import threading

    from reconciler.nodeside.ops import front_command

    monkeypatch.setenv("HOME", str(tmp_path))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "admin.sock"))
    listener.listen(1)

    def answer() -> None:
        connection, _ = listener.accept()
        with connection:
            assert connection.recv(100).startswith(b"add acl")
            connection.sendall(b"Done.\n")

    server = threading.Thread(target=answer)
    server.start()
    try:
        reply = front_command({"socket": "~/admin.sock", "command": "add acl /run/front/drain.acl on"})
    finally:
        server.join(5)
        listener.close()
    assert reply == {"answer": "Done.\n"}


def test_the_probe_reads_this_machines_kernel_release_and_boot_id() -> None:
    """/proc/sys files refuse a 4 MiB read (ENOMEM): the host facts read them small."""
    from reconciler.facts.host import host_from_probe
    from reconciler.nodeside.probe import host_facts

    found = host_from_probe(host_facts())
    assert found.kernel == os.uname().release
    assert found.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (
            FileNotFoundError(2, "No such file or directory"),
            "no Docker socket at /var/run/docker.sock: is Docker installed",
        ),
        (PermissionError(13, "Permission denied"), "add the user to the docker group"),
        (ConnectionRefusedError(111, "Connection refused"), "Docker does not answer on /var/run/docker.sock: start it"),
        (TimeoutError(), "did not answer on /var/run/docker.sock in time"),
        (OSError(113, "No route to host"), "cannot ask Docker on /var/run/docker.sock: No route to host"),
        (ValueError("Expecting value"), "cannot be read: Expecting value"),
    ],
)
def test_why_docker_could_not_be_asked_is_said_in_words(
    error: Exception, words: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reconciler.nodeside.common import docker_problem

    monkeypatch.delenv("DOCKER_HOST", raising=False)
    said = docker_problem(error)
    assert words in said
    assert "Error" not in said
    assert "Errno" not in said
