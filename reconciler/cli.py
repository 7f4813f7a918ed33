"""Command line: parse arguments, call the core, render its data. Nothing else lives here."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from reconciler import __version__, commands
from reconciler.errors import ReconcilerError, SpecError
from reconciler.execution import Progress
from reconciler.facts.gather import gather
from reconciler.facts.node import load_facts
from reconciler.plan import Plan, plan, render_text
from reconciler.spec import SCHEMA_PATH, LoadedSpec, default_spec_path, load_spec, schema_text

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
    except KeyboardInterrupt:
        sys.stderr.write("interrupted; every step is idempotent: run the command again to continue\n")
        return EXIT_ERROR
    except Exception as exc:
        if os.environ.get("RECONCILER_DEBUG"):
            raise
        bug = ReconcilerError(
            f"internal error: {type(exc).__name__}: {exc}",
            "this is a bug in spark-reconciler: rerun with RECONCILER_DEBUG=1 for the traceback and report it",
        )
        return _fail(bug, as_json=getattr(args, "json", False))


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

    apply_cmd = commands.add_parser("apply", help="converge: show the plan, execute it with progress, plan again")
    _spec_option(apply_cmd)
    apply_cmd.add_argument(
        "--deep-verify", action="store_true", help="rehash every checkpoint file, ignoring the cache"
    )
    _json_option(apply_cmd)
    apply_cmd.set_defaults(handler=_cmd_apply)

    facts_cmd = commands.add_parser("facts", help="print the observed state of every node (a facts snapshot)")
    _spec_option(facts_cmd)
    facts_cmd.set_defaults(handler=_cmd_facts, json=True)

    status_cmd = commands.add_parser("status", help="per node: containers, guard, memory; API health; pending changes")
    _spec_option(status_cmd)
    _json_option(status_cmd)
    status_cmd.set_defaults(handler=_cmd_status)

    logs_cmd = commands.add_parser("logs", help="logs of a rank (r0, r1, ...) or of the memory guard")
    _spec_option(logs_cmd)
    logs_cmd.add_argument("which", metavar="r0|r1|...|memguard")
    logs_cmd.add_argument("--node", help="node of the memory guard log (default: the head)")
    logs_cmd.add_argument("-f", "--follow", action="store_true")
    logs_cmd.add_argument("--tail", type=int, default=200)
    logs_cmd.set_defaults(handler=_cmd_logs)

    stop_cmd = commands.add_parser("stop", help="stop the ranks in order and hold them down until `start`")
    _spec_option(stop_cmd)
    _json_option(stop_cmd)
    stop_cmd.set_defaults(handler=_cmd_stop)

    start_cmd = commands.add_parser("start", help="clear a hold or a memory-guard trip, then converge")
    _spec_option(start_cmd)
    _json_option(start_cmd)
    start_cmd.set_defaults(handler=_cmd_start)
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
    if args.facts is not None:
        result = plan(loaded.deployment, load_facts(args.facts))
    else:
        with commands.session(loaded.deployment) as transports:
            _, result = commands.live_plan(loaded.deployment, transports)
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


def _warn(loaded: LoadedSpec) -> None:
    for warning in loaded.warnings:
        sys.stderr.write(f"warning: {warning.render()}\n")


def _cmd_apply(args: argparse.Namespace) -> int:
    loaded = load_spec(args.spec or default_spec_path())
    _warn(loaded)
    deployment = loaded.deployment
    show = None if args.json else _show_plan
    with commands.session(deployment) as transports:
        outcome = commands.converge(deployment, transports, Progress(), deep_verify=args.deep_verify, show=show)
    if args.json:
        _emit_json(
            {
                "ok": not outcome.after.has_changes,
                "plan": outcome.before.to_dict(),
                "applied": outcome.result.to_dict(),
                "remaining": outcome.after.to_dict(),
            }
        )
    else:
        sys.stdout.write(_apply_summary(outcome))
    return EXIT_OK if not outcome.after.has_changes else EXIT_ERROR


def _show_plan(result: Plan) -> None:
    sys.stdout.write(render_text(result))
    sys.stdout.flush()


def _apply_summary(outcome: commands.ApplyOutcome) -> str:
    count = len(outcome.result.done)
    if not outcome.before.has_changes:
        return ""
    if not outcome.after.has_changes:
        return f"Apply complete: {count} actions. The deployment matches the spec.\n"
    return (
        f"Apply finished {count} actions, but the deployment still differs:\n"
        + render_text(outcome.after)
        + "Run `reconciler apply` again, or `reconciler status` for details.\n"
    )


def _cmd_facts(args: argparse.Namespace) -> int:
    loaded = load_spec(args.spec or default_spec_path())
    with commands.session(loaded.deployment) as transports:
        facts = gather(loaded.deployment, transports)
    sys.stdout.write(facts.to_json())
    return EXIT_OK


def _cmd_status(args: argparse.Namespace) -> int:
    loaded = load_spec(args.spec or default_spec_path())
    with commands.session(loaded.deployment) as transports:
        report = commands.status(loaded.deployment, transports)
    if args.json:
        _emit_json(report)
    else:
        sys.stdout.write(_render_status(report))
    return EXIT_OK


def _render_status(report: dict[str, Any]) -> str:
    lines = [f"deployment {report['deployment']}: {'converged' if report['converged'] else 'NOT converged'}"]
    for name, node in report["nodes"].items():
        memory = f"MemAvailable {node['mem_available_gib']:.1f} GiB" if node["mem_available_gib"] is not None else ""
        state = "reachable" if node["reachable"] else f"UNREACHABLE ({node['error']})"
        lines.append(f"  r{node['rank']} {name} ({node['role']}): {state} {memory}".rstrip())
        lines += [f"     {c['name']} {c['status']}" + _exit(c) for c in node["containers"]]
        guard = node["guard"]
        trip = f", tripped at {guard['trip']['at']}" if guard["trip"] else ""
        lines.append(f"     memguard {'running' if guard['running'] else 'not running'}{trip}")
        if node["hold"]:
            lines.append(f"     held since {node['hold']['since']} ({node['hold']['reason']})")
        lines += [f"     {component}: {state}" for component, state in sorted(node["components"].items())]
    lines.append(f"  health: {report['health'] if report['health'] is not None else 'no answer'}")
    lines += [f"  ! {condition}" for condition in report["conditions"]]
    lines += [f"  pending: {item['id']}: {item['cause']}" for item in report["pending"]]
    return "\n".join(lines) + "\n"


def _exit(container: dict[str, Any]) -> str:
    return f" (exit {container['exit_code']})" if container["exit_code"] is not None else ""


def _cmd_logs(args: argparse.Namespace) -> int:
    loaded = load_spec(args.spec or default_spec_path())
    deployment = loaded.deployment
    with commands.session(deployment) as transports:
        if args.which == "memguard":
            node = args.node or deployment.head.name
            if node not in transports:
                raise ReconcilerError(f"no node named {node} in the spec", f"use one of {', '.join(transports)}")
            for text in commands.guard_log(deployment, transports, node, tail=args.tail, follow=args.follow):
                sys.stdout.write(text)
                sys.stdout.flush()
            return EXIT_OK
        rank = _rank_of(args.which, len(deployment.nodes))
        for chunk in commands.container_logs(deployment, transports, rank, tail=args.tail, follow=args.follow):
            sys.stdout.write(chunk.decode("utf-8", errors="replace"))
            sys.stdout.flush()
    return EXIT_OK


def _rank_of(which: str, count: int) -> int:
    if which.startswith("r") and which[1:].isdigit() and int(which[1:]) < count:
        return int(which[1:])
    raise ReconcilerError(f"unknown log source '{which}'", f"use r0..r{count - 1} or memguard")


def _cmd_stop(args: argparse.Namespace) -> int:
    loaded = load_spec(args.spec or default_spec_path())
    with commands.session(loaded.deployment) as transports:
        commands.hold(loaded.deployment, transports)
        outcome = commands.converge(loaded.deployment, transports, Progress())
    if args.json:
        _emit_json({"ok": True, "held": True, "applied": outcome.result.to_dict()})
    else:
        sys.stdout.write("stopped; ranks stay down until `reconciler start`\n")
    return EXIT_OK


def _cmd_start(args: argparse.Namespace) -> int:
    loaded = load_spec(args.spec or default_spec_path())
    with commands.session(loaded.deployment) as transports:
        commands.release(loaded.deployment, transports)
        outcome = commands.converge(loaded.deployment, transports, Progress())
    converged = not outcome.after.has_changes
    if args.json:
        _emit_json({"ok": converged, "applied": outcome.result.to_dict()})
    else:
        sys.stdout.write(_apply_summary(outcome) or "already running\n")
    return EXIT_OK if converged else EXIT_ERROR
