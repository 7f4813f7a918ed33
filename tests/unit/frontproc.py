"""A real HAProxy (Debian's, as the testbed's front image holds) run with the config the
reconciler renders, in front of a server on loopback: the API as users reach it."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from reconciler.front import haproxy_config
from reconciler.nodeside.statedir import StateDir
from tests.ports import free_port
from tests.unit.test_engine_standin import KEY, Group, Launcher, start_group

HAPROXY = Path("/usr/sbin/haproxy")


def require_haproxy() -> None:
    """As root (CI), `make unit` installs it: a missing haproxy there fails, never skips."""
    if not HAPROXY.exists():
        if os.geteuid() == 0:
            pytest.fail(f"{HAPROXY} is missing: `make shell-tools` installs it (Debian's haproxy)")
        pytest.skip(f"{HAPROXY} is missing and only root can install it")


@contextmanager
def running_front(directory: Path, engine_port: int, key_file: Path, tls_cert: Path | None = None) -> Iterator[int]:
    """HAProxy on a free loopback port forwarding to `engine_port`, the key read from `key_file`
    (with `tls_cert`, HTTPS: its key beside it as <cert>.key); yields the front's port."""
    require_haproxy()
    port = free_port()
    config = directory / "front.cfg"
    cert = str(tls_cert) if tls_cert is not None else None
    # The admin socket and the drain switch where a state dir at `directory` keeps them.
    layout = StateDir(str(directory))
    Path(layout.front_ctl).mkdir(exist_ok=True)
    Path(layout.front_drain).write_text("", encoding="utf-8")
    rendered = haproxy_config(
        "127.0.0.1",
        port,
        engine_port,
        str(key_file),
        cert,
        admin_socket=layout.front_admin_socket,
        drain_file=layout.front_drain,
    )
    config.write_text(rendered, encoding="utf-8")
    log = (directory / "front.log").open("wb")
    process = subprocess.Popen(
        [str(HAPROXY), "-db", "-f", str(config)], stdin=subprocess.DEVNULL, stdout=log, stderr=log, env={}
    )
    try:
        _wait_listening(port, process, directory / "front.log")
        yield port
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


def _wait_listening(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 10
    while True:
        assert process.poll() is None, f"haproxy exited {process.returncode}: {log.read_text()}"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            assert time.monotonic() < deadline, f"haproxy never listened on {port}: {log.read_text()}"
            time.sleep(0.05)


@contextmanager
def fronted_group(directory: Path, env: dict[str, str] | None = None) -> Iterator[tuple[Group, int]]:
    """The stand-in's two ranks as the reconciler runs them (rank 0 without the key) behind a real
    front whose key file holds KEY; yields the group and the front's port."""
    key_file = directory / "api_key"
    key_file.write_text(KEY + "\n", encoding="utf-8")
    launcher = Launcher(directory)
    try:
        group = start_group(launcher, env, keyed=False)
        with running_front(directory, group.port, key_file) as port:
            yield group, port
    finally:
        launcher.close()
