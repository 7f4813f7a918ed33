"""Secrets are checked when read and never echoed: not by the CLI, the loop's journal, STATUS=
or its status file, in whatever form an exception spells them."""

from __future__ import annotations

import base64
import json
import os
import queue
import socket
import stat
import threading
import urllib.parse
from pathlib import Path

import pytest

from reconciler import cli, hub, redact
from reconciler.cli import deploy
from reconciler.errors import ReconcilerError, SecretError
from reconciler.execution import ApplyContext
from reconciler.facts.node import Facts, NodeFacts
from reconciler.health import probe_liveness, read_key
from reconciler.loop import Loop
from reconciler.loopstatus import status_path
from reconciler.redact import RedactingStream, checked_secret
from reconciler.spec import Model, load_spec
from reconciler.transport.local import LocalTransport
from reconciler.verify.apiclient import read_key_file

SECRET = "hf_Zq8rW3tY6uI9oP2aS5dF7gH1jK4lM0nB"


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("abc\ndef", "a line break at character 4"),
        ("abc\rdef", "a line break at character 4"),
        ("abc def", "a space"),
        ("abc\tdef", "a tab"),
        ("abc\x00def", "a control character (U+0000)"),
        ("abcdéf", "a non-ASCII character"),
        ("abc\udcffdef", "a byte that is not UTF-8"),
        ("xyz\n\n", "a line break"),
        ("", "is empty"),
        ("\n", "is empty"),
    ],
)
def test_a_secret_with_an_odd_byte_is_refused_naming_the_source_not_the_content(raw: str, problem: str) -> None:
    with pytest.raises(SecretError) as raised:
        checked_secret(raw, what="the Hub token", source="/home/nvidia/.hf-token", hint="rewrite it")
    message = raised.value.message
    assert problem in message
    assert "/home/nvidia/.hf-token" in message
    for piece in ("abc", "def", "xyz"):
        assert piece not in message


@pytest.mark.parametrize("ending", ["\n", "\r\n", ""])
def test_one_trailing_newline_or_crlf_is_stripped(ending: str) -> None:
    assert checked_secret(SECRET + ending, what="k", source="s", hint="h") == SECRET


def test_redaction_covers_every_form_an_exception_gives_a_secret() -> None:
    redact.register(SECRET)
    raw = SECRET.encode()
    forms = [
        SECRET,
        f"Illegal header value b'Bearer {SECRET}'",
        repr(raw),
        json.dumps({"authorization": f"Bearer {SECRET}"}),
        urllib.parse.quote(f"token={SECRET}"),
        base64.b64encode(raw).decode(),
        f"cut at 20: {SECRET[:20]}...",
    ]
    for text in forms:
        scrubbed = redact.redact(text)
        assert SECRET[:8] not in scrubbed, text
        assert base64.b64encode(raw).decode()[:8] not in scrubbed
        assert redact.REDACTED in scrubbed


def test_a_stream_redacts_what_is_written_through_it(tmp_path: Path) -> None:
    redact.register(SECRET)
    target = tmp_path / "out.txt"
    with target.open("w", encoding="utf-8") as handle:
        RedactingStream(handle).write(f"error: {SECRET!r}\n")
    assert SECRET not in target.read_text(encoding="utf-8")


def test_a_key_file_with_an_inner_crlf_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "api_key"
    path.write_bytes(b"first-half\r\nsecond-half\n")
    with pytest.raises(ReconcilerError) as raised:
        read_key_file(str(path))
    assert str(path) in raised.value.message
    assert "line break" in raised.value.message
    assert "half" not in raised.value.message


def test_a_key_file_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "api_key"
    os.mkfifo(path)
    with pytest.raises(ReconcilerError, match="FIFO"):
        read_key_file(str(path))


@pytest.mark.parametrize("variable", ["HF_TOKEN"])
def test_an_hf_token_variable_with_an_inner_newline_is_an_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    monkeypatch.setenv(variable, f"{SECRET[:10]}\n{SECRET[10:]}")
    with pytest.raises(SecretError) as raised:
        hub.token(Model())
    assert "$HF_TOKEN" in raised.value.message
    assert SECRET[:10] not in raised.value.message


def test_a_token_file_with_a_trailing_crlf_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    token_file = tmp_path / "token"
    token_file.write_bytes(SECRET.encode() + b"\r\n")
    assert hub.token(Model(token_file=str(token_file))) == SECRET


def test_the_cli_never_prints_a_secret_even_in_an_internal_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    redact.register(SECRET)

    def broken(_args: object) -> int:
        raise ValueError(f"Illegal header value b'Bearer {SECRET}'")

    monkeypatch.setattr(deploy, "validate", broken)
    for argv in (["validate"], ["validate", "--json"]):
        assert cli.main(argv) == 1
        captured = capsys.readouterr()
        assert SECRET[:8] not in captured.out + captured.err
        assert redact.REDACTED in captured.out + captured.err


def test_smoke_with_a_key_holding_a_line_break_fails_without_printing_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key_file = tmp_path / "key"
    key_file.write_bytes(b"Zq8rW3tY6uI9\r\noP2aS5dF7gH1\n")
    for argv in (
        ["smoke", "http://127.0.0.1:9", "--key-file", str(key_file)],
        ["bench", "http://127.0.0.1:9", "--key-file", str(key_file), "--out", str(tmp_path / "b.json"), "--json"],
    ):
        assert cli.main(argv) == 1
        captured = capsys.readouterr()
        output = captured.out + captured.err
        assert "line break" in output
        assert "Zq8rW3tY6uI9" not in output
        assert "oP2aS5dF7gH1" not in output
        assert "internal error" not in output


def head_context(tmp_path: Path, key: bytes) -> ApplyContext:
    """A deployment whose head is this machine, with its key file written as given."""
    spec = write_spec(tmp_path)
    deployment = load_spec(spec).deployment
    key_file = tmp_path / "state" / "api_key"
    key_file.parent.mkdir(parents=True, exist_ok=True)
    key_file.write_bytes(key)
    facts = Facts(nodes={name: NodeFacts(home=str(tmp_path)) for name in ("spark-head", "spark-worker")})
    return ApplyContext(deployment, facts, {"spark-head": LocalTransport("spark-head")})


def write_spec(directory: Path, loop: str = "") -> Path:
    spec = directory / "spec.yaml"
    spec.write_text(
        f"state_dir: {directory}/state\n"
        "nodes:\n"
        "  - {name: spark-head, role: head}\n"
        "  - {name: spark-worker, ssh: {host: 198.18.10.11}}\n"
        "serving: {port: 9}\n" + loop,
        encoding="utf-8",
    )
    return spec


def test_the_liveness_probe_with_a_non_ascii_key_is_a_failed_probe_not_a_crash(tmp_path: Path) -> None:
    context = head_context(tmp_path, "ключ-ключ\n".encode())
    problem = probe_liveness(context)
    assert problem is not None
    assert "non-ASCII" in problem
    assert "ключ" not in problem


def test_read_key_refuses_a_key_file_with_an_inner_newline(tmp_path: Path) -> None:
    context = head_context(tmp_path, b"Zq8rW3tY6uI9\noP2aS5dF7gH1\n")
    with pytest.raises(SecretError) as raised:
        read_key(context)
    assert "line break" in raised.value.message
    assert "Zq8rW3tY6uI9" not in raised.value.message


class NotifySocket:
    """A stand-in for systemd's notify socket: collects what the loop sends."""

    def __init__(self, directory: Path) -> None:
        self.path = str(directory / "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setblocking(False)

    def messages(self) -> list[str]:
        """What arrived so far (the queue is drained; nothing is waited for)."""
        found: list[str] = []
        while True:
            try:
                found.append(self.sock.recv(65536).decode())
            except BlockingIOError:
                return found


def test_the_loops_status_file_is_private_and_redacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    notify_socket = NotifySocket(tmp_path)
    monkeypatch.setenv("NOTIFY_SOCKET", notify_socket.path)
    redact.register(SECRET)
    loop = Loop(str(write_spec(tmp_path)))
    loop.status.condition = f"failed 1x: LocalProtocolError: Illegal header value b'Bearer {SECRET}'"
    loop._publish()
    path = status_path(loop.deployment)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert SECRET[:8] not in path.read_text(encoding="utf-8")
    sent = notify_socket.messages()
    assert sent
    assert all(SECRET[:8] not in message for message in sent)


class SteppedStopping(threading.Event):
    """`Loop.stopping` for one loop thread, with the test as its clock: each `wait(timeout)` of the
    thread (one period of its `while not stopping.wait(period)`) blocks until the test lets that
    period end (`tick`, `let_one_pass`) or stops the thread (`stop`). No period ends by itself, so
    what the thread did in each one is known when the test looks, however slow the machine."""

    def __init__(self) -> None:
        super().__init__()
        self._periods: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._waiting = threading.Semaphore(0)
        self.timeouts: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.timeouts.append(timeout)
        self._waiting.release()
        return self._periods.get()

    def started(self) -> None:
        """Until the thread waits for its first period."""
        assert self._waiting.acquire(timeout=60), "the thread never waited for a period"

    def tick(self) -> None:
        """One period ends; returns once the thread, done with it, waits for the next."""
        self.let_one_pass()
        assert self._waiting.acquire(timeout=60), "the thread never came back to wait for a period"

    def let_one_pass(self) -> None:
        """One period ends, for a thread that may not wait again."""
        self._periods.put(False)

    def stop(self) -> None:
        self._periods.put(True)


def test_a_probe_that_raises_counts_as_a_failed_probe_and_the_thread_lives(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loop = Loop(str(write_spec(tmp_path, "loop: {liveness_s: 1, failure_threshold: 2}\n")))
    loop.stopping = stopping = SteppedStopping()
    loop.logic.serving = True

    def explode() -> str | None:
        raise UnicodeEncodeError("ascii", "ключ", 0, 1, "ordinal not in range(128)")

    loop._probe_once = explode  # type: ignore[method-assign]
    thread = threading.Thread(target=loop._probe, daemon=True)
    thread.start()
    stopping.started()
    stopping.tick()
    assert loop.logic.liveness.failures == 1
    assert loop.triggers.wait(0) == [], "one failure is below the threshold"
    stopping.tick()  # the thread came back to wait: it outlived both failed probes
    assert loop.logic.liveness.failures == 2
    assert "the probe itself failed: UnicodeEncodeError" in loop.logic.liveness.detail
    assert loop.triggers.wait(0) == ["liveness probe failed"]
    stopping.stop()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert stopping.timeouts == [1.0] * 3, "one probe per liveness_s"
    assert "liveness probe failed (2x)" in capsys.readouterr().err


def test_the_watchdog_stops_pinging_when_a_trigger_thread_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    notify_socket = NotifySocket(tmp_path)
    monkeypatch.setenv("NOTIFY_SOCKET", notify_socket.path)
    monkeypatch.setenv("WATCHDOG_USEC", "100000")
    loop = Loop(str(write_spec(tmp_path)))
    loop.stopping = stopping = SteppedStopping()
    alive = threading.Event()
    living = threading.Thread(target=alive.wait, name="liveness probe", daemon=True)
    living.start()
    loop.threads = [living]
    watchdog = threading.Thread(target=loop._watchdog, daemon=True)
    watchdog.start()
    stopping.started()
    assert notify_socket.messages() == []
    # A datagram on a Unix socket is queued by the time `send` returns: each ping of a period is
    # there once the watchdog waits for the next.
    stopping.tick()
    stopping.tick()
    assert notify_socket.messages() == ["WATCHDOG=1"] * 2, "one ping a period while every thread lives"
    alive.set()
    living.join()
    stopping.let_one_pass()
    watchdog.join(timeout=60)
    assert not watchdog.is_alive(), "the watchdog went on after the probe thread died"
    assert notify_socket.messages() == [], "a ping after the probe thread died"
    assert "the liveness probe thread stopped" in capsys.readouterr().err
    assert stopping.timeouts == [0.05] * 3, "half of WatchdogSec=, as systemd advises"


def test_the_restart_intent_is_written_redacted_and_a_resumed_one_is_kept(tmp_path: Path) -> None:
    """The cause (which may quote what a node said) is redacted, and an intent already there
    (a restart being resumed) is kept rather than replaced."""
    from reconciler.components.ranks import record_intent
    from reconciler.redact import register

    context = head_context(tmp_path, b"k\n")
    secret = "hf_" + "Q" * 34
    register(secret)
    record_intent(context, f"group restart: dsv41-r1 on spark-worker: exited 1 ({secret})")
    intent = tmp_path / "state" / "restart-intent.json"
    recorded = json.loads(intent.read_text(encoding="utf-8"))
    assert "dsv41-r1 on spark-worker: exited 1" in recorded["cause"]
    assert secret not in intent.read_text(encoding="utf-8")
    record_intent(context, "group restart: another cause")
    assert json.loads(intent.read_text(encoding="utf-8")) == recorded
