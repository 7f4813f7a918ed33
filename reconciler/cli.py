"""Command line: parse arguments, call the core, render its data. Nothing else lives here."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from reconciler import __version__, commands, doctor, savedplan, service
from reconciler.errors import ReconcilerError, SpecError
from reconciler.execution import Progress
from reconciler.facts.gather import gather
from reconciler.facts.node import load_facts
from reconciler.fsutil import atomic_write
from reconciler.loop import Loop
from reconciler.pi import agent as pi_agent
from reconciler.pi import config as pi_config
from reconciler.plan import Plan, needs_confirmation, plan, render_text
from reconciler.redact import RedactingStream
from reconciler.spec import SCHEMA_PATH, Deployment, LoadedSpec, default_spec_path, load_spec, schema_text
from reconciler.verify import benchmark, smoke
from reconciler.verify.apiclient import ApiTarget, resolve_target
from reconciler.verify.benchrun import BenchRun, BenchSettings, load_report

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CHANGES = 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; whatever it prints passes through the secret redactor first."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RedactingStream(sys.stdout), RedactingStream(sys.stderr)
    try:
        return _main(argv)
    finally:
        sys.stdout, sys.stderr = saved


def _main(argv: Sequence[str] | None) -> int:
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
    _update_revision_option(plan_cmd)
    plan_cmd.add_argument(
        "--out",
        metavar="FILE",
        help="save the plan (with a fingerprint of the facts it came from) for `reconciler apply FILE`",
    )
    _json_option(plan_cmd)
    plan_cmd.set_defaults(handler=_cmd_plan)

    run_cmd = commands.add_parser("run", help="converge, then stay up and heal (the boot-time service)")
    _spec_option(run_cmd)
    run_cmd.set_defaults(handler=_cmd_run)

    apply_cmd = commands.add_parser("apply", help="converge: show the plan, execute it with progress, plan again")
    apply_cmd.add_argument(
        "plan_file",
        nargs="?",
        metavar="FILE",
        help="a plan saved by `reconciler plan --out FILE`: run exactly it, or refuse it when the deployment changed",
    )
    _spec_option(apply_cmd)
    _wait_option(apply_cmd)
    _update_revision_option(apply_cmd)
    apply_cmd.add_argument(
        "-y",
        "--yes",
        action="store_true",
        help="do not ask before a group restart, a stop or removal, or moving more than 10 GB (on a terminal)",
    )
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
    status_cmd.add_argument(
        "--probe",
        action="store_true",
        help="also send the liveness probe (keyed one-token completion): /health says 200 while the engine is dead",
    )
    status_cmd.set_defaults(handler=_cmd_status)

    doctor_cmd = commands.add_parser("doctor", help="every prerequisite on every node: PASS/WARN/FAIL with the fix")
    _spec_option(doctor_cmd)
    _json_option(doctor_cmd)
    doctor_cmd.set_defaults(handler=_cmd_doctor)

    logs_cmd = commands.add_parser("logs", help="logs of a rank (r0, r1, ...) or of the memory guard")
    _spec_option(logs_cmd)
    logs_cmd.add_argument("which", metavar="r0|r1|...|memguard")
    logs_cmd.add_argument("--node", help="node of the memory guard log (default: the head)")
    logs_cmd.add_argument("-f", "--follow", action="store_true")
    logs_cmd.add_argument("--tail", type=int, default=200)
    logs_cmd.set_defaults(handler=_cmd_logs)

    stop_cmd = commands.add_parser("stop", help="stop the ranks in order and hold them down until `start`")
    _spec_option(stop_cmd)
    _wait_option(stop_cmd)
    _json_option(stop_cmd)
    stop_cmd.set_defaults(handler=_cmd_stop)

    start_cmd = commands.add_parser("start", help="clear a hold or a memory-guard trip, then converge")
    _spec_option(start_cmd)
    _wait_option(start_cmd)
    _json_option(start_cmd)
    start_cmd.set_defaults(handler=_cmd_start)
    _add_smoke(commands)
    _add_bench(commands)
    _add_pi(commands)
    _add_install_service(commands)
    return parser


def _spec_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--spec",
        default=None,
        metavar="PATH",
        help="spec file (default: $RECONCILER_SPEC or specs/deployment.yaml)",
    )


def _update_revision_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--update-revision",
        action="store_true",
        help="move a branch or tag in model.revision to where it points on the Hub now (else it stays pinned)",
    )


def _wait_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wait", type=_seconds, default=600, metavar="SECONDS", help="how long to wait for a running loop's pass (600)"
    )


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86_400:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds from 0 to 86400")
    return value


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
    try:
        current = target.read_text(encoding="utf-8") if target.exists() else None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReconcilerError(f"cannot read {target}: {exc}", "give --out the schema file's path") from None
    if args.check:
        fresh = current == text
        if args.json:
            _emit_json({"ok": fresh, "path": str(target)})
        elif not fresh:
            sys.stderr.write(f"error: {target} is stale\n  hint: run `reconciler schema` and commit the result\n")
        return EXIT_OK if fresh else EXIT_ERROR
    try:
        atomic_write(str(target), text.encode("utf-8"), 0o644)
    except OSError as exc:
        raise ReconcilerError(
            f"cannot write {target}: {exc.strerror or exc}", "give --out a writable file path"
        ) from None
    if args.json:
        _emit_json({"ok": True, "path": str(target), "changed": current != text})
    else:
        sys.stdout.write(f"wrote {target}{'' if current != text else ' (unchanged)'}\n")
    return EXIT_OK


def _cmd_plan(args: argparse.Namespace) -> int:
    loaded = load_spec(args.spec or default_spec_path())
    if args.facts is not None:
        facts = load_facts(args.facts)
        result = plan(loaded.deployment, facts, update_revision=args.update_revision)
    else:
        with commands.session(loaded.deployment) as transports:
            facts, result = commands.live_plan(loaded.deployment, transports, update_revision=args.update_revision)
    if args.out is not None:
        saved = savedplan.saved(result, loaded.deployment, facts, update_revision=args.update_revision)
        savedplan.write(Path(args.out), saved)
        sys.stderr.write(f"saved the plan to {args.out}; run it with `reconciler apply {args.out}`\n")
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
    if args.plan_file is not None and (args.deep_verify or args.update_revision):
        raise ReconcilerError(
            "a saved plan runs as it was made: --deep-verify and --update-revision do not apply to it",
            "plan again with the option (`reconciler plan --update-revision --out FILE`), or apply without a file",
        )
    saved = None
    if args.plan_file is not None:
        path = Path(args.plan_file)
        saved = (savedplan.read(path), path)
    request = commands.Converge(
        doing="reconciler apply",
        wait_s=args.wait,
        deep_verify=args.deep_verify,
        update_revision=args.update_revision,
        saved=saved,
        show=None if args.json else _show_plan,
        confirm=None if args.yes else _confirm,
    )
    with commands.session(deployment) as transports:
        outcome = commands.converge(deployment, transports, Progress(), request)
    if args.json:
        _emit_json(
            {
                "ok": not outcome.after.has_changes and not outcome.declined,
                "declined": outcome.declined,
                "plan": outcome.before.to_dict(),
                "applied": outcome.result.to_dict(),
                "remaining": outcome.after.to_dict(),
            }
        )
    else:
        sys.stdout.write(_apply_summary(outcome))
    if outcome.declined:
        return EXIT_ERROR
    return EXIT_OK if not outcome.after.has_changes else EXIT_ERROR


def _show_plan(result: Plan) -> None:
    sys.stdout.write(render_text(result))
    sys.stdout.flush()


def _confirm(result: Plan) -> bool:
    """On a terminal, ask before the disruptive or the expensive; without one, go ahead (scripts,
    CI and the boot service have nobody to ask: `--yes` is implied there)."""
    reasons = needs_confirmation(result)
    if not reasons or not (sys.stdin.isatty() and sys.stdout.isatty()):
        return True
    sys.stdout.write(
        f"\nThis plan {'; '.join(reasons)}.\nDo you want to perform these actions? Only 'yes' is accepted: "
    )
    sys.stdout.flush()
    try:
        answer = sys.stdin.readline().strip()
    except (OSError, UnicodeDecodeError):
        answer = ""
    if answer != "yes":
        sys.stdout.write("Apply cancelled; nothing was changed.\n")
        return False
    return True


def _apply_summary(outcome: commands.ApplyOutcome) -> str:
    count = len(outcome.result.done)
    if not outcome.before.has_changes or outcome.declined:
        return ""
    if not outcome.after.has_changes:
        return f"Apply complete: {count} actions. The deployment matches the spec.\n"
    return (
        f"Apply finished {count} actions, but the deployment still differs:\n"
        + render_text(outcome.after)
        + "Run `reconciler apply` again, or `reconciler status` for details.\n"
    )


def _cmd_run(args: argparse.Namespace) -> int:
    return Loop(args.spec or default_spec_path()).run()


def _cmd_facts(args: argparse.Namespace) -> int:
    loaded = load_spec(args.spec or default_spec_path())
    with commands.session(loaded.deployment) as transports:
        facts = gather(loaded.deployment, transports)
    sys.stdout.write(facts.to_json())
    return EXIT_OK


def _cmd_status(args: argparse.Namespace) -> int:
    loaded = load_spec(args.spec or default_spec_path())
    with commands.session(loaded.deployment) as transports:
        report = commands.status(loaded.deployment, transports, probe=args.probe)
    if args.json:
        _emit_json(report)
    else:
        sys.stdout.write(_render_status(report))
    return EXIT_OK


def _cmd_doctor(args: argparse.Namespace) -> int:
    loaded = load_spec(args.spec or default_spec_path())
    with commands.session(loaded.deployment) as transports:
        report = doctor.run(loaded.deployment, transports)
    if args.json:
        _emit_json(report.to_dict())
    else:
        sys.stdout.write(doctor.render_text(report))
    return EXIT_ERROR if report.failed else EXIT_OK


def _render_status(report: dict[str, Any]) -> str:
    from reconciler import loopstatus

    lines = [f"deployment {report['deployment']}: {'converged' if report['converged'] else 'NOT converged'}"]
    lines += loopstatus.render(report.get("loop"))
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
    if report.get("liveness") is not None:
        verdict = "ok" if report["liveness"]["ok"] else "FAILED"
        lines.append(f"  liveness: {verdict}: {report['liveness']['detail']}")
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
    request = commands.Converge(doing="reconciler stop", wait_s=args.wait, first=commands.hold, blocked_is_error=False)
    with commands.session(loaded.deployment) as transports:
        outcome = commands.converge(loaded.deployment, transports, Progress(), request)
    unstopped = commands.ranks_still_running(loaded.deployment, outcome.facts)
    if args.json:
        _emit_json({"ok": not unstopped, "held": True, "still_running": unstopped, "applied": outcome.result.to_dict()})
    elif unstopped:
        sys.stderr.write(
            f"error: held, but not stopped: {', '.join(unstopped)}\n"
            "  hint: the hold stays; run `reconciler stop` again once the node answers\n"
        )
    else:
        sys.stdout.write("stopped; ranks stay down until `reconciler start`\n")
    return EXIT_ERROR if unstopped else EXIT_OK


def _cmd_start(args: argparse.Namespace) -> int:
    loaded = load_spec(args.spec or default_spec_path())
    request = commands.Converge(doing="reconciler start", wait_s=args.wait, first=commands.release)
    with commands.session(loaded.deployment) as transports:
        outcome = commands.converge(loaded.deployment, transports, Progress(), request)
    converged = not outcome.after.has_changes
    if args.json:
        _emit_json({"ok": converged, "applied": outcome.result.to_dict()})
    else:
        sys.stdout.write(_apply_summary(outcome) or "already running\n")
    return EXIT_OK if converged else EXIT_ERROR


# --- smoke and bench ------------------------------------------------------------------------


def _api_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "url", nargs="?", metavar="URL", help="API base URL (default: the spec's head, port serving.port)"
    )
    parser.add_argument(
        "--key-file", metavar="PATH", help="API key file (default: $DSV41_API_KEY, else the spec's api.key_file)"
    )
    parser.add_argument(
        "--model", help="served model name (default: the spec's serving.served_model_name, else the first listed)"
    )
    _spec_option(parser)
    _json_option(parser)


def _add_smoke(commands: Any) -> None:
    smoke_cmd = commands.add_parser(
        "smoke", help="does it work? the reference checks plus the protocol, PASS/FAIL each; exit 0 only if all pass"
    )
    _api_options(smoke_cmd)
    smoke_cmd.add_argument(
        "--checks",
        choices=("all", "protocol"),
        default="all",
        help="protocol: only models, 401 and streaming (for models that cannot answer); default all",
    )
    smoke_cmd.add_argument(
        "--max-tokens",
        type=_positive,
        default=None,
        help="cap each content answer; default none, as the reference (a model that never stops runs to max-model-len)",
    )
    smoke_cmd.set_defaults(handler=_cmd_smoke)


def _add_bench(commands: Any) -> None:
    bench = commands.add_parser(
        "bench",
        help="how fast is it? prefill, decode, TTFT/TPOT/ITL, long-context recall; `bench compare A B`",
        usage="reconciler bench [URL] --out FILE [options]\n       reconciler bench compare A.json B.json [--json]",
        description="Measure the API (definitions in the README, section Smoke and bench), or compare two reports.",
    )
    _api_options(bench)
    bench.add_argument("files", nargs="*", metavar="FILE", help=argparse.SUPPRESS)
    bench.add_argument("--out", metavar="FILE", help="JSON report, rewritten after every step (required to run)")
    bench.add_argument("--plot", metavar="FILE", help="PNG plot (default: --out with .png)")
    bench.add_argument("--label", default="", help="a name for this run in reports and comparisons")
    bench.add_argument("--conc", nargs="*", type=_positive, default=[1, 2], metavar="N", help="concurrent streams")
    bench.add_argument("--prefill", nargs="*", type=_positive, default=[8192, 32768], metavar="N", help="prompt tokens")
    bench.add_argument("--kinds", nargs="*", choices=sorted(benchmark.DECODE_PROMPTS), default=["prose", "code"])
    bench.add_argument(
        "--ctx", nargs="*", type=_positive, default=[], metavar="N", help="recall check lengths (tokens)"
    )
    bench.add_argument("--depth", type=_fraction, default=0.5, help="where the needle sits: 0 start .. 1 end")
    bench.add_argument("--reps", type=_positive, default=3, help="repetitions of each prefill and decode step")
    bench.add_argument("--max-tokens", type=_positive, default=None, help="cap decode output (default: no cap)")
    bench.set_defaults(handler=_cmd_bench)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number from 0 to 1")
    return value


def _api_target(args: argparse.Namespace) -> ApiTarget:
    return resolve_target(
        args.url, args.key_file, args.model, os.environ, lambda: load_spec(args.spec or default_spec_path()).deployment
    )


def _cmd_smoke(args: argparse.Namespace) -> int:
    report = smoke.run_smoke(_api_target(args), args.checks, args.max_tokens)
    if args.json:
        _emit_json(report.to_dict())
    else:
        sys.stdout.write(smoke.render(report))
    return EXIT_OK if report.ok else EXIT_ERROR


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.url == "compare":
        return _bench_compare(args)
    if args.files or args.out is None:
        raise ReconcilerError(
            "bench needs --out FILE (and at most one URL)",
            "reconciler bench [URL] --out bench.json, or reconciler bench compare A.json B.json",
        )
    settings = BenchSettings(
        tuple(args.conc),
        tuple(args.prefill),
        tuple(args.kinds),
        tuple(args.ctx),
        args.depth,
        args.reps,
        args.max_tokens,
        args.label,
    )
    run = BenchRun(_api_target(args), settings, Path(args.out), Progress().line)
    try:
        report = run.run()
    except KeyboardInterrupt:
        run.interrupted()
        sys.stderr.write(f"interrupted: {args.out} keeps every step measured so far\n")
        return EXIT_ERROR
    finally:
        _write_plot(run.report, Path(args.plot or Path(args.out).with_suffix(".png")))
    sys.stdout.write(json.dumps(report, indent=2) + "\n" if args.json else benchmark.render_table(report))
    return EXIT_OK if all(check["pass"] for check in report["recall"]) else EXIT_ERROR


def _write_plot(report: benchmark.Report, path: Path) -> None:
    if report.get("summary"):
        path.write_bytes(benchmark.plot_png(report))


def _bench_compare(args: argparse.Namespace) -> int:
    if len(args.files) != 2:
        raise ReconcilerError("bench compare needs two reports", "reconciler bench compare A.json B.json")
    first, second = (load_report(path) for path in args.files)
    rows = benchmark.compare(first, second)
    if args.json:
        _emit_json({"a": args.files[0], "b": args.files[1], "rows": rows})
    else:
        labels = [report.get("label") or path for report, path in ((first, args.files[0]), (second, args.files[1]))]
        sys.stdout.write(benchmark.render_compare(rows, *labels))
    return EXIT_OK


# --- the Pi coding agent on this machine ----------------------------------------------------


def _add_pi(commands: Any) -> None:
    pi_cmd = commands.add_parser("pi", help="the Pi coding agent on this machine: install, uninstall, status")
    actions = pi_cmd.add_subparsers(dest="pi_action", required=True, metavar="ACTION")
    install = actions.add_parser(
        "install", help="install Pi with npm if missing; add the provider, model and extension to its config"
    )
    install.add_argument(
        "base_url", nargs="?", metavar="BASE_URL", help="the API, e.g. http://10.10.10.10:8000 (default: the spec's)"
    )
    install.add_argument(
        "--set-default", action="store_true", default=None, help="make it Pi's default model (default: pi.set_default)"
    )
    install.add_argument(
        "--key-env",
        metavar="NAME",
        help=f"variable Pi reads the API key from (default {pi_config.DEFAULT_KEY_ENV})",
    )
    install.set_defaults(handler=_cmd_pi_install)
    uninstall = actions.add_parser("uninstall", help="remove exactly what install added to Pi's config")
    uninstall.set_defaults(handler=_cmd_pi_uninstall)
    status = actions.add_parser("status", help="Pi on PATH, its config for the provider, the key variable's state")
    status.set_defaults(handler=_cmd_pi_status)
    for action in (install, uninstall, status):
        _spec_option(action)
        _json_option(action)


def _pi_spec(args: argparse.Namespace) -> Deployment | None:
    """The spec when one is given or found; Pi on a machine without one uses the reference defaults."""
    path = args.spec or default_spec_path()
    if args.spec is None and not Path(path).exists():
        return None
    return load_spec(path).deployment


def _pi_provider(args: argparse.Namespace) -> str:
    deployment = _pi_spec(args)
    return deployment.pi.provider if deployment is not None else pi_config.DEFAULT_PROVIDER


def _cmd_pi_install(args: argparse.Namespace) -> int:
    deployment = _pi_spec(args)
    target = pi_agent.install_target(deployment, args.base_url, args.key_env, args.set_default)
    report = pi_agent.install(target)
    if args.json:
        _emit_json(report)
        return EXIT_OK
    where = f"the key file {deployment.key_file()} on {deployment.head.name}" if deployment else "the deployment's key"
    agent = report["pi"]
    now = ", installed now" if agent["installed_now"] else ""
    lines = [f"Pi: {agent['path']} ({agent['package'] or 'unknown package'}{now})"]
    lines += [f"  note: {note}" for note in report["notes"]]
    lines += _pi_changes(report, f"unchanged (provider {report['provider']} -> {report['base_url']})")
    lines += [
        "Use it:",
        f"  export {report['key_env']}=<the API key>    # {where}",
        f"  pi --model {report['model']}",
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    return EXIT_OK


def _pi_changes(report: dict[str, Any], unchanged: str) -> list[str]:
    if not report["changed"]:
        return [f"Pi config in {report['dir']}: {unchanged}"]
    lines = [f"Pi config in {report['dir']}:"]
    lines += [f"  {change}" for change in report["changes"]]
    lines += [f"  backup: {backup}" for backup in report["backups"]]
    return lines


def _cmd_pi_uninstall(args: argparse.Namespace) -> int:
    report = pi_agent.uninstall(_pi_provider(args))
    if args.json:
        _emit_json(report)
    else:
        sys.stdout.write("\n".join(_pi_changes(report, "nothing to remove")) + "\n")
    return EXIT_OK


def _cmd_pi_status(args: argparse.Namespace) -> int:
    report = pi_agent.status(_pi_provider(args))
    if args.json:
        _emit_json(report)
    else:
        sys.stdout.write(_render_pi_status(report))
    return EXIT_OK


def _render_pi_status(report: dict[str, Any]) -> str:
    agent = report["pi"]
    lines = [
        f"Pi: {agent['path']} ({agent['package'] or 'unknown package'})"
        if agent["path"]
        else "Pi: not on PATH (run `reconciler pi install`)"
    ]
    lines.append(f"config: {report['dir']}")
    if report["error"]:
        lines.append(f"  ! {report['error']}")
    elif not report["configured"]:
        lines.append(f"  provider {report['provider']}: not configured (run `reconciler pi install`)")
    else:
        key = report["key_env"]
        state = "set" if report["key_env_set"] else "NOT set"
        lines.append(
            f"  provider {report['provider']}: {report['base_url']}, models {', '.join(map(str, report['models']))}"
        )
        lines.append(f"  key: ${key} ({state} in this shell)" if key else "  key: not from an environment variable")
        lines.append(f"  extension: {report['extension']}")
    enabled = report["enabled_models"]
    lines.append(f"  enabledModels: {', '.join(enabled) if enabled else '(no list: every model)'}")
    default = "/".join(part or "-" for part in report["default"])
    lines.append(f"  default model: {default}")
    return "\n".join(lines) + "\n"


# --- running at boot ------------------------------------------------------------------------


def _add_install_service(commands: Any) -> None:
    install = commands.add_parser(
        "install-service",
        help=f"run `reconciler run` at boot: write {service.UNIT_DIR / service.UNIT_NAME}, enable and start it",
    )
    _spec_option(install)
    install.add_argument("--user", help="the service's user (default: the invoking user, under sudo $SUDO_USER)")
    install.add_argument("--dry-run", action="store_true", help="print the unit for this machine; change nothing")
    _json_option(install)
    install.set_defaults(handler=_cmd_install_service)


def _cmd_install_service(args: argparse.Namespace) -> int:
    settings = service.settings_for(args.spec or default_spec_path(), args.user)
    report = service.install(settings, dry_run=args.dry_run)
    if args.json:
        _emit_json(report.to_dict())
        return EXIT_OK
    for warning in report.warnings:
        sys.stderr.write(f"warning: {warning}\n")
    sys.stdout.write(service.render_report(report))
    return EXIT_OK
