"""Runs ON a worker (stdlib only): an rsync daemon that receives one checkpoint copy.

rsync over SSH spends most of its CPU in ssh and sshd, not in rsync: on the 2-core testbed one
stream costs about 9 CPU-seconds per GB through ssh and under 2 through rsync's own daemon
protocol. So the bulk bytes go to a daemon started for one copy and stopped after it: bound to
the worker's fabric address only, accepting the head's fabric address only, one module (the
revision directory being filled), writes as the SSH user, a password made for this copy that
reaches the head over the SSH control connection and the daemon in a 0600 file of the private
state dir. The bytes themselves are not encrypted: they cross the same direct cable as the
ranks' tensor traffic (RoCE is not encrypted either), and every file is sha256-verified on the
worker before anything serves it. A daemon left by a killed apply is stopped by the next start
and ends on its own after a day (`timeout`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from typing import Any, NoReturn

from reconciler.nodeside.common import reply, stop_pid, write_private

MODULE = "checkpoint"
USER = "reconciler"
LIFETIME_S = 24 * 3600
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


def config(directory: str, path: str, allow: str, connections: int) -> str:
    return (
        f"pid file = {directory}/rsyncd.pid\n"
        f"lock file = {directory}/rsyncd.lock\n"
        f"log file = {directory}/rsyncd.log\n"
        "use chroot = no\n"
        # No DNS for the head's address: a node whose resolver is unreachable would stall each stream.
        "reverse lookup = no\n"
        f"max connections = {connections}\n"
        f"uid = {os.getuid()}\n"
        f"gid = {os.getgid()}\n"
        f"[{MODULE}]\n"
        f"path = {_plain_value(path, 'the destination')}\n"
        "read only = false\n"
        "list = false\n"
        f"auth users = {USER}\n"
        f"secrets file = {directory}/rsyncd.secrets\n"
        "strict modes = true\n"
        f"hosts allow = {_plain_value(allow, 'the head address')}\n"
        "hosts deny = *\n"
    )


def _stop(directory: str) -> bool:
    """Stop the daemon of a previous copy (its pid file), if one still runs."""
    return stop_pid(f"{directory}/daemon.pid", group=True)


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError as error:
            _fail(f"cannot listen on {address} ({error.strerror}): is it this node's fabric address? (`ip -br addr`)")
        port: int = probe.getsockname()[1]
        return port


def _listening(address: str, port: int, process: subprocess.Popen[bytes]) -> bool:
    for _ in range(100):
        if process.poll() is not None:
            return False
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return True
        except OSError:
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
        argv = ["timeout", str(LIFETIME_S), "rsync", "--daemon", "--no-detach", f"--config={directory}/rsyncd.conf"]
        argv += [f"--address={args['address']}", f"--port={port}"]
        log = open(f"{directory}/rsyncd.log", "ab")  # noqa: SIM115 - handed to the daemon
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        log.close()
        write_private(f"{directory}/daemon.pid", f"{process.pid}\n")
        if _listening(args["address"], port, process):
            reply({"port": port})
            return
        _stop(directory)
    _fail(f"rsync --daemon did not start on {args['address']} (see {directory}/rsyncd.log)")


def stop(args: dict[str, Any]) -> None:
    """Stop the copy's daemon and remove its password and config."""
    directory = os.path.expanduser(args["dir"])
    stopped = _stop(directory)
    for name in (*_FILES, "daemon.pid"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{directory}/{name}")
    reply({"stopped": stopped})
