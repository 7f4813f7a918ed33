"""Command line: parse arguments, call the core, render its data. Nothing else lives here.

Start-up costs only what the command needs. This package's `__init__` and `parser` import the
standard library and the program's light modules (constants, errors, the redactor); each command
names its handler as "module:function", and the handler's module, which imports pydantic,
paramiko, docker or the Hub client as it needs, is loaded only when that command runs. So
`--version`, `--help` and `completion` never load them, and `validate` loads only the spec.

Exit codes, everywhere: 0 success, 1 error (including usage errors), 2 "there are changes" (plan
--detailed-exitcode) or "not converged" (status), 130 interrupted by Ctrl-C.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from reconciler.cli.common import EXIT_INTERRUPTED, fail
from reconciler.errors import ReconcilerError
from reconciler.redact import RedactingStream

if TYPE_CHECKING:
    import argparse

INTERRUPTED_HINT = "interrupted; every step is idempotent: run the command again to continue\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; whatever it prints passes through the secret redactor first.

    `argv` None: the command line of this process, which ends when the command returns."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RedactingStream(sys.stdout), RedactingStream(sys.stderr)
    try:
        return _main(argv)
    except KeyboardInterrupt:  # anywhere: parsing, a handler's imports, the handler
        sys.stderr.write(INTERRUPTED_HINT)
        return EXIT_INTERRUPTED
    finally:
        sys.stdout, sys.stderr = saved
        if argv is None:
            # What is left when the command returns is the program itself: the interpreter's
            # collections at exit would walk all of it to find nothing, which costs as much as
            # building the spec's models. Frozen, they skip it; the process's exit frees the
            # memory. Every file written is closed by then (with-blocks): none waits on a collection.
            gc.freeze()


# Commands that end by themselves in seconds, with what they allocate bounded by the spec and the
# facts. What they allocate is mostly the program itself (modules, pydantic's models and their
# schemas, alive to the end): the cyclic collector would walk it again and again (a twentieth of
# `plan --facts`) and find nothing, so they run without it; the little garbage left in cycles is
# freed by the exit.
BRIEF = frozenset({"deploy:validate", "deploy:schema", "deploy:plan", "completion:print_script"})


def _main(argv: Sequence[str] | None) -> int:
    from reconciler.cli.parser import build_parser, parse

    arguments = sys.argv[1:] if argv is None else list(argv)
    args = parse(build_parser(arguments), arguments)
    if argv is None and args.handler in BRIEF:
        gc.disable()  # for the rest of this process (see BRIEF)
    as_json = bool(getattr(args, "json", False))
    try:
        return _handler(args.handler)(args)
    except ReconcilerError as exc:
        return fail(exc, as_json=as_json)
    except Exception as exc:
        if os.environ.get("RECONCILER_DEBUG"):
            raise
        bug = ReconcilerError(
            f"internal error: {type(exc).__name__}: {exc}",
            "this is a bug in spark-reconciler: rerun with RECONCILER_DEBUG=1 for the traceback and report it",
        )
        return fail(bug, as_json=as_json)


def _handler(name: str) -> Callable[[argparse.Namespace], int]:
    """ "deploy:plan" -> reconciler.cli.deploy.plan, imported now."""
    module, _, function = name.partition(":")
    handler: Callable[[argparse.Namespace], int] = getattr(
        importlib.import_module(f"reconciler.cli.{module}"), function
    )
    return handler


# pydantic looks for plugins in every installed package's metadata when the first model is built
# (a scan that costs more than building the spec's models); the program uses none.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
