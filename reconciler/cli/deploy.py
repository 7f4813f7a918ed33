"""Handlers that read the spec and converge: validate, schema, plan, apply, run, facts, logs, stop, start.

Each imports the core it needs when it runs (see the package docstring), so `validate` loads the
spec model and nothing of SSH, Docker or the Hub.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler.cli.common import EXIT_CHANGES, EXIT_ERROR, EXIT_OK, ask, emit_json, load, spec_path, warn
from reconciler.errors import ReconcilerError

if TYPE_CHECKING:
    from reconciler import commands
    from reconciler.facts.node import Facts
    from reconciler.plan import Plan
    from reconciler.spec import Deployment, LoadedSpec


def validate(args: argparse.Namespace) -> int:
    loaded = load(args)
    if args.json:
        emit_json({"ok": True, "spec": loaded.path, "warnings": [w.to_dict() for w in loaded.warnings]})
        return EXIT_OK
    warn(loaded)
    deployment = loaded.deployment
    sys.stdout.write(f"{loaded.path}: valid ({len(deployment.nodes)} nodes, deployment {deployment.name})\n")
    return EXIT_OK


def schema(args: argparse.Namespace) -> int:
    from reconciler.fsutil import atomic_write

    text, default_out, command = _schema_document(args.markdown)
    if args.out == "-":
        sys.stdout.write(text)
        return EXIT_OK
    target = Path(args.out or default_out)
    if args.out:
        command += f" --out {args.out}"
    try:
        current = target.read_text(encoding="utf-8") if target.exists() else None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReconcilerError(f"cannot read {target}: {exc}", "give --out the schema file's path") from None
    if args.check:
        fresh = current == text
        if args.json:
            emit_json({"ok": fresh, "path": str(target)})
        elif not fresh:
            sys.stderr.write(f"error: {target} is stale\n  hint: run `{command}` and commit the result\n")
        return EXIT_OK if fresh else EXIT_ERROR
    try:
        atomic_write(str(target), text.encode("utf-8"), 0o644)
    except OSError as exc:
        raise ReconcilerError(
            f"cannot write {target}: {exc.strerror or exc}", "give --out a writable file path"
        ) from None
    if args.json:
        emit_json({"ok": True, "path": str(target), "changed": current != text})
    else:
        sys.stdout.write(f"wrote {target}{'' if current != text else ' (unchanged)'}\n")
    return EXIT_OK


def _schema_document(markdown: bool) -> tuple[str, str, str]:
    """The text `schema` writes, where it goes by default, and the command that writes it."""
    from reconciler.constants import SCHEMA_PATH, SPEC_DOC_PATH

    if markdown:
        from reconciler.spec.reference import reference_markdown

        return reference_markdown(), SPEC_DOC_PATH, "reconciler schema --markdown"
    from reconciler.spec import schema_text

    return schema_text(), SCHEMA_PATH, "reconciler schema"


def plan(args: argparse.Namespace) -> int:

    loaded = load(args)
    facts, result = _plan_from(args, loaded)
    if args.out is not None:
        from reconciler import savedplan

        saved = savedplan.saved(
            result,
            loaded.deployment,
            facts,
            update_revision=args.update_revision,
            accept_memory_risk=args.accept_memory_risk,
            spec_path=str(Path(loaded.path).resolve()),
        )
        savedplan.write(Path(args.out), saved)
        sys.stderr.write(f"saved the plan to {args.out}; run it with `reconciler apply {args.out}`\n")
    if args.json:
        warnings = [warning.to_dict() for warning in loaded.warnings]
        emit_json({**result.to_dict(), "api_outage": api_outage(loaded.deployment, result), "warnings": warnings})
    else:
        warn(loaded)
        sys.stdout.write(plan_text(loaded.deployment, result, verbose=args.verbose))
    if result.blockers and args.detailed_exitcode:
        return EXIT_ERROR
    if args.detailed_exitcode and result.has_changes:
        return EXIT_CHANGES
    return EXIT_OK


def _plan_from(args: argparse.Namespace, loaded: LoadedSpec) -> tuple[Facts, Plan]:
    """Offline from a facts file (no SSH, Docker or Hub loaded), or live from the nodes."""
    if args.facts is not None:
        from reconciler.facts.node import load_facts
        from reconciler.plan import plan as make_plan

        facts = load_facts(args.facts)
        return facts, make_plan(
            loaded.deployment,
            facts,
            update_revision=args.update_revision,
            accept_memory_risk=args.accept_memory_risk,
        )
    from reconciler import commands

    with commands.session(loaded.deployment) as transports:
        return commands.live_plan(
            loaded.deployment,
            transports,
            update_revision=args.update_revision,
            accept_memory_risk=args.accept_memory_risk,
        )


def _check_writable(path: Path) -> None:
    """`--events FILE` can be appended to (a script relies on it; the events are never worth a failed step)."""
    try:
        with path.open("a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise ReconcilerError(
            f"cannot write the events to {path}: {exc.strerror or exc}", "give --events a writable file path"
        ) from None


def apply(args: argparse.Namespace) -> int:
    from reconciler import commands, savedplan

    saved = None
    if args.plan_file is not None:
        if args.deep_verify or args.update_revision or args.accept_memory_risk:
            raise ReconcilerError(
                "a saved plan runs as it was made: --deep-verify, --update-revision and --accept-memory-risk "
                "do not apply to it",
                "plan again with the option (`reconciler plan --update-revision --out FILE`), or apply without a file",
            )
        path = Path(args.plan_file)
        saved = (savedplan.read(path), path)
        # The spec it was made from, unless --spec names another (which the check then refuses
        # if it is not the same spec).
        made_from = saved[0].spec_path
        if args.spec is None and made_from is not None and not Path(made_from).is_file():
            raise ReconcilerError(
                f"the saved plan {path} was made from {made_from}, which is not there (any more)",
                "name the spec it was made from with --spec",
            )
        args.spec = args.spec or made_from
    loaded = load(args)
    warn(loaded)
    deployment = loaded.deployment
    if args.events:
        _check_writable(Path(args.events))
    request = commands.Converge(
        doing="reconciler apply",
        wait_s=args.wait,
        deep_verify=args.deep_verify,
        update_revision=args.update_revision,
        accept_memory_risk=args.accept_memory_risk,
        events_file=Path(args.events) if args.events else None,
        saved=saved,
        show=(lambda _plan: None) if args.json else show_plan_of(deployment),
        confirm=(lambda _plan: True) if args.yes else confirm,
    )
    outcome = _converge(deployment, request)
    if args.json:
        emit_json(
            {
                "ok": not outcome.after.has_changes and not outcome.declined,
                "declined": outcome.declined,
                "plan": outcome.before.to_dict(),
                "replanned": outcome.replanned.to_dict() if outcome.replanned is not None else None,
                "applied": outcome.result.to_dict(),
                "remaining": outcome.after.to_dict(),
                "warnings": [warning.to_dict() for warning in loaded.warnings],
            }
        )
    else:
        sys.stdout.write(apply_summary(outcome))
    return EXIT_ERROR if outcome.declined or outcome.after.has_changes else EXIT_OK


def _converge(deployment: Deployment, request: commands.Converge) -> commands.ApplyOutcome:
    from reconciler import commands
    from reconciler.execution import Progress

    with commands.session(deployment) as transports:
        return commands.converge(deployment, transports, Progress(), request)


def api_outage(deployment: Deployment, result: Plan) -> str | None:
    """What the plan means for the API when it starts the group: from the starts recorded on this
    machine, else the reference's first start."""
    from reconciler import starts
    from reconciler.actions import Step

    if not any(action.step is Step.START_RANK for action in result.actions):
        return None
    restarting = any(action.verb == "replace" or action.step is Step.STOP_RANK for action in result.actions)
    return starts.downtime(restarting, starts.read_starts(starts.starts_path(deployment.state_dir)))


def plan_text(deployment: Deployment, result: Plan, *, verbose: bool = False) -> str:
    """The plan as `plan` and `apply` show it: its actions, counts, totals and what it means for the API."""
    from reconciler.plan import render_text

    outage = api_outage(deployment, result)
    return render_text(result, verbose=verbose) + (f"{outage}\n" if outage else "")


def show_plan_of(deployment: Deployment) -> Callable[[Plan], None]:
    def show(result: Plan) -> None:
        sys.stdout.write(plan_text(deployment, result))
        sys.stdout.flush()

    return show


def confirm(result: Plan) -> bool:
    """Ask before the disruptive or the expensive whenever someone can answer (stdin a terminal,
    whatever stdout is: `apply | tee log` still asks, on stderr). With nobody to ask (a script,
    a pipe, CI) such a plan needs `--yes`: automation is what the owner turns on (`--yes`, or
    the loop), never what a pipe implies. Declined, not failed: what an earlier round did stays
    reported, and nothing more runs."""
    from reconciler.plan import needs_confirmation

    reasons = needs_confirmation(result)
    if not reasons:
        return True
    return ask(
        f"this plan {'; '.join(reasons)}", False, doing="apply it", prompt="Do you want to perform these actions?"
    )


def apply_summary(outcome: commands.ApplyOutcome) -> str:
    from reconciler.plan import render_text

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


def run(args: argparse.Namespace) -> int:
    from reconciler.loop import Loop

    return Loop(spec_path(args.spec)).run()


def facts(args: argparse.Namespace) -> int:
    from reconciler import commands
    from reconciler.facts.gather import gather

    loaded = load(args)
    with commands.session(loaded.deployment) as transports:
        observed = gather(loaded.deployment, transports)
    sys.stdout.write(observed.to_json())
    return EXIT_OK


def logs(args: argparse.Namespace) -> int:
    from reconciler import commands

    deployment = load(args).deployment
    with commands.session(deployment) as transports:
        if args.which == "memguard":
            node = args.node or deployment.head.name
            if node not in transports:
                raise ReconcilerError(f"no node named {node} in the spec", f"use one of {', '.join(transports)}")
            for text in commands.guard_log(deployment, transports, node, tail=args.tail, follow=args.follow):
                sys.stdout.write(text)
                sys.stdout.flush()
            return EXIT_OK
        rank = rank_of(args.which, len(deployment.nodes))
        for chunk in commands.container_logs(deployment, transports, rank, tail=args.tail, follow=args.follow):
            sys.stdout.write(chunk.decode("utf-8", errors="replace"))
            sys.stdout.flush()
    return EXIT_OK


def rank_of(which: str, count: int) -> int:
    if which.startswith("r") and which[1:].isdigit() and int(which[1:]) < count:
        return int(which[1:])
    raise ReconcilerError(f"unknown log source '{which}'", f"use r0..r{count - 1} or memguard")


def stop(args: argparse.Namespace) -> int:
    from reconciler import commands

    deployment = load(args).deployment
    request = commands.Converge(doing="reconciler stop", wait_s=args.wait, first=commands.hold, blocked_is_error=False)
    outcome = _converge(deployment, request)
    unstopped = commands.ranks_still_running(deployment, outcome.facts)
    if args.json:
        emit_json({"ok": not unstopped, "held": True, "still_running": unstopped, "applied": outcome.result.to_dict()})
    elif unstopped:
        sys.stderr.write(
            f"error: held, but not stopped: {', '.join(unstopped)}\n"
            "  hint: the hold stays; run `reconciler stop` again once the node answers\n"
        )
    else:
        sys.stdout.write("stopped; ranks stay down until `reconciler start`\n")
    return EXIT_ERROR if unstopped else EXIT_OK


def start(args: argparse.Namespace) -> int:
    from reconciler import commands

    request = commands.Converge(doing="reconciler start", wait_s=args.wait, first=commands.release)
    outcome = _converge(load(args).deployment, request)
    converged = not outcome.after.has_changes
    if args.json:
        emit_json({"ok": converged, "applied": outcome.result.to_dict()})
    else:
        sys.stdout.write(apply_summary(outcome) or "already running\n")
    return EXIT_OK if converged else EXIT_ERROR
