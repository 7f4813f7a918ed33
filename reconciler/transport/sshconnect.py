"""Open a resolved SSH route with paramiko: each jump host in turn, then the node; every host key checked.

A jump is a `direct-tcpip` channel opened on the previous hop's connection (what `ssh -J` does)
and the next login runs inside it. Host keys come only from the route's known_hosts files, looked
up under the name OpenSSH files them under (HostKeyAlias, host or [host]:port); a host with no
known key is refused, never added, whatever the ssh config says about checking.
"""

from __future__ import annotations

import os
import shlex
import socket
from typing import cast

import paramiko
from paramiko.hostkeys import InvalidHostKey

from reconciler.errors import NodeUnreachableError, SshConfigError
from reconciler.transport.sshroute import SSH_PORT, Endpoint, SshRoute


class SshConnection:
    """The node's client and, under it, the jump hosts' clients; closing it closes them all, node first."""

    def __init__(self, clients: list[paramiko.SSHClient]) -> None:
        self._clients = clients

    def get_transport(self) -> paramiko.Transport | None:
        return self._clients[-1].get_transport()

    def close(self) -> None:
        for client in reversed(self._clients):
            client.close()


def open_route(route: SshRoute) -> SshConnection:
    """Log in to each hop in turn, the next one inside a channel of the last; all or nothing."""
    known = known_host_keys(route)
    clients: list[paramiko.SSHClient] = []
    proxy = _proxy_command(route)
    try:
        sock: paramiko.ProxyCommand | paramiko.Channel | None = proxy
        for index, endpoint in enumerate(route.hops):
            if clients:
                sock = _tunnel(route, clients[-1], route.hops[index - 1], endpoint)
            clients.append(_login(route, endpoint, known, sock))
    except BaseException:
        for client in reversed(clients):
            client.close()
        if proxy is not None:
            proxy.close()
        raise
    return SshConnection(clients)


def known_host_keys(route: SshRoute) -> paramiko.HostKeys:
    """Every key in the route's known_hosts files; files that do not exist are skipped, as OpenSSH does."""
    keys = paramiko.HostKeys()
    found = 0
    for path in route.known_hosts:
        try:
            keys.load(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise _known_hosts_error(route, f"cannot read known_hosts {path}: {exc.strerror or exc}") from None
        except (InvalidHostKey, ValueError):
            raise _known_hosts_error(route, f"{path} is not a known_hosts file (a line holds no valid key)") from None
        found += 1
    if not found:
        raise _known_hosts_error(route, f"cannot read known_hosts {', '.join(route.known_hosts)}: no such file")
    return keys


def _known_hosts_error(route: SshRoute, message: str) -> SshConfigError:
    target = route.target
    return SshConfigError(
        f"{route.node}: {message}",
        f"verify {target.hostname}'s host key fingerprint, then add it: "
        f"ssh-keyscan -p {target.port} {target.hostname} >> {route.known_hosts[0]}",
    )


def _proxy_command(route: SshRoute) -> paramiko.ProxyCommand | None:
    """The config's ProxyCommand, run by the shell like OpenSSH runs it."""
    if route.proxy_command is None:
        return None
    try:
        return paramiko.ProxyCommand(shlex.join(["/bin/sh", "-c", "exec " + route.proxy_command]))
    except OSError as exc:
        raise NodeUnreachableError(
            f"{route.node}: cannot start ProxyCommand {route.proxy_command!r}: {exc.strerror or exc}",
            "fix the ProxyCommand in the ssh config",
        ) from None


def _tunnel(route: SshRoute, client: paramiko.SSHClient, via: Endpoint, to: Endpoint) -> paramiko.Channel:
    transport = client.get_transport()
    try:
        if transport is None or not transport.is_active():
            raise paramiko.SSHException("the connection closed")
        return transport.open_channel(
            "direct-tcpip", (to.hostname, to.port), ("127.0.0.1", 0), timeout=route.connect_timeout_s
        )
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise NodeUnreachableError(
            f"{route.node}: jump host {via.describe()} could not connect to {to.hostname}:{to.port}: {exc}",
            f"check that {to.hostname} is reachable from {via.hostname} and that its sshd allows TCP forwarding",
        ) from None


class _UnknownHostKey(paramiko.SSHException):
    def __init__(self, key: paramiko.PKey) -> None:
        super().__init__("unknown host key")
        self.key = key


class _RejectUnknown(paramiko.MissingHostKeyPolicy):
    """paramiko's RejectPolicy, with the offered key kept for the message."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:  # noqa: ARG002
        raise _UnknownHostKey(key)


def _login(
    route: SshRoute,
    endpoint: Endpoint,
    known: paramiko.HostKeys,
    sock: paramiko.ProxyCommand | paramiko.Channel | None,
) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    # paramiko looks the key up as host or [host]:port; file under that name what OpenSSH would use.
    as_paramiko = endpoint.hostname if endpoint.port == SSH_PORT else f"[{endpoint.hostname}]:{endpoint.port}"
    for keytype, key in (known.lookup(endpoint.host_key_name) or {}).items():
        client.get_host_keys().add(as_paramiko, keytype, key)
    client.set_missing_host_key_policy(_RejectUnknown())
    present = [path for path in endpoint.identity_files if os.path.exists(path)]
    try:
        channel = sock if sock is not None else _direct_socket(endpoint, route.connect_timeout_s)
        client.connect(
            hostname=endpoint.hostname,
            port=endpoint.port,
            username=endpoint.user,
            # A listed key that does not exist is skipped, as OpenSSH skips it. paramiko takes
            # a list of files (tried in order); its type stubs only know a single one.
            key_filename=cast("str | None", present or None),
            look_for_keys=not endpoint.identity_files,
            timeout=route.connect_timeout_s,
            banner_timeout=route.connect_timeout_s,
            auth_timeout=route.connect_timeout_s,
            sock=channel,
        )
    except (paramiko.SSHException, OSError, EOFError) as exc:
        client.close()
        raise _login_error(route, endpoint, exc) from None
    return client


# The control connection's segments fit a 1500-byte MTU (with IPv6 and TCP options to spare). A
# worker is often reached at its fabric address, on a 9000-byte path; after a firmware update's
# reboot left one port at 1500, full-size segments of a connection made before are dropped without
# a word (no ICMP on one link) and the connection stalls, so the reconciler could not even learn
# the MTU it must report. Its traffic is small; bulk copies use their own connections.
CONTROL_MSS = 1360


def _direct_socket(endpoint: Endpoint, timeout: float) -> socket.socket:
    """A TCP connection to the endpoint, each address in turn as paramiko would try them, its
    segments capped at CONTROL_MSS (set before connecting: it caps what both ends send)."""
    failure: OSError = OSError(f"{endpoint.hostname} has no address")
    for family, kind, proto, _, address in socket.getaddrinfo(
        endpoint.hostname, endpoint.port, type=socket.SOCK_STREAM
    ):
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, CONTROL_MSS)
            sock.settimeout(timeout)
            sock.connect(address)
        except OSError as exc:
            sock.close()
            failure = exc
            continue
        return sock
    raise failure


def _login_error(route: SshRoute, endpoint: Endpoint, exc: Exception) -> NodeUnreachableError:
    """What went wrong on one hop, in the user's terms."""
    who = _who(route, endpoint)
    files = ", ".join(route.known_hosts)
    if isinstance(exc, _UnknownHostKey):
        alias = f", under the name {endpoint.host_key_alias} (its HostKeyAlias)" if endpoint.host_key_alias else ""
        return NodeUnreachableError(
            f"{who}: no host key for {endpoint.host_key_name} in {files} (it offers {exc.key.get_name()} "
            f"{exc.key.fingerprint})",
            f"verify that fingerprint, then add the key: ssh-keyscan -p {endpoint.port} {endpoint.hostname} "
            f">> {route.known_hosts[0]}{alias}; keys are always checked, whatever StrictHostKeyChecking says",
        )
    if isinstance(exc, paramiko.BadHostKeyException):
        return NodeUnreachableError(
            f"{who}: the host key does not match {endpoint.host_key_name} in {files}",
            "the host was reinstalled, or something intercepts the connection: verify the fingerprint first",
        )
    if isinstance(exc, paramiko.AuthenticationException):
        return NodeUnreachableError(
            f"{who}: SSH authentication failed",
            "check the user and key (nodes[].ssh.user / identity_file, or User / IdentityFile in the ssh "
            "config) and the key in the host's authorized_keys",
        )
    if isinstance(exc, paramiko.SSHException | EOFError):
        return NodeUnreachableError(f"{who}: SSH failed: {exc}", "check that sshd runs there and the address is right")
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
    return NodeUnreachableError(
        f"{who}: cannot connect: {reason}", "check the cable/address (use the fabric IP) and that sshd is running"
    )


def _who(route: SshRoute, endpoint: Endpoint) -> str:
    if endpoint is route.target:
        return f"{route.node}: SSH to {endpoint.describe()}"
    return f"{route.node}: jump host {endpoint.describe()}"
