"""Logins along a route against in-process paramiko servers on loopback: host keys looked up under
the name OpenSSH uses, refused when unknown or wrong (on jump hosts too), a jump carrying the login."""

from __future__ import annotations

import contextlib
import functools
import shlex
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import paramiko
import pytest
from paramiko.common import AUTH_FAILED, AUTH_SUCCESSFUL, OPEN_SUCCEEDED

from reconciler.errors import NodeUnreachableError, SshConfigError
from reconciler.transport.sshconnect import open_route
from reconciler.transport.sshroute import Endpoint, SshRoute

# A loopback handshake takes milliseconds; only a broken one waits this long, never a loaded machine.
CONNECT_TIMEOUT_S = 30.0


@functools.cache
def rsa_key(role: str) -> paramiko.RSAKey:  # noqa: ARG001 (the role is the cache key)
    """One key per role, made once (and only when a test here runs)."""
    return paramiko.RSAKey.generate(2048)


class _Server(paramiko.ServerInterface):
    def __init__(self, seen: list[tuple[str, int]]) -> None:
        self.seen = seen

    def get_allowed_auths(self, username: str) -> str:  # noqa: ARG002
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:  # noqa: ARG002
        return AUTH_SUCCESSFUL if key == rsa_key("client") else AUTH_FAILED

    def check_channel_direct_tcpip_request(
        self,
        chanid: int,  # noqa: ARG002
        origin: tuple[str, int],  # noqa: ARG002
        destination: tuple[str, int],
    ) -> int:
        self.seen.append(destination)
        return OPEN_SUCCEEDED


@dataclass
class Jump:
    """A loopback sshd stand-in: logs in with the client key, and serves the node's sshd inside any
    direct-tcpip channel opened on it."""

    port: int
    destinations: list[tuple[str, int]] = field(default_factory=list)


class _NodeSocket:
    """The node sshd's end of its direct-tcpip channel, closed without a word if it cannot be.

    When the client hangs up, the jump connection under the channel can be gone before the node
    sshd's goodbye goes out on it, and paramiko raises EOFError from the close (in its own thread
    or in the fixture's teardown). That is the stand-in's goodbye, not what these tests check.
    """

    def __init__(self, channel: paramiko.Channel) -> None:
        self._channel = channel

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)

    def close(self) -> None:
        with contextlib.suppress(EOFError, OSError, paramiko.SSHException):
            self._channel.close()


@pytest.fixture
def jump() -> Iterator[Jump]:
    listener = socket.create_server(("127.0.0.1", 0))
    served = Jump(listener.getsockname()[1])
    # The jump sshds on TCP, and the node sshds each running inside a channel of one of them.
    outer_transports: list[paramiko.Transport] = []
    inner_transports: list[paramiko.Transport] = []

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            outer = paramiko.Transport(connection)
            outer.add_server_key(rsa_key("jump"))
            outer_transports.append(outer)
            try:
                outer.start_server(server=_Server(served.destinations))
            except (paramiko.SSHException, EOFError, OSError):  # the client hung up mid-handshake
                continue
            channel = outer.accept(timeout=CONNECT_TIMEOUT_S)
            if channel is not None:
                inner = paramiko.Transport(cast("paramiko.Channel", _NodeSocket(channel)))
                inner.add_server_key(rsa_key("node"))
                inner_transports.append(inner)
                threading.Thread(target=_start, args=(inner,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield served
    listener.close()
    # Jump sshds first: closing one marks its channels closed, so the node sshds in them have no
    # goodbye left to send.
    for transport in (*outer_transports, *inner_transports):
        transport.close()


def _start(transport: paramiko.Transport) -> None:
    with contextlib.suppress(paramiko.SSHException, EOFError):
        transport.start_server(server=_Server([]))


@pytest.fixture
def client_key(tmp_path: Path) -> str:
    path = tmp_path / "id_rsa"
    rsa_key("client").write_private_key_file(str(path))
    return str(path)


def known_hosts(tmp_path: Path, *lines: str) -> str:
    path = tmp_path / "known_hosts"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def entry(name: str, key: paramiko.PKey) -> str:
    return f"{name} {key.get_name()} {key.get_base64()}"


def endpoint(name: str, hostname: str, port: int, key: str, alias: str | None = None) -> Endpoint:
    return Endpoint(name, hostname, port, "nvidia", (key,), identities_only=True, host_key_alias=alias)


def direct(jump: Jump, key: str, files: str, alias: str | None = None) -> SshRoute:
    return SshRoute(
        "spark-worker", endpoint("jumpbox", "127.0.0.1", jump.port, key, alias), (files,), CONNECT_TIMEOUT_S
    )


# A ProxyCommand stand-in: pipes its stdin and stdout to a TCP port, as `nc host port` would.
RELAY = """
import socket, sys, threading
connection = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
def up():
    while data := sys.stdin.buffer.read1(65536):
        connection.sendall(data)
threading.Thread(target=up, daemon=True).start()
while data := connection.recv(65536):
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
"""


def via_jump(jump: Jump, key: str, files: str) -> SshRoute:
    hop = endpoint("jumpbox", "127.0.0.1", jump.port, key)
    node = endpoint("spark2", "10.10.10.12", 22, key)
    return SshRoute("spark-worker", node, (files,), CONNECT_TIMEOUT_S, jumps=(hop,))


def test_a_key_filed_under_host_and_port_lets_the_login_through(jump: Jump, client_key: str, tmp_path: Path) -> None:
    files = known_hosts(tmp_path, entry(f"[127.0.0.1]:{jump.port}", rsa_key("jump")))
    connection = open_route(direct(jump, client_key, files))
    transport = connection.get_transport()
    assert transport is not None
    assert transport.is_authenticated()
    connection.close()


def test_a_host_key_alias_is_the_only_name_looked_up(jump: Jump, client_key: str, tmp_path: Path) -> None:
    files = known_hosts(tmp_path, entry("jumpbox-key", rsa_key("jump")))
    connection = open_route(direct(jump, client_key, files, alias="jumpbox-key"))
    connection.close()
    filed_by_address = known_hosts(tmp_path, entry(f"[127.0.0.1]:{jump.port}", rsa_key("jump")))
    with pytest.raises(NodeUnreachableError, match="no host key for jumpbox-key in"):
        open_route(direct(jump, client_key, filed_by_address, alias="jumpbox-key"))


def test_an_unknown_host_key_is_refused_with_its_fingerprint(jump: Jump, client_key: str, tmp_path: Path) -> None:
    files = known_hosts(tmp_path, entry("someone-else", rsa_key("jump")))
    with pytest.raises(NodeUnreachableError) as caught:
        open_route(direct(jump, client_key, files))
    assert caught.value.message == (
        f"spark-worker: SSH to nvidia@127.0.0.1:{jump.port} (jumpbox): no host key for [127.0.0.1]:{jump.port} "
        f"in {files} (it offers ssh-rsa {rsa_key('jump').fingerprint})"
    )
    assert f"ssh-keyscan -p {jump.port} 127.0.0.1 >> {files}" in caught.value.hint
    assert (tmp_path / "known_hosts").read_text(encoding="utf-8") == entry("someone-else", rsa_key("jump")) + "\n"


def test_a_changed_host_key_is_refused(jump: Jump, client_key: str, tmp_path: Path) -> None:
    files = known_hosts(tmp_path, entry(f"[127.0.0.1]:{jump.port}", rsa_key("node")))
    with pytest.raises(NodeUnreachableError, match="the host key does not match"):
        open_route(direct(jump, client_key, files))


def test_no_known_hosts_file_at_all_is_a_config_error(jump: Jump, client_key: str, tmp_path: Path) -> None:
    with pytest.raises(SshConfigError, match=r"cannot read known_hosts .*: no such file"):
        open_route(direct(jump, client_key, str(tmp_path / "absent")))


def test_the_login_to_the_node_travels_inside_the_jump_host(jump: Jump, client_key: str, tmp_path: Path) -> None:
    files = known_hosts(
        tmp_path, entry(f"[127.0.0.1]:{jump.port}", rsa_key("jump")), entry("10.10.10.12", rsa_key("node"))
    )
    connection = open_route(via_jump(jump, client_key, files))
    transport = connection.get_transport()
    assert transport is not None
    assert transport.is_authenticated()
    assert transport.get_remote_server_key() == rsa_key("node")
    assert jump.destinations == [("10.10.10.12", 22)]
    connection.close()


def test_every_hop_has_its_key_checked(jump: Jump, client_key: str, tmp_path: Path) -> None:
    only_the_jump = known_hosts(tmp_path, entry(f"[127.0.0.1]:{jump.port}", rsa_key("jump")))
    with pytest.raises(NodeUnreachableError, match=r"SSH to nvidia@10.10.10.12:22 \(spark2\): no host key"):
        open_route(via_jump(jump, client_key, only_the_jump))
    only_the_node = known_hosts(tmp_path, entry("10.10.10.12", rsa_key("node")))
    with pytest.raises(NodeUnreachableError, match=r"jump host nvidia@127.0.0.1:\d+ \(jumpbox\): no host key"):
        open_route(via_jump(jump, client_key, only_the_node))


def test_a_proxy_command_carries_the_connection(jump: Jump, client_key: str, tmp_path: Path) -> None:
    files = known_hosts(tmp_path, entry("jumpbox", rsa_key("jump")))
    command = shlex.join([sys.executable, "-c", RELAY, str(jump.port)])
    # The name is not an address: only the command can reach it; its key is filed under its name.
    node = endpoint("jumpbox", "jumpbox", 22, client_key)
    connection = open_route(SshRoute("spark-worker", node, (files,), CONNECT_TIMEOUT_S, proxy_command=command))
    transport = connection.get_transport()
    assert transport is not None
    assert transport.is_authenticated()
    connection.close()


def test_the_control_connection_sends_segments_that_fit_a_1500_byte_mtu() -> None:
    """A worker reached at its fabric address over a 9000-byte path whose port a reboot reset to
    1500: full-size segments would be dropped without a word, and the connection would stall."""
    import socket

    from reconciler.transport import sshconnect
    from reconciler.transport.sshroute import Endpoint

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        endpoint = Endpoint(name="worker", hostname="127.0.0.1", port=port, user="nvidia")
        sock = sshconnect._direct_socket(endpoint, timeout=5)
        try:
            # Loopback's own MTU is 65536: only the cap keeps the segments this small.
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG) <= sshconnect.CONTROL_MSS
        finally:
            sock.close()
