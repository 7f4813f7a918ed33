"""The transport seam: everything above it is the same for local and SSH nodes."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from reconciler.errors import NodeCommandError
from reconciler.nodeside import program
from reconciler.progress import printable


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


def find_container(client: Any, name: str) -> Any:
    """The container of that exact name, or None (a listing, because docker-py leaves the
    connection of a 404 open)."""
    found = client.containers.list(all=True, filters={"name": f"^/{name}$"})
    return found[0] if found else None


def run_program(
    transport: Transport, module: str, call: str, args: Any, *, timeout: float = 600.0, on_line: LineSink | None = None
) -> Any:
    """Run a nodeside program with `python3 -` and return its JSON output."""
    node = transport.node
    result = transport.run(["python3", "-"], stdin=program(module, call, args), timeout=timeout, on_line=on_line)
    check(result, node, f"{module}.{call}", f"check python3 on {node}; rerun with the same command to retry")
    try:
        return json.loads(result.stdout)
    except ValueError:
        raise NodeCommandError(
            f"{node}: {module}.{call} printed something that is not its JSON answer",
            f"check that nothing on {node} writes to stdout at login (a shell profile, a banner)",
        ) from None


def stderr_tail(result: CommandResult, lines: int = 3, limit: int = 400) -> str:
    """The last lines a node wrote to stderr, as one printable, redacted line for a message: a
    node's bytes must not reach the terminal as escapes, or a secret as itself."""
    text = result.stderr[-8 * limit :].decode("utf-8", errors="replace")
    return printable(" / ".join(line.strip() for line in text.strip().splitlines()[-lines:]), limit)


def check(result: CommandResult, node: str, what: str, hint: str | None = None) -> CommandResult:
    if result.returncode != 0:
        raise NodeCommandError(
            f"{node}: {what} failed (exit {result.returncode}): {stderr_tail(result)}",
            hint or f"see the message from {node}",
        )
    return result


# A line longer than this is cut here (its start reaches the sink, the rest is dropped up to the
# next line break): a node that never ends a line must not fill the head's memory.
MAX_LINE_BYTES = 64 * 1024
# stderr is kept for error messages, which show its end: a command that writes without end (a
# progress meter, a chatty failure) must not grow the reconciler's memory with it.
MAX_STDERR_BYTES = 256 * 1024


def keep_tail(buffer: bytearray, data: bytes, limit: int = MAX_STDERR_BYTES) -> None:
    """Append `data`, then drop from the front what goes beyond `limit`."""
    buffer += data
    if len(buffer) > limit:
        del buffer[: len(buffer) - limit]


class LineSplitter:
    """Turns a byte stream into lines, treating `\r` (progress redraws) like `\n`.

    It runs on a transport's reader (the SSH drain, a local command's stderr pump), which must
    read on until the command ends: a sink that raises is reported once on stderr and the
    stream goes on; the line it failed on is lost, not the command."""

    def __init__(self, sink: LineSink) -> None:
        self.sink = sink
        self._pending = bytearray()  # the line begun, never more than MAX_LINE_BYTES
        self._dropping = False  # within the rest of a line already cut
        self._failed = False

    def feed(self, data: bytes) -> None:
        *complete, rest = data.replace(b"\r", b"\n").split(b"\n")
        for piece in complete:
            if self._dropping:
                self._dropping = False
            else:
                self._pending += piece[: MAX_LINE_BYTES - len(self._pending)]
                self._emit()
        if not self._dropping:
            self._pending += rest[: MAX_LINE_BYTES - len(self._pending)]
            if len(self._pending) >= MAX_LINE_BYTES:
                self._emit()
                self._dropping = True

    def _emit(self) -> None:
        line = self._pending.decode("utf-8", errors="replace")
        self._pending.clear()
        if not line.strip():
            return
        try:
            self.sink(line)
        except Exception as exc:  # any bug in a sink: the reader must go on
            if not self._failed:
                self._failed = True
                cause = printable(f"{type(exc).__name__}: {exc}")
                sys.stderr.write(
                    f"reconciler: a command's output line could not be shown ({cause}); the later ones still are\n"
                )
