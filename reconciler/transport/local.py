"""The machine the reconciler runs on (normally the head)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Any

import docker

from reconciler.errors import NodeUnreachableError
from reconciler.transport.base import CommandResult


class LocalTransport:
    def __init__(self, node: str) -> None:
        self.node = node
        self._docker: Any = None
        self.round_trips = 0

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float = 120.0) -> CommandResult:
        self.round_trips += 1
        completed = subprocess.run(list(argv), input=stdin, capture_output=True, timeout=timeout, check=False)
        return CommandResult(completed.returncode, completed.stdout, completed.stderr)

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
