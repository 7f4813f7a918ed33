"""One exception hierarchy for the whole program.

Every error carries a message saying what happened and a hint saying what to do next,
so the CLI can render any of them without a traceback. Later layers add retry semantics
by subclass (transient vs permanent), never by inspecting messages.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


class ReconcilerError(Exception):
    """Base of every error this program raises on purpose."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def to_dict(self) -> dict[str, object]:
        return {"error": type(self).__name__, "message": self.message, "hint": self.hint}


@dataclass(frozen=True)
class SpecProblem:
    """One located problem in a spec file."""

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
        return asdict(self)


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


class NodeUnreachableError(ReconcilerError):
    """A node did not answer: SSH refused or timed out, host key rejected, Docker down."""


class NodeCommandError(ReconcilerError):
    """A command or program on a node failed."""
