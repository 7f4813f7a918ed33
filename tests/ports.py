"""Free loopback ports for the stand-ins a test starts."""

from __future__ import annotations

import socket

_ISSUED: set[int] = set()


def free_port() -> int:
    """A port nothing listens on now, and never one handed out before in this process: the
    kernel may give the same ephemeral port to two binds in a row once the first is closed, and a
    test that asks for an API port and a rendezvous port then starts two servers on one."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port not in _ISSUED:
            _ISSUED.add(port)
            return port
