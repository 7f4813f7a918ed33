"""The copy to a worker in parallel rsync streams: the split, the argv of each stream, the one
counter per destination, and the copy executor end to end against a recording head."""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from reconciler import apply
from reconciler.actions import Copy, Step, action
from reconciler.components.rsync import CIPHER_OPTION, MAX_STREAMS, StreamMeter, daemon_argv, rsync_argv, stream_count
from reconciler.errors import NodeCommandError
from reconciler.execution import ApplyContext, Progress
from reconciler.facts.fabric import FabricFacts
from reconciler.facts.node import Facts, NodeFacts
from reconciler.nodeside import copydaemon
from reconciler.pipeline import split_streams
from reconciler.plan import plan
from reconciler.progress import Counter
from reconciler.spec import Model, SshTarget
from reconciler.transport.base import CommandResult, LineSink, Transport, run_program
from reconciler.transport.local import LocalTransport
from reconciler.transport.sshroute import resolve_route
from tests.scenarios import empty_facts, reference_deployment, with_node

GB = 1000**3
needs_rsync = pytest.mark.skipif(
    shutil.which("rsync") is None or shutil.which("timeout") is None, reason="a real copy daemon needs rsync"
)
# The reference's shape: two big reassembled shards, four native ones, small EXL3 bank files.
CHECKPOINT = {
    **{f"model-0000{n}-of-00006.safetensors": 45 * GB for n in range(1, 5)},
    "model-00005-of-00006.safetensors": 70 * GB,
    "model-00006-of-00006.safetensors": 70 * GB,
    **{f"exl3/q31/L{n:02d}.part.safetensors": 5 * GB for n in range(28)},
    "config.json": 4096,
}


def test_one_stream_per_core_of_the_head_within_bounds() -> None:
    assert stream_count(2, 41) == 2
    assert stream_count(20, 41) == MAX_STREAMS
    assert stream_count(None, 41) == 1
    assert stream_count(0, 41) == 1
    assert stream_count(16, 3) == 3, "never more streams than files"
    assert stream_count(16, 0) == 1


def test_the_big_shards_go_to_different_streams_and_the_streams_end_close_together() -> None:
    streams = split_streams(CHECKPOINT, 4)
    assert len(streams) == 4
    assert [stream[0] for stream in streams[:2]] == [
        "model-00005-of-00006.safetensors",
        "model-00006-of-00006.safetensors",
    ]
    loads = [sum(CHECKPOINT[name] for name in stream) for stream in streams]
    assert max(loads) - min(loads) <= 5 * GB, "the small files fill the gaps"


def test_the_split_is_the_same_whatever_order_the_files_come_in() -> None:
    reordered = dict(reversed(list(CHECKPOINT.items())))
    assert split_streams(reordered, 3) == split_streams(CHECKPOINT, 3)


def test_fewer_files_than_streams_gives_one_stream_per_file_and_none_empty() -> None:
    assert split_streams({"a": 1, "b": 2}, 8) == [["b"], ["a"]]
    assert split_streams({}, 4) == []


def test_files_of_unknown_size_are_still_copied() -> None:
    assert sorted(name for stream in split_streams({"a": 0, "b": 0, "c": 0}, 2) for name in stream) == ["a", "b", "c"]


@settings(database=None, max_examples=200, deadline=None)
@given(
    sizes=st.dictionaries(st.text(min_size=1, max_size=8), st.integers(min_value=0, max_value=10**12), max_size=60),
    count=st.integers(min_value=1, max_value=12),
)
def test_every_file_is_in_exactly_one_stream_and_no_stream_exceeds_another_by_more_than_one_file(
    sizes: dict[str, int], count: int
) -> None:
    streams = split_streams(sizes, count)
    names = [name for stream in streams for name in stream]
    assert sorted(names) == sorted(sizes)
    assert len(streams) <= count
    assert all(streams)
    if len(streams) == count:
        loads = [sum(sizes[name] for name in stream) for stream in streams]
        assert max(loads) - min(loads) <= max(sizes.values())


def route() -> Any:
    return resolve_route("w", SshTarget(host="10.10.10.11", user="nvidia"), None, "me")


def test_a_stream_copies_its_files_by_name_skipping_complete_ones_unless_told_to_recopy() -> None:
    names = ["model-00001-of-00006.safetensors", "exl3/q31/L00.part.safetensors"]
    resume = rsync_argv(route(), "/m", "/w", names, recopy=False)
    assert "--ignore-times" not in resume
    assert resume[-3:] == [
        "/m/./model-00001-of-00006.safetensors",
        "/m/./exl3/q31/L00.part.safetensors",
        "nvidia@10.10.10.11:/w/",
    ]
    assert "--partial" in resume
    again = rsync_argv(route(), "/m", "/w", names[:1])
    assert again[-3:] == ["--ignore-times", "/m/./model-00001-of-00006.safetensors", "nvidia@10.10.10.11:/w/"]


def test_the_streams_ssh_prefers_aes_gcm_and_keeps_the_route() -> None:
    argv = rsync_argv(route(), "/m", "/w", None)
    ssh = shlex.split(argv[argv.index("-e") + 1])
    assert ssh[-2:] == ["-o", CIPHER_OPTION]
    assert CIPHER_OPTION.startswith("Ciphers=^"), "prepended to the defaults, so any server still negotiates"
    assert "HostName=10.10.10.11" in ssh
    assert "StrictHostKeyChecking=yes" in ssh


PROGRESS_A = "  1,000,000  10%  1.00MB/s    0:00:09 (xfr#1, to-chk=2/3)"
PROGRESS_B = "  3,000,000  30%  1.00MB/s    0:00:07 (xfr#1, to-chk=0/1)"


def test_the_streams_count_as_one_copy_per_destination() -> None:
    seen: list[Counter] = []
    other: list[str] = []
    meter = StreamMeter(seen.append, other.append, 10_000_000, 2)
    meter.lines(0)(PROGRESS_A)
    assert seen[-1] == Counter("copy", 1_000_000, 10_000_000, None, None), "file counts wait for every stream"
    meter.lines(1)(PROGRESS_B)
    assert seen[-1] == Counter("copy", 4_000_000, 10_000_000, 2, 4)
    meter.lines(0)("rsync: connection unexpectedly closed")
    assert other == ["rsync: connection unexpectedly closed"]
    assert len(seen) == 2


def test_without_a_size_the_total_is_the_streams_own_once_all_have_one() -> None:
    seen: list[Counter] = []
    meter = StreamMeter(seen.append, lambda _line: None, None, 2)
    meter.lines(0)(PROGRESS_A)
    assert seen[-1].total is None
    meter.lines(1)(PROGRESS_B)
    assert seen[-1].total == 10_000_000 + 10_000_000


class RecordingHead:
    """The head's transport: records each rsync, reports one progress line, succeeds or fails."""

    node = "spark-head"
    round_trips = 0

    def __init__(self, fail: bool = False) -> None:
        self.argvs: list[list[str]] = []
        self.fail = fail
        self._lock = threading.Lock()

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,  # noqa: ARG002
        timeout: float = 120.0,  # noqa: ARG002
        on_line: LineSink | None = None,
    ) -> CommandResult:
        with self._lock:
            self.argvs.append(list(argv))
        if on_line is not None:
            on_line("  100  100%  1.00kB/s    0:00:00 (xfr#1, to-chk=0/1)")
        return CommandResult(23 if self.fail else 0, b"", b"rsync error: some files could not be transferred")

    def docker(self) -> Any:
        raise AssertionError("no docker here")

    def close(self) -> None:
        pass


def copy_context(tmp_path: Path, head: RecordingHead) -> tuple[ApplyContext, io.StringIO]:
    deployment = reference_deployment().model_copy(update={"state_dir": str(tmp_path / "state")})
    home = str(tmp_path)
    facts = Facts(nodes={"spark-head": NodeFacts(home=home), "spark-worker": NodeFacts(home=home)})
    out = io.StringIO()
    transports: dict[str, Transport] = {"spark-head": head, "spark-worker": LocalTransport("spark-worker")}
    return ApplyContext(deployment, facts, transports, Progress(out)), out


def copy_action(
    tmp_path: Path,
    files: list[str] | None,
    sizes: dict[str, int],
    fabric: tuple[str, str] | None = None,
    origin: str = "spark-head",
) -> Any:
    payload = Copy(
        source_node=origin,
        source_dir="/m",
        destination_dir=str(tmp_path / "worker"),
        files=files,
        bytes=len(sizes),  # small: the worker's disk check runs for real, on this machine
        sizes=sizes,
        fabric=fabric,
    )
    return action(payload, "spark-worker", "create", "copy", "test")


def sources_of(argv: list[str]) -> list[str]:
    return [arg.removeprefix("/m/./") for arg in argv if arg.startswith("/m/./")]


@pytest.fixture
def four_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECONCILER_SSH_CONFIG", "none")
    monkeypatch.setattr(os, "cpu_count", lambda: 4)


@pytest.mark.usefixtures("four_cores")
def test_a_fresh_copy_runs_one_rsync_per_core_each_file_once(tmp_path: Path) -> None:
    head = RecordingHead()
    ctx, out = copy_context(tmp_path, head)
    message = apply.EXECUTORS[Copy](ctx, copy_action(tmp_path, None, CHECKPOINT))
    assert len(head.argvs) == 4
    copied = [name for argv in head.argvs for name in sources_of(argv)]
    assert sorted(copied) == sorted(CHECKPOINT)
    assert not any("--ignore-times" in argv for argv in head.argvs), "complete files are skipped on a resume"
    assert all(argv[-1].endswith(f":{tmp_path / 'worker'}/") for argv in head.argvs)
    assert (tmp_path / "worker").is_dir()
    assert "in 4 rsync streams" in message
    assert "spark-head->spark-worker: 4 rsync streams over" in out.getvalue()


@pytest.mark.usefixtures("four_cores")
def test_named_files_are_copied_again_even_if_size_and_time_match(tmp_path: Path) -> None:
    head = RecordingHead()
    ctx, _ = copy_context(tmp_path, head)
    shard = "model-00002-of-00006.safetensors"
    apply.EXECUTORS[Copy](ctx, copy_action(tmp_path, [shard], {shard: 45 * GB}))
    assert [sources_of(argv) for argv in head.argvs] == [[shard]]
    assert "--ignore-times" in head.argvs[0]


@pytest.mark.usefixtures("four_cores")
def test_a_failed_stream_fails_the_copy_naming_the_worker(tmp_path: Path) -> None:
    ctx, _ = copy_context(tmp_path, RecordingHead(fail=True))
    with pytest.raises(NodeCommandError, match="rsync to spark-worker"):
        apply.EXECUTORS[Copy](ctx, copy_action(tmp_path, None, CHECKPOINT))


class DaemonWorker:
    """The worker's transport: answers the copy daemon's start and stop, and runs the node's
    file operations (mkdirs, disk_free) for real."""

    node = "spark-worker"
    round_trips = 0

    def __init__(self) -> None:
        self.local = LocalTransport("spark-worker")
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float = 120.0,
        on_line: LineSink | None = None,
    ) -> CommandResult:
        last = (stdin or b"").decode().rstrip().rsplit("\n", 1)[-1]
        for call, answer in (("start", {"port": 40123}), ("stop", {"stopped": True})):
            if last.startswith(f"{call}(json.loads("):
                args = json.loads(json.loads(last[len(call) + len("(json.loads(") : -2]))
                self.calls.append((call, args))
                return CommandResult(0, json.dumps(answer).encode(), b"")
        return self.local.run(argv, stdin=stdin, timeout=timeout, on_line=on_line)

    def docker(self) -> Any:
        raise AssertionError("no docker here")

    def close(self) -> None:
        pass


class PasswordHead(RecordingHead):
    def __init__(self) -> None:
        super().__init__()
        self.stdins: list[bytes | None] = []

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float = 120.0,
        on_line: LineSink | None = None,
    ) -> CommandResult:
        self.stdins.append(stdin)
        return super().run(argv, stdin=stdin, timeout=timeout, on_line=on_line)


@pytest.mark.usefixtures("four_cores")
def test_with_fabric_addresses_the_streams_go_to_a_daemon_on_the_workers_fabric_address(tmp_path: Path) -> None:
    head, worker = PasswordHead(), DaemonWorker()
    ctx, out = copy_context(tmp_path, head)
    ctx.transports["spark-worker"] = worker
    copy = copy_action(tmp_path, None, CHECKPOINT, ("10.0.0.1", "10.0.0.2"))
    apply.EXECUTORS[Copy](ctx, copy)
    (start, started), (stop, stopped) = worker.calls
    assert (start, stop) == ("start", "stop"), "the daemon lives for this copy only"
    assert started["address"] == "10.0.0.2"
    assert started["allow"] == "10.0.0.1"
    assert started["path"] == str(tmp_path / "worker")
    assert started["connections"] == 4
    assert stopped == {"dir": started["dir"]}
    secret = started["secret"]
    assert len(secret) >= 32
    assert all(argv[-1] == "rsync://reconciler@10.0.0.2:40123/checkpoint/" for argv in head.argvs)
    assert all("--password-file=-" in argv for argv in head.argvs)
    assert not any(secret in arg for argv in head.argvs for arg in argv), "the password is never in argv"
    assert head.stdins == [f"{secret}\n".encode()] * 4
    assert secret not in out.getvalue()
    assert sorted(name for argv in head.argvs for name in sources_of(argv)) == sorted(CHECKPOINT)


@pytest.mark.usefixtures("four_cores")
def test_the_daemon_is_stopped_when_a_stream_fails(tmp_path: Path) -> None:
    worker = DaemonWorker()
    ctx, _ = copy_context(tmp_path, RecordingHead(fail=True))
    ctx.transports["spark-worker"] = worker
    copy = copy_action(tmp_path, None, CHECKPOINT, ("10.0.0.1", "10.0.0.2"))
    with pytest.raises(NodeCommandError, match="rsync to spark-worker"):
        apply.EXECUTORS[Copy](ctx, copy)
    assert [call for call, _ in worker.calls] == ["start", "stop"]


def test_a_daemon_stream_resumes_or_recopies_by_name() -> None:
    resume = daemon_argv("10.0.0.2", 40123, "/m/", ["a/b.safetensors"], recopy=False)
    assert "--ignore-times" not in resume
    assert resume[-2:] == ["/m/./a/b.safetensors", "rsync://reconciler@10.0.0.2:40123/checkpoint/"]
    assert {"--partial", "-R", "*.safetensors.part[0-9][0-9]"} <= set(resume)
    assert "--ignore-times" in daemon_argv("10.0.0.2", 1, "/m", ["a"], recopy=True)


def test_the_daemon_config_admits_the_head_alone_with_a_password() -> None:
    text = copydaemon.config("/s/copy-daemon", "/w/model@c", "10.0.0.1", 4)
    lines = set(text.splitlines())
    assert {"hosts allow = 10.0.0.1", "hosts deny = *", "auth users = reconciler", "read only = false"} <= lines
    assert {"path = /w/model@c", "max connections = 4", "list = false", "strict modes = true"} <= lines
    assert "secrets file = /s/copy-daemon/rsyncd.secrets" in lines
    assert "log file = /s/copy-daemon/rsyncd.log" in lines, "its own log, not the worker's syslog"
    assert "reverse lookup = no" in lines


@pytest.mark.parametrize("path", ["/w/x\n[evil]\npath = /", "/w/%RSYNC_USER_NAME%", " /w/x"])
def test_a_path_rsyncd_conf_would_read_otherwise_is_refused(path: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        copydaemon.config("/s", path, "10.0.0.1", 1)
    assert "cannot go into rsyncd.conf" in capsys.readouterr().err


def test_the_plan_names_the_fabric_addresses_the_copy_connects_between() -> None:
    actions = plan(reference_deployment(), empty_facts()).actions
    copy = next(item for item in actions if item.step is Step.COPY)
    assert isinstance(copy.payload, Copy)
    assert copy.payload.fabric == ("10.10.10.13", "10.10.10.11")
    assert "over the fabric 10.10.10.13 -> 10.10.10.11" in copy.summary
    assert sum(copy.payload.sizes.values()) == copy.payload.bytes


def test_without_settled_fabric_addresses_the_plan_says_the_copy_goes_over_ssh() -> None:
    deployment = reference_deployment()
    nodes = [
        node.model_copy(update={"fabric": node.fabric.model_copy(update={"ip": None})}) for node in deployment.nodes
    ]
    facts = empty_facts()
    for name in facts.nodes:
        facts.nodes[name] = facts.nodes[name].model_copy(update={"fabric": FabricFacts()})
    actions = plan(deployment.model_copy(update={"nodes": nodes}), facts).actions
    copy = next(item for item in actions if item.step is Step.COPY)
    assert isinstance(copy.payload, Copy)
    assert copy.payload.fabric is None
    assert "over SSH, fabric addresses not settled" in copy.summary


def three_nodes() -> tuple[Any, Facts]:
    deployment = reference_deployment()
    worker = deployment.nodes[1]
    fabric = worker.fabric.model_copy(update={"ip": "10.10.10.12"})
    third = worker.model_copy(update={"name": "spark-third", "fabric": fabric})
    facts = empty_facts()
    nodes = {**facts.nodes, "spark-third": facts.nodes["spark-worker"]}
    return deployment.model_copy(update={"nodes": [*deployment.nodes, third]}), facts.model_copy(
        update={"nodes": nodes}
    )


def test_three_nodes_copy_in_a_chain_so_the_head_uploads_once() -> None:
    deployment, facts = three_nodes()
    actions = plan(deployment, facts).actions
    copies = {item.node: item for item in actions if item.step is Step.COPY}
    first, second = copies["spark-worker"], copies["spark-third"]
    assert isinstance(first.payload, Copy)
    assert isinstance(second.payload, Copy)
    assert first.payload.source_node == "spark-head"
    assert second.payload.source_node == "spark-worker"
    assert second.payload.fabric == ("10.10.10.11", "10.10.10.12")
    assert second.payload.source_dir == first.payload.destination_dir
    assert "checkpoint.verify@spark-worker" in second.depends_on, "it serves only a verified revision"
    assert "from spark-worker into" in second.summary
    assert "spark-worker holds the verified revision by then" in second.cause


def test_a_worker_the_fabric_cannot_reach_from_the_one_before_copies_from_the_head() -> None:
    deployment, facts = three_nodes()
    worker = deployment.nodes[1]
    unset = worker.fabric.model_copy(update={"ip": None})
    nodes = [deployment.nodes[0], worker.model_copy(update={"fabric": unset}), deployment.nodes[2]]
    facts = with_node(facts, "spark-worker", fabric=FabricFacts())
    actions = plan(deployment.model_copy(update={"nodes": nodes}), facts).actions
    copies = {item.node: item for item in actions if item.step is Step.COPY}
    assert copies["spark-third"].payload.source_node == "spark-head"  # type: ignore[union-attr]
    assert copies["spark-third"].payload.fabric == ("10.10.10.13", "10.10.10.12")  # type: ignore[union-attr]


def test_copy_transport_ssh_sends_every_copy_from_the_head_over_ssh() -> None:
    deployment, facts = three_nodes()
    chosen = deployment.model_copy(update={"model": deployment.model.model_copy(update={"copy_transport": "ssh"})})
    actions = plan(chosen, facts).actions
    copies = {item.node: item for item in actions if item.step is Step.COPY}
    for copy in copies.values():
        assert isinstance(copy.payload, Copy)
        assert (copy.payload.source_node, copy.payload.fabric) == ("spark-head", None)
        assert "over SSH, as model.copy_transport says" in copy.summary
    assert "checkpoint.verify@spark-worker" not in copies["spark-third"].depends_on, "no chain: the head serves both"


def test_copy_transport_is_checked_in_the_spec() -> None:
    with pytest.raises(ValidationError, match="copy_transport"):
        Model.model_validate({"copy_transport": "nfs"})


@pytest.mark.usefixtures("four_cores")
def test_a_copy_from_a_worker_runs_its_streams_there(tmp_path: Path) -> None:
    worker, relay = DaemonWorker(), PasswordHead()
    ctx, out = copy_context(tmp_path, RecordingHead())
    ctx.transports["spark-worker"] = worker
    ctx.transports["spark-relay"] = relay
    copy = copy_action(tmp_path, None, CHECKPOINT, ("10.0.0.3", "10.0.0.2"), origin="spark-relay")
    message = apply.EXECUTORS[Copy](ctx, copy)
    assert len(relay.argvs) == 4
    assert worker.calls[0][1]["allow"] == "10.0.0.3"
    assert "from spark-relay" in message
    assert "spark-relay->spark-worker: 4 rsync streams" in out.getvalue()


def test_a_copy_from_a_worker_without_fabric_addresses_is_refused(tmp_path: Path) -> None:
    ctx, _ = copy_context(tmp_path, RecordingHead())
    copy = copy_action(tmp_path, None, {"a": 1}, origin="spark-relay")
    with pytest.raises(NodeCommandError, match="goes over the fabric"):
        apply.EXECUTORS[Copy](ctx, copy)


def test_a_daemon_address_the_node_does_not_have_is_refused_saying_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = {"dir": str(tmp_path), "path": str(tmp_path), "address": "192.0.2.1", "allow": "192.0.2.2", "secret": "s"}
    with pytest.raises(SystemExit):
        copydaemon.start({**args, "connections": 1})
    assert "cannot listen on 192.0.2.1" in capsys.readouterr().err
    assert not (tmp_path / "rsyncd.secrets").exists() or (tmp_path / "rsyncd.secrets").stat().st_mode & 0o077 == 0


def daemon_args(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "dest").mkdir(exist_ok=True)
    directory, destination = str(tmp_path / "copy-daemon"), str(tmp_path / "dest")
    return {"dir": directory, "path": destination, "address": "127.0.0.1", "allow": "127.0.0.1", "secret": "s" * 48}


@needs_rsync
def test_copy_daemon_port_race_another_listener_is_never_taken_for_the_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another user binds the free port between its choice and rsync's bind (forced here by
    handing out a port a plain socket holds): that listener must not pass for the daemon."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        monkeypatch.setattr(copydaemon, "_free_port", lambda _address: squatter.getsockname()[1])
        with pytest.raises(SystemExit):
            copydaemon.start({**daemon_args(tmp_path), "connections": 1})
        assert "did not start listening on 127.0.0.1 in 3 tries" in capsys.readouterr().err
        squatter.setblocking(False)
        with pytest.raises(BlockingIOError):
            squatter.accept()  # nothing connected to it either


@needs_rsync
def test_copy_daemon_takes_only_writes_and_runs_without_the_callers_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started and stopped as apply does it: a program on the node that exits once it answers."""
    monkeypatch.setenv("HF_TOKEN", "hf_not_for_children")
    args = daemon_args(tmp_path)
    node = LocalTransport("spark-worker")
    port = run_program(node, "copydaemon", "start", {**args, "connections": 2})["port"]
    try:
        daemon_pid = (tmp_path / "copy-daemon" / "daemon.pid").read_text().strip()
        assert b"HF_TOKEN=" not in Path(f"/proc/{daemon_pid}/environ").read_bytes()
        source = tmp_path / "source"
        source.mkdir()
        (source / "config.json").write_text("{}")
        password = f"{args['secret']}\n"
        push = daemon_argv("127.0.0.1", port, str(source), ["config.json"], recopy=False)
        pushed = subprocess.run(push, input=password, capture_output=True, text=True, timeout=60, check=False)
        assert pushed.returncode == 0, pushed.stderr
        assert (tmp_path / "dest" / "config.json").read_text() == "{}"
        pull = ["rsync", "--password-file=-", f"rsync://reconciler@127.0.0.1:{port}/checkpoint/", str(tmp_path / "x")]
        pulled = subprocess.run(pull, input=password, capture_output=True, text=True, timeout=60, check=False)
        assert pulled.returncode != 0, "nothing is read back from the copy's daemon"
        assert "write only" in pulled.stderr, pulled.stderr
    finally:
        stopped = run_program(node, "copydaemon", "stop", {"dir": args["dir"]})
    assert stopped == {"stopped": True}
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_copy_daemon_idle_connections_config_drops_silence_and_takes_writes_only() -> None:
    lines = set(copydaemon.config("/s", "/w", "10.0.0.1", 4).splitlines())
    assert {f"timeout = {copydaemon.IDLE_TIMEOUT_S}", "write only = true"} <= lines
    assert copydaemon.IDLE_TIMEOUT_S >= 600, "a healthy stream must never be cut"


@needs_rsync
def test_copy_daemon_idle_connections_are_dropped_before_they_log_in(tmp_path: Path) -> None:
    """A connection that never authenticates holds a `max connections` slot only until the idle timeout."""
    args = daemon_args(tmp_path)
    directory = Path(args["dir"])
    directory.mkdir(mode=0o700)
    (directory / "rsyncd.secrets").write_text("reconciler:x\n")
    (directory / "rsyncd.secrets").chmod(0o600)
    (directory / "rsyncd.conf").write_text(copydaemon.config(str(directory), args["path"], "127.0.0.1", 1, 1))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = ["rsync", "--daemon", "--no-detach", f"--config={directory}/rsyncd.conf", "--address=127.0.0.1"]
    daemon = subprocess.Popen([*argv, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        connection = connect_within(port, 10.0)
        with connection:
            connection.settimeout(10)
            assert connection.recv(100).startswith(b"@RSYNCD:")
            started = time.monotonic()
            while connection.recv(100):  # the greeting's rest, then the close
                pass
            assert time.monotonic() - started < 5
    finally:
        daemon.kill()
        daemon.wait()


def connect_within(port: int, seconds: float) -> socket.socket:
    deadline = time.monotonic() + seconds
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=1)
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, "the daemon never listened"
            time.sleep(0.05)
