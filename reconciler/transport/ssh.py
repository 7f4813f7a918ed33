"""A node reached over SSH with paramiko: host keys checked, never added; one connection reused.

The Docker API travels over the same connection: a local unix socket forwards each Docker
connection to a tiny stdlib relay to the node's Docker socket (nodeside/dockerrelay.py; what
docker-py's `ssh://` does with `docker system dial-stdio`, without its lingering sessions).
Doing it here, rather than through docker-py's `ssh://`, keeps the node's one route and its
host-key checks in force (docker-py reads only ~/.ssh/config and knows nothing of the spec; see
docs/sources.md) and avoids a second SSH login per pass.

The route itself (the ssh config applied to the spec's target, jump hosts) is resolved in
sshroute.py and opened in sshconnect.py; the rsync copy's `ssh` takes the same route.
"""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import docker
import paramiko

from reconciler import nodeside
from reconciler.errors import NodeUnreachableError, ReconcilerError
from reconciler.spec import SshTarget
from reconciler.transport.base import CommandResult, LineSink, LineSplitter, keep_tail
from reconciler.transport.sshconnect import SshConnection, open_route
from reconciler.transport.sshroute import route_for

_CHUNK = 65536
_RELAY = nodeside.source("dockerrelay")


class SshTransport:
    def __init__(self, node: str, target: SshTarget) -> None:
        self.node = node
        self.target = target
        self._client: SshConnection | None = None
        self._forward: _DockerForward | None = None
        self._docker: Any = None
        self._lock = threading.Lock()
        self.round_trips = 0

    def _transport(self) -> paramiko.Transport:
        with self._lock:
            transport = self._client.get_transport() if self._client is not None else None
            if transport is None or not transport.is_active():
                if self._client is not None:
                    self._client.close()
                self._client = self._connect()
                transport = self._client.get_transport()
            assert transport is not None
            return transport

    def _connect(self) -> SshConnection:
        """A fresh login along the route the ssh config gives now (an edited config applies on reconnect)."""
        return open_route(route_for(self.node, self.target))

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float = 120.0,
        on_line: LineSink | None = None,
    ) -> CommandResult:
        self.round_trips += 1
        try:
            channel = self._transport().open_session(timeout=timeout)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise self._lost(exc) from None
        try:
            channel.exec_command(shlex.join(argv))
            if stdin is not None:
                channel.sendall(stdin)
            channel.shutdown_write()
            stdout, stderr = _drain(channel, timeout, self.node, LineSplitter(on_line) if on_line else None)
            return CommandResult(channel.recv_exit_status(), stdout, stderr)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise self._lost(exc) from None
        finally:
            channel.close()

    def _lost(self, exc: BaseException) -> NodeUnreachableError:
        """A channel refused or a connection dropped mid-command: transient, retried by apply."""
        return NodeUnreachableError(
            f"{self.node}: the SSH connection failed: {type(exc).__name__}: {exc}",
            "check the node and its sshd (MaxSessions, load); the next pass tries again",
        )

    def docker(self) -> Any:
        if self._docker is None:
            # Its own SSH connection: Docker's pooled and streaming connections each hold a
            # session, and must never starve the commands of sshd's MaxSessions (10).
            self._forward = _DockerForward(self._connect)
            # Every pooled Docker connection is an SSH channel; sshd allows 10 per connection
            # (MaxSessions), shared with commands and the loop's event stream.
            self._docker = docker.DockerClient(base_url=f"unix://{self._forward.path}", timeout=120, max_pool_size=3)
        return self._docker

    def close(self) -> None:
        for resource in (self._docker, self._forward, self._client):
            if resource is not None:
                resource.close()
        self._docker = self._forward = self._client = None


def _drain(
    channel: paramiko.Channel, timeout: float, node: str, splitter: LineSplitter | None = None
) -> tuple[bytes, bytes]:
    """Read stdout and stderr until the command exits, without deadlocking on either."""
    stdout, stderr = bytearray(), bytearray()
    deadline = time.monotonic() + timeout
    while True:
        if channel.recv_ready():
            stdout += channel.recv(_CHUNK)
        elif channel.recv_stderr_ready():
            data = channel.recv_stderr(_CHUNK)
            keep_tail(stderr, data)
            if splitter is not None:
                splitter.feed(data)
        elif channel.exit_status_ready():
            break
        else:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NodeUnreachableError(
                    f"{node}: command timed out after {timeout:g} s", "the node may be overloaded"
                )
            select.select([channel], [], [], min(remaining, 1.0))
    while channel.recv_ready():
        stdout += channel.recv(_CHUNK)
    while channel.recv_stderr_ready():
        keep_tail(stderr, channel.recv_stderr(_CHUNK))
    return bytes(stdout), bytes(stderr)


class _DockerForward:
    """A local unix socket whose connections are piped to the Docker socket relay on the node."""

    def __init__(self, connect: Callable[[], SshConnection]) -> None:
        self._connect = connect
        self._client = connect()
        self._dir = tempfile.mkdtemp(prefix="reconciler-docker-")
        self.path = os.path.join(self._dir, "docker.sock")
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.path)
        self._server.listen(16)
        self._closed = False
        # Each relayed connection's pipes: `close` waits for them, so none runs on into the shutdown.
        self._pipes: list[threading.Thread] = []
        threading.Thread(target=self._accept, name="docker-forward", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                connection, _ = self._server.accept()
            except OSError:
                return
            try:
                channel = self._open_relay()
            except (paramiko.SSHException, OSError, ReconcilerError):
                connection.close()
                continue
            pipes = [
                threading.Thread(target=_pipe_to_channel, args=(connection, channel), daemon=True),
                threading.Thread(target=_pipe_to_socket, args=(channel, connection), daemon=True),
            ]
            self._pipes = [pipe for pipe in self._pipes if pipe.is_alive()] + pipes
            for pipe in pipes:
                pipe.start()

    def _open_relay(self) -> paramiko.Channel:
        """A session running the relay; when sessions run out or the link dropped, reconnect once
        (closing the old connection ends every lingering relay with it)."""
        for attempt in range(2):
            transport = self._client.get_transport()
            try:
                if transport is None or not transport.is_active():
                    raise paramiko.SSHException("connection lost")
                channel = transport.open_session(timeout=30)
                channel.exec_command(shlex.join(["python3", "-c", _RELAY]))
                return channel
            except (paramiko.SSHException, OSError):
                if attempt == 1:
                    raise
                self._client.close()
                self._client = self._connect()
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._server.close()
        self._client.close()  # ends every relay's channel, and so its pipes
        deadline = time.monotonic() + 2.0  # the pipes end at once; this only bounds a stuck one
        for pipe in self._pipes:
            pipe.join(timeout=max(0.0, deadline - time.monotonic()))
        shutil.rmtree(self._dir, ignore_errors=True)


def _pipe_to_channel(connection: socket.socket, channel: paramiko.Channel) -> None:
    """Client -> node. When the Docker client closes its connection, close the channel too:
    `dial-stdio` would otherwise wait on dockerd's keep-alive forever and hold one of the
    connection's sessions (sshd's MaxSessions is 10)."""
    try:
        while data := connection.recv(_CHUNK):
            channel.sendall(data)
    except OSError:
        pass
    finally:
        # The connection under the channel may be closed already (the forward is closing): then
        # telling the node the channel ends fails, and there is nothing left to tell.
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            channel.close()


def _pipe_to_socket(channel: paramiko.Channel, connection: socket.socket) -> None:
    try:
        while data := channel.recv(_CHUNK):
            connection.sendall(data)
        connection.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            channel.close()
        with contextlib.suppress(OSError):
            connection.shutdown(socket.SHUT_RDWR)  # wakes the other pipe's recv; a close alone does not
        connection.close()
