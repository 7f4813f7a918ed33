"""The program's one exception tree, a leaf: it imports nothing of the program's, so every
module can import it.

    ProgramError                       a message and a hint
    ├── ReconcilerError                what a user sees, rendered without a traceback
    │   ├── TransientError             the same call may succeed when made again: retried with
    │   │   └── NodeUnreachableError   backoff where it is made (apply retries an action)
    │   ├── FactsChangedError          the world is not what the plan was made from: the action
    │   │                              stops, and a new plan decides (converge makes one)
    │   └── every other named error    permanent: reported as it is, never retried
    └── ReadError                      internal: a reader's or parser's finding, located by its caller

- A `ReconcilerError` carries a message saying what happened and a hint saying what to do next,
  so the CLI renders any of them without a traceback. The subclass names what failed (spec,
  facts, node, ssh config, Hub, secret, Pi, bench, smoke, readiness, lock, saved plan, an
  applied action); whether it is retried follows from the branch, never from its message.
- A `ReadError` (`YamlError`, `JsoncError`, `UntrustedTextError`, `UntrustedFileError`,
  `RefusedJsonError`, `StreamError`, `CheckFailedError`, the Hub's range answers) is raised by a
  low-level reader with its position or reason, and the caller that knows which file or request
  it was turns it into a located problem (a `SpecProblem`, a `FactsError`, a `PiConfigError`, a
  failed check) in the user's terms. It is no `ReconcilerError`, so every handler of those lets
  it pass: one that reaches an action, a loop pass or the CLI is a bug, reported as one there.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol


class ProgramError(Exception):
    """Root of every error this program raises on purpose."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def to_dict(self) -> dict[str, object]:
        return {"error": type(self).__name__, "message": self.message, "hint": self.hint}


class ReconcilerError(ProgramError):
    """What went wrong, in the user's terms, and what to do next."""


class SpecProblem(NamedTuple):
    """One located problem in a spec file (a NamedTuple, not a dataclass: every command imports
    this module, and `dataclasses` costs a tenth of the interpreter's start-up)."""

    file: str
    line: int
    column: int
    path: str
    message: str
    hint: str

    def render(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}"
        field = f" {self.path}:" if self.path else ""
        text = f"{where}:{field} {self.message}"
        return f"{text}\n    hint: {self.hint}" if self.hint else text

    def to_dict(self) -> dict[str, object]:
        return dict(self._asdict())


class SpecError(ReconcilerError):
    """The spec file cannot be read, parsed or validated; holds every problem found."""

    def __init__(self, problems: list[SpecProblem]) -> None:
        count = len(problems)
        noun = "problem" if count == 1 else "problems"
        super().__init__(
            f"{count} {noun} in the spec",
            "fix each located problem above, then run `reconciler validate` again",
        )
        self.problems = problems

    def to_dict(self) -> dict[str, object]:
        data = super().to_dict()
        data["problems"] = [problem.to_dict() for problem in self.problems]
        return data


class FactsError(ReconcilerError):
    """A facts snapshot cannot be read or does not match the spec."""


class TransientError(ReconcilerError):
    """What failed may work when tried again (the peer was away, not wrong): retried with backoff."""


class NodeUnreachableError(TransientError):
    """A node did not answer: SSH refused or timed out, host key rejected, Docker down."""


class SshConfigError(ReconcilerError):
    """The ssh config (or a known_hosts file) cannot route to a node as written; not retried."""


class NodeCommandError(ReconcilerError):
    """A command or program on a node failed."""


class PipelineStoppedError(NodeCommandError):
    """A pipelined action gave up because what it takes files from failed (named in the message)."""


class HubError(ReconcilerError):
    """The Hub refused or failed a request; `kind` says how (network, http, not-found, ...)."""

    def __init__(self, message: str, hint: str = "", *, kind: str = "hub") -> None:
        super().__init__(message, hint)
        self.kind = kind


class SecretError(ReconcilerError):
    """A secret that cannot be sent as an HTTP header value; the message never holds it."""


class PiConfigError(ReconcilerError):
    """A Pi config file cannot be read or edited safely; nothing was written."""


class PiInstallError(ReconcilerError):
    """Pi is missing and cannot be installed here (no node/npm, node too old, npm failed)."""


class BenchError(ReconcilerError):
    """A bench step failed; the report on disk keeps the steps before it."""


class SmokeFailedError(ReconcilerError):
    """`apply`'s smoke step found failing checks."""


class PlotUnavailableError(ReconcilerError):
    """matplotlib cannot be imported; the JSON report is complete without its picture."""


class GroupFailedError(ReconcilerError):
    """A rank exited or the group did not become ready in time."""


class LockBusyError(ReconcilerError):
    """Another reconciler process holds the deployment lock."""


class StalePlanError(ReconcilerError):
    """The facts or the spec changed since the saved plan was made."""


class FactsChangedError(ReconcilerError):
    """An executor found the world other than the facts its plan was made from (a file whose
    bytes differ from their sha256, a config changed since it was read): it did nothing more,
    and the next plan decides. `node` and `files` say where."""

    def __init__(self, message: str, hint: str, *, node: str, files: list[str]) -> None:
        super().__init__(message, hint)
        self.node = node
        self.files = files


class ApplyError(ReconcilerError):
    """An action failed; the message names it, its node and its cause (`cause`, the error)."""

    def __init__(self, message: str, hint: str, *, cause: ReconcilerError, step: str | None = None) -> None:
        super().__init__(message, hint)
        self.cause = cause
        # The failed action's step (`ranks.wait-ready`): a group start that failed is an incident.
        self.step = step


# --- internal: raised by readers and parsers, turned into located problems by their callers ---


class ReadError(ProgramError):
    """A reader's or parser's finding, for its caller to place in the user's terms."""

    @property
    def reason(self) -> str:
        return self.message


class UntrustedFileError(ReadError):
    """The file cannot be read as a small regular file; `reason` says why, without its content."""


class UntrustedTextError(ReadError):
    """Why a file was refused: 1-based line and column, and what to do ('' if the caller knows better)."""

    def __init__(self, message: str, line: int = 1, column: int = 1, hint: str = "") -> None:
        super().__init__(message, hint)
        self.line = line
        self.column = column


class Position(Protocol):
    """A 1-based place in a text."""

    @property
    def line(self) -> int: ...

    @property
    def column(self) -> int: ...


class YamlError(ReadError):
    """A document that is malformed or uses what we refuse: where, which path, what to do."""

    def __init__(self, message: str, mark: Position, hint: str, path: tuple[str | int, ...] = ()) -> None:
        super().__init__(message, hint)
        self.mark = mark
        self.path = path


class JsoncError(ReadError):
    """Text that is not JSON even with `//` comments and trailing commas; says where."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(message)
        self.line = line
        self.column = column

    def __str__(self) -> str:
        return f"line {self.line}, column {self.column}: {self.message}"


class RefusedJsonError(ReadError):
    """JSON that the json module accepts and a facts snapshot never holds; raised from its hooks."""


class StreamError(ReadError):
    """A stream that cannot be measured: no output, or an error chunk mid-stream."""


class RangesIgnoredError(ReadError):
    """The Hub answered a Range request with the whole file (200): it is fetched whole instead."""


class CheckFailedError(ReadError):
    """A smoke check's judgement: the reason it failed, shown after FAIL."""
