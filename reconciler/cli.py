"""Command line: parse arguments, call the core, render its data. Nothing else lives here."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from reconciler import __version__
from reconciler.errors import ReconcilerError, SpecError
from reconciler.facts.node import load_facts
from reconciler.plan import plan, render_text
from reconciler.spec import SCHEMA_PATH, default_spec_path, load_spec, schema_text

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CHANGES = 2
EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except ReconcilerError as exc:
        return _fail(exc, as_json=getattr(args, "json", False))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reconciler",
        description="Keep a DeepSeek-V4.1-Flash deployment on DGX Spark nodes converged.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    validate = commands.add_parser("validate", help="check a spec; every problem with file:line:column")
    _spec_option(validate)
    _json_option(validate)
    validate.set_defaults(handler=_cmd_validate)

    schema = commands.add_parser("schema", help=f"write {SCHEMA_PATH} from the spec model")
    schema.add_argument("--out", default=SCHEMA_PATH, help=f"where to write (default {SCHEMA_PATH}; - for stdout)")
    schema.add_argument("--check", action="store_true", help="exit 1 if the file differs instead of writing it")
    _json_option(schema)
    schema.set_defaults(handler=_cmd_schema)

    plan_cmd = commands.add_parser("plan", help="show what apply would change")
    _spec_option(plan_cmd)
    plan_cmd.add_argument("--facts", metavar="FILE", help="plan offline from a facts snapshot (JSON)")
    plan_cmd.add_argument(
        "--detailed-exitcode",
        action="store_true",
        help="exit 0 when nothing changes, 2 when something does, 1 on error",
    )
    plan_cmd.add_argument("-v", "--verbose", action="store_true", help="also say why each in-sync part needs nothing")
    _json_option(plan_cmd)
    plan_cmd.set_defaults(handler=_cmd_plan)
    return parser


def _spec_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--spec",
        default=None,
        metavar="PATH",
        help="spec file (default: $RECONCILER_SPEC or specs/deployment.yaml)",
    )


def _json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output on stdout")


def _emit_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def _fail(exc: ReconcilerError, as_json: bool) -> int:
    if as_json:
        _emit_json({"ok": False, **exc.to_dict()})
        return EXIT_ERROR
    if isinstance(exc, SpecError):
        for problem in exc.problems:
            sys.stderr.write(f"error: {problem.render()}\n")
    sys.stderr.write(f"error: {exc.message}\n")
    if exc.hint:
        sys.stderr.write(f"  hint: {exc.hint}\n")
    return EXIT_ERROR


def _cmd_validate(args: argparse.Namespace) -> int:
    loaded = load_spec(args.spec or default_spec_path())
    if args.json:
        _emit_json({"ok": True, "spec": loaded.path, "warnings": [w.to_dict() for w in loaded.warnings]})
        return EXIT_OK
    for warning in loaded.warnings:
        sys.stderr.write(f"warning: {warning.render()}\n")
    deployment = loaded.deployment
    sys.stdout.write(f"{loaded.path}: valid ({len(deployment.nodes)} nodes, deployment {deployment.name})\n")
    return EXIT_OK


def _cmd_schema(args: argparse.Namespace) -> int:
    text = schema_text()
    if args.out == "-":
        sys.stdout.write(text)
        return EXIT_OK
    target = Path(args.out)
    current = target.read_text(encoding="utf-8") if target.exists() else None
    if args.check:
        fresh = current == text
        if args.json:
            _emit_json({"ok": fresh, "path": str(target)})
        elif not fresh:
            sys.stderr.write(f"error: {target} is stale\n  hint: run `reconciler schema` and commit the result\n")
        return EXIT_OK if fresh else EXIT_ERROR
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_suffix(target.suffix + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(target)
    if args.json:
        _emit_json({"ok": True, "path": str(target), "changed": current != text})
    else:
        sys.stdout.write(f"wrote {target}{'' if current != text else ' (unchanged)'}\n")
    return EXIT_OK


def _cmd_plan(args: argparse.Namespace) -> int:
    loaded = load_spec(args.spec or default_spec_path())
    if args.facts is None:
        raise ReconcilerError(
            "live fact gathering is not available yet",
            "pass --facts FILE to plan from a snapshot (examples in tests/fixtures/facts/)",
        )
    result = plan(loaded.deployment, load_facts(args.facts))
    if args.json:
        _emit_json(result.to_dict())
    else:
        for warning in loaded.warnings:
            sys.stderr.write(f"warning: {warning.render()}\n")
        sys.stdout.write(render_text(result, verbose=args.verbose))
    if result.blockers and args.detailed_exitcode:
        return EXIT_ERROR
    if args.detailed_exitcode and result.has_changes:
        return EXIT_CHANGES
    return EXIT_OK
