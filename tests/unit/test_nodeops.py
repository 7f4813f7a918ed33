"""The typed client of the node's file operations: calls through the real node program, and an
answer of the wrong shape refused before anyone reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reconciler.errors import NodeCommandError
from reconciler.nodeops import NodeOps, conforms
from reconciler.nodeside import ops
from reconciler.transport.base import CommandResult
from reconciler.transport.local import LocalTransport


def test_the_operations_run_on_the_node_and_answer_as_declared(tmp_path: Path) -> None:
    state = tmp_path / "state"
    node = NodeOps(LocalTransport("local"), str(state))
    key = state / "api_key"
    assert node.write_file(str(key), "first\n", keep_existing=True)
    assert not node.write_file(str(key), "second\n", keep_existing=True)  # a key is never replaced
    assert node.read_text(str(key)) == {"text": "first\n", "error": None}
    assert oct(state.stat().st_mode & 0o777) == "0o700"  # every call makes the state dir private
    node.chmod(str(key), 0o640)
    assert oct(key.stat().st_mode & 0o777) == "0o640"
    node.mkdirs(str(tmp_path / "a" / "b"), str(tmp_path / "c"))
    assert (tmp_path / "a" / "b").is_dir()
    assert (tmp_path / "c").is_dir()
    assert (node.disk_free(str(tmp_path / "not" / "yet")) or 0) > 0
    node.remove_file(str(key))
    missing = node.read_text(str(key))
    assert missing["text"] is None
    assert missing["error"]  # the node's own words (strerror), whatever its language


class Answering:
    """A transport whose node prints `stdout` for every program."""

    node = "spark-worker"
    round_trips = 0

    def __init__(self, stdout: bytes) -> None:
        self.stdout = stdout

    def run(self, *_argv: Any, **_options: Any) -> CommandResult:
        return CommandResult(0, self.stdout, b"")

    def docker(self) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    "answer",
    [
        b'{"written": "yes"}\n',  # a string where a bool is declared
        b"{}\n",  # the declared key missing
        b'{"written": true, "extra": 1}\n',  # a key the operation never sends
        b"[true]\n",
        b"null\n",
    ],
)
def test_an_answer_of_another_shape_is_a_located_error(answer: bytes) -> None:
    node = NodeOps(Answering(answer), "/state")
    with pytest.raises(NodeCommandError, match=r"^spark-worker: ops\.write_file answered .*not the answer"):
        node.write_file("/state/x", "x")


@pytest.mark.parametrize(
    ("value", "declared", "fits"),
    [
        ({"free": None}, ops.DiskFree, True),
        ({"free": 12}, ops.DiskFree, True),
        ({"free": True}, ops.DiskFree, False),  # JSON's true is no count
        ({"free": 1.5}, ops.DiskFree, False),
        ({"a.safetensors": "ab", "b": None}, dict[str, str | None], True),
        ({"a.safetensors": 3}, dict[str, str | None], False),
        ({"removed": ["x"], "kept": []}, ops.RevisionsRemoved, True),
        ({"removed": ["x"]}, ops.RevisionsRemoved, False),
        ({"removed": "x", "kept": []}, ops.RevisionsRemoved, False),
        ({"text": None, "error": "gone"}, ops.ReadTextResult, True),
    ],
)
def test_an_answer_fits_its_declaration_exactly(value: object, declared: Any, fits: bool) -> None:
    assert conforms(value, declared) is fits


def test_every_operation_the_node_runs_declares_its_arguments_and_its_answer() -> None:
    for name, operation in ops.OPERATIONS.items():
        hints = operation.__annotations__
        assert set(hints) == {"args", "return"}, name
        assert hints["return"] not in ("None", "Any"), name


def test_the_guards_log_is_read_through_the_client_and_nothing_is_created(tmp_path: Path) -> None:
    """`reconciler logs memguard`: its last lines, and on a node without a state dir, nothing
    (a reader makes no directory)."""
    from reconciler import commands
    from reconciler.spec import load_spec

    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"state_dir: {tmp_path}/state\nnodes:\n  - {{name: spark-head, role: head}}\n"
        "  - {name: spark-worker, ssh: {host: 198.18.10.11}}\n",
        encoding="utf-8",
    )
    deployment = load_spec(spec).deployment
    transports: dict[str, Any] = {"spark-head": LocalTransport("spark-head")}
    assert list(commands.guard_log(deployment, transports, "spark-head", tail=2, follow=False)) == [""]
    assert not (tmp_path / "state").exists()
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "memguard.log").write_text("one\ntwo\nthree\n", encoding="utf-8")
    assert list(commands.guard_log(deployment, transports, "spark-head", tail=2, follow=False)) == ["two\nthree\n"]


def test_a_wrong_answer_is_refused_without_repeating_it() -> None:
    """read_text's answer is a file's content (the API key's, for the readiness probe)."""
    node = NodeOps(Answering(b'{"text": "the-key-itself", "error": null, "more": 1}\n'), None)
    with pytest.raises(NodeCommandError) as refused:
        node.read_text("/state/api_key")
    assert "the-key-itself" not in str(refused.value) + refused.value.hint
    assert "answered a JSON dict" in refused.value.message


def test_a_damaged_hash_cache_entry_is_hashed_again_not_answered(tmp_path: Path) -> None:
    import hashlib
    import json

    (tmp_path / "a.safetensors").write_bytes(b"weights")
    info = (tmp_path / "a.safetensors").stat()
    cache = tmp_path / "cache.json"
    damaged = {str(tmp_path / "a.safetensors"): [info.st_size, info.st_mtime_ns, info.st_ino, 5]}
    cache.write_text(json.dumps(damaged), encoding="utf-8")
    digests = NodeOps(LocalTransport("local"), None).hash_files(str(tmp_path), ["a.safetensors"], str(cache))
    assert digests == {"a.safetensors": hashlib.sha256(b"weights").hexdigest()}
