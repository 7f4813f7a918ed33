"""What every command's handler shares: exit codes, JSON output, error rendering. Light imports only."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from reconciler.constants import EXIT_CHANGES as EXIT_CHANGES
from reconciler.constants import EXIT_ERROR as EXIT_ERROR
from reconciler.constants import EXIT_INTERRUPTED as EXIT_INTERRUPTED
from reconciler.constants import EXIT_NOT_CONVERGED as EXIT_NOT_CONVERGED
from reconciler.constants import EXIT_OK as EXIT_OK
from reconciler.constants import default_spec_path
from reconciler.errors import ReconcilerError, SpecError

if TYPE_CHECKING:
    from reconciler.spec import LoadedSpec


def emit_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def emit(as_json: bool, data: object, text: Callable[[], str]) -> None:
    """A command's report: `data` as JSON with --json, else `text()` (rendered only then)."""
    if as_json:
        emit_json(data)
    else:
        sys.stdout.write(text())


def fail(exc: ReconcilerError, as_json: bool) -> int:
    if as_json:
        emit_json({"ok": False, **exc.to_dict()})
        return EXIT_ERROR
    if isinstance(exc, SpecError):
        for problem in exc.problems:
            sys.stderr.write(f"error: {problem.render()}\n")
    sys.stderr.write(f"error: {exc.message}\n")
    if exc.hint:
        sys.stderr.write(f"  hint: {exc.hint}\n")
    return EXIT_ERROR


def spec_path(given: str | None) -> str:
    """--spec, else $RECONCILER_SPEC, else the default (without importing the spec model)."""
    return given or default_spec_path()


def load(args: argparse.Namespace) -> LoadedSpec:
    """The spec of --spec; the spec model is imported only now."""
    from reconciler.spec import load_spec

    return load_spec(spec_path(args.spec))


def warn(loaded: LoadedSpec) -> None:
    for warning in loaded.warnings:
        sys.stderr.write(f"warning: {warning.render()}\n")


def ask(question: str, yes: bool, *, doing: str = "do it", prompt: str = "Do you want to go on?") -> bool:
    """Whether to go on with what `question` describes (a clause: "this plan restarts ..."):
    --yes says so; a terminal is asked, on stderr (so `cmd | tee log` still asks); with nobody to
    ask (a script, a pipe, CI) the answer is no, with the hint to say --yes. Only 'yes' counts."""
    if yes:
        return True
    if not sys.stdin.isatty():
        sys.stderr.write(
            f"error: {question}, and there is nobody to ask (stdin is not a terminal)\n"
            f"  hint: add --yes to the same command to {doing} without a question, or run it in a terminal\n"
        )
        return False
    sys.stderr.write(f"\n{question[:1].upper()}{question[1:]}.\n{prompt} Only 'yes' is accepted: ")
    sys.stderr.flush()
    try:
        answer = sys.stdin.readline().strip()
    except (OSError, UnicodeDecodeError):
        answer = ""
    if answer != "yes":
        sys.stderr.write("Cancelled; nothing was changed.\n")
    return answer == "yes"
