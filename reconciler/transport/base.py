"""The transport seam: everything above it is the same for local and SSH nodes."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from reconciler.errors import NodeCommandError
from reconciler.nodeside import program


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")


LineSink = Callable[[str], None]


class Transport(Protocol):
    node: str
    round_trips: int  # commands run so far; a plan pass should cost one per node

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float = 120.0,
        on_line: LineSink | None = None,
    ) -> CommandResult:
        """Run argv; `on_line` gets stderr lines (and `\r` progress updates) as they arrive."""
        ...

    def docker(self) -> Any: ...

    def close(self) -> None: ...


def run_program(
    transport: Transport, module: str, call: str, args: Any, *, timeout: float = 600.0, on_line: LineSink | None = None
) -> Any:
    """Run a nodeside program with `python3 -` and return its JSON output."""
    result = transport.run(["python3", "-"], stdin=program(module, call, args), timeout=timeout, on_line=on_line)
    if result.returncode != 0:
        detail = result.stderr.decode("utf-8", errors="replace").strip().splitlines()[-3:]
        raise NodeCommandError(
            f"{transport.node}: {module}.{call} failed (exit {result.returncode}): {' / '.join(detail)}",
            f"check python3 on {transport.node}; rerun with the same command to retry",
        )
    try:
        return json.loads(result.stdout)
    except ValueError:
        raise NodeCommandError(
            f"{transport.node}: {module}.{call} printed something that is not its JSON answer",
            f"check that nothing on {transport.node} writes to stdout at login (a shell profile, a banner)",
        ) from None


def check(result: CommandResult, node: str, what: str) -> CommandResult:
    if result.returncode != 0:
        detail = result.stderr.decode("utf-8", errors="replace").strip()[-400:]
        raise NodeCommandError(
            f"{node}: {what} failed (exit {result.returncode}): {detail}", f"see the message from {node}"
        )
    return result


class LineSplitter:
    """Turns a byte stream into lines, treating `\r` (progress redraws) like `\n`."""

    def __init__(self, sink: LineSink) -> None:
        self.sink = sink
        self.buffer = b""

    def feed(self, data: bytes) -> None:
        self.buffer += data
        *complete, self.buffer = self.buffer.replace(b"\r", b"\n").split(b"\n")
        for line in complete:
            if line.strip():
                self.sink(line.decode("utf-8", errors="replace"))
