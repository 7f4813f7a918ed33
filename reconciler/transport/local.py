"""The machine the reconciler runs on (normally the head)."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Sequence
from typing import Any

import docker

from reconciler.errors import NodeUnreachableError
from reconciler.transport.base import CommandResult, LineSink, LineSplitter, keep_tail

# What a command on this machine keeps of the reconciler's environment: what a login over SSH
# would give it (user, paths, locale, the agent for the copy's ssh), the proxy a node's Hub
# fetch goes through, and where the node's Docker and RDMA sysfs are. Never the rest: the
# reconciler's own environment may hold the Hub token or the API key, which no node command reads.
_KEPT = frozenset(
    {
        *("PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TMPDIR", "TZ", "LANG", "LANGUAGE"),
        *("SSH_AUTH_SOCK", "XDG_RUNTIME_DIR", "DOCKER_HOST", "RECONCILER_SYSFS_ROOT"),
        *("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"),
    }
)


def node_environment() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name in _KEPT or name.startswith("LC_")}


class LocalTransport:
    def __init__(self, node: str) -> None:
        self.node = node
        self._docker: Any = None
        self.round_trips = 0

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
            if on_line is None:
                completed = subprocess.run(
                    list(argv), input=stdin, capture_output=True, timeout=timeout, check=False, env=node_environment()
                )
                return CommandResult(completed.returncode, completed.stdout, completed.stderr)
            return _run_streaming(list(argv), stdin, timeout, on_line)
        except subprocess.TimeoutExpired:
            raise NodeUnreachableError(
                f"{self.node}: {argv[0]} did not finish within {timeout:g} s", "the machine may be overloaded"
            ) from None
        except OSError as exc:
            raise NodeUnreachableError(
                f"{self.node}: cannot run {argv[0]}: {exc.strerror or exc}", f"install {argv[0]} on this machine"
            ) from None

    def docker(self) -> Any:
        if self._docker is None:
            try:
                self._docker = docker.from_env(timeout=120)
            except docker.errors.DockerException as exc:
                raise NodeUnreachableError(
                    f"{self.node}: cannot reach Docker: {exc}", "is dockerd running and are you in the docker group?"
                ) from None
        return self._docker

    def close(self) -> None:
        if self._docker is not None:
            self._docker.close()
            self._docker = None


def _run_streaming(argv: list[str], stdin: bytes | None, timeout: float, on_line: LineSink) -> CommandResult:
    """Like subprocess.run, but stderr reaches `on_line` while the command runs.

    stderr is a pipe of its own, which `communicate` does not know: were it `PIPE`, communicate
    would read it too, and every chunk it took would never reach `on_line`."""
    read_end, write_end = os.pipe()
    try:
        process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=write_end, env=node_environment()
        )
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    stderr = bytearray()
    splitter = LineSplitter(on_line)

    def pump() -> None:
        with os.fdopen(read_end, "rb", buffering=0) as source:
            while data := source.read(65536):
                keep_tail(stderr, data)
                splitter.feed(data)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        stdout, _ = process.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    reader.join(timeout=5)
    return CommandResult(process.returncode, stdout, bytes(stderr))
