"""sd_notify(3) in pure Python: tell systemd we are ready, how we are, and that we are alive.

Without $NOTIFY_SOCKET (not under systemd) every call is a no-op, so the loop is the same
program in a terminal and under `Type=notify`. A leading '@' names an abstract socket.
"""

from __future__ import annotations

import os
import socket

from reconciler.progress import printable
from reconciler.redact import redact


def _send(message: str) -> bool:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.connect(address)
        # STATUS= is readable by every local user (`systemctl status`): never a secret in it.
        sock.sendall(redact(message).encode("utf-8", "replace"))
    return True


def ready(status: str = "") -> bool:
    return _send("READY=1" + (f"\nSTATUS={_one_line(status)}" if status else ""))


def status(text: str) -> bool:
    return _send("STATUS=" + _one_line(text))


def _one_line(text: str) -> str:
    """STATUS= as `systemctl status` shows it to every local user: one line (a newline would end
    the field), nothing that moves the terminal's cursor or reorders the text, cut."""
    return printable(text, 400).strip()


def watchdog() -> bool:
    return _send("WATCHDOG=1")


def stopping() -> bool:
    return _send("STOPPING=1")


def watchdog_interval_s() -> float | None:
    """Half of WatchdogSec= (systemd's advice), or None when no watchdog is configured."""
    value = os.environ.get("WATCHDOG_USEC")
    if not value or not value.isdigit():
        return None
    pid = os.environ.get("WATCHDOG_PID")
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    return int(value) / 1_000_000 / 2
