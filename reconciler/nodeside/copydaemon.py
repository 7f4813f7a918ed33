"""Runs ON a worker (stdlib only): an rsync daemon that receives one checkpoint copy.

rsync over SSH spends most of its CPU in ssh and sshd, not in rsync: on the 2-core testbed one
stream costs about 9 CPU-seconds per GB through ssh and under 2 through rsync's own daemon
protocol. So the bulk bytes go to a daemon started for one copy and stopped after it: bound to
the worker's fabric address only, accepting the head's fabric address only, one module (the
revision directory being filled), writes as the SSH user, a password made for this copy that
reaches the head over the SSH control connection and the daemon in a 0600 file of the private
state dir. The bytes themselves are not encrypted: they cross the same direct cable as the
ranks' tensor traffic (RoCE is not encrypted either), and every file is sha256-verified on the
worker before anything serves it. The head learns the port only once the listener on it is
proven rsync's own (another user could have bound the free port first). A daemon left by a
killed apply is stopped by the next start and ends on its own after a day (`timeout`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from typing import Any, NoReturn

from reconciler.nodeside.common import child_environment, reply, stop_pid, write_private

MODULE = "checkpoint"
USER = "reconciler"
LIFETIME_S = 24 * 3600
# A connection silent this long is dropped, so connections that never authenticate cannot hold
# the `max connections` slots. A healthy stream is never that quiet: its sender writes file data
# without pause (its progress reaches the head every second), and rsync sends keep-alives when a
# side waits longer than half this on its own work; ten minutes is rsyncd.conf's own suggestion.
IDLE_TIMEOUT_S = 600
_FILES = ("rsyncd.conf", "rsyncd.secrets", "rsyncd.pid", "rsyncd.lock")


def _fail(message: str) -> NoReturn:
    sys.stderr.write(message + "\n")
    sys.exit(1)


def _plain_value(value: str, what: str) -> str:
    """rsyncd.conf reads a value to the end of its line and expands %VAR%: refuse what would
    be read as something else."""
    if any(c in value for c in "\r\n%") or value != value.strip():
        _fail(f"{what} {value!r} cannot go into rsyncd.conf (a line break, '%' or outer spaces)")
    return value


def config(directory: str, path: str, allow: str, connections: int, idle_timeout_s: int = IDLE_TIMEOUT_S) -> str:
    return (
        f"pid file = {directory}/rsyncd.pid\n"
        f"lock file = {directory}/rsyncd.lock\n"
        f"log file = {directory}/rsyncd.log\n"
        "use chroot = no\n"
        # No DNS for the head's address: a node whose resolver is unreachable would stall each stream.
        "reverse lookup = no\n"
        f"max connections = {connections}\n"
        # Set for the whole daemon, it also bounds the greeting and login before a module is chosen.
        f"timeout = {idle_timeout_s}\n"
        f"uid = {os.getuid()}\n"
        f"gid = {os.getgid()}\n"
        f"[{MODULE}]\n"
        f"path = {_plain_value(path, 'the destination')}\n"
        "read only = false\n"
        "write only = true\n"  # the copy only ever sends files here
        "list = false\n"
        f"auth users = {USER}\n"
        f"secrets file = {directory}/rsyncd.secrets\n"
        "strict modes = true\n"
        f"hosts allow = {_plain_value(allow, 'the head address')}\n"
        "hosts deny = *\n"
    )


def _command(directory: str) -> list[str]:
    """The daemon's command line after `timeout`: how its pid file is told from a reused pid."""
    return ["rsync", "--daemon", "--no-detach", f"--config={directory}/rsyncd.conf"]


def _stop(directory: str) -> bool:
    """Stop the daemon of a previous copy (its pid file), if one still runs."""
    return stop_pid(f"{directory}/daemon.pid", _command(directory), group=True)


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError as error:
            _fail(f"cannot listen on {address} ({error.strerror}): is it this node's fabric address? (`ip -br addr`)")
        port: int = probe.getsockname()[1]
        return port


def _listeners(address: str, port: int) -> set[str]:
    """Socket inodes listening where a connection to address:port would arrive (that address or
    any), from the kernel's IPv4 socket table."""
    wanted = {
        f"{int.from_bytes(socket.inet_aton(host), sys.byteorder):08X}:{port:04X}" for host in (address, "0.0.0.0")
    }
    with open("/proc/net/tcp", encoding="ascii") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return {row[9] for row in rows if row[1] in wanted and row[3] == "0A"}  # 0A: LISTEN


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (the kernel's per-task children list is not always built in)."""
    return [int(entry) for entry in filter(str.isdigit, os.listdir("/proc")) if _parent(entry) == pid]


def _parent(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])  # after the name in parentheses: state, ppid
    except (OSError, IndexError, ValueError):
        return None  # gone meanwhile


def _sockets_of(pids: list[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for descriptor in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{descriptor}")
                    if target.startswith("socket:["):
                        inodes.add(target[len("socket:[") : -1])
    return inodes


def _serving(address: str, port: int, process: subprocess.Popen[bytes]) -> bool:
    """Whether the rsync we started (the child of `timeout`) listens on address:port, and nothing
    else does. The port was free when chosen, but another user may bind it before rsync does, and
    a connection would then reach that user's program with the password and the checkpoint. The
    kernel lets no other user listen there once rsync does, so owning the listener is enough."""
    for _ in range(100):
        if process.poll() is not None:
            return False  # rsync could not bind (the port was taken) or failed otherwise
        listeners = _listeners(address, port)
        if listeners and listeners <= _sockets_of([process.pid, *_children(process.pid)]):
            return True
        time.sleep(0.05)
    return False


def start(args: dict[str, Any]) -> None:
    """Start the daemon on a free port of `address`; answer the port."""
    directory = os.path.expanduser(args["dir"])
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    _stop(directory)
    write_private(f"{directory}/rsyncd.secrets", f"{USER}:{args['secret']}\n")
    write_private(f"{directory}/rsyncd.conf", config(directory, args["path"], args["allow"], args["connections"]))
    for _ in range(3):  # another program may take the free port before rsync binds it
        port = _free_port(args["address"])
        argv = ["timeout", str(LIFETIME_S), *_command(directory), f"--address={args['address']}", f"--port={port}"]
        log = open(f"{directory}/rsyncd.log", "ab")  # noqa: SIM115 - handed to the daemon
        process = subprocess.Popen(
            argv, env=child_environment(), stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
        log.close()
        write_private(f"{directory}/daemon.pid", f"{process.pid}\n")
        if _serving(args["address"], port, process):
            reply({"port": port})
            return
        _stop(directory)
    _fail(
        f"rsync --daemon did not start listening on {args['address']} in 3 tries (another program may have taken "
        f"each free port first; see {directory}/rsyncd.log)"
    )


def stop(args: dict[str, Any]) -> None:
    """Stop the copy's daemon and remove its password and config."""
    directory = os.path.expanduser(args["dir"])
    stopped = _stop(directory)
    for name in (*_FILES, "daemon.pid"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{directory}/{name}")
    reply({"stopped": stopped})
