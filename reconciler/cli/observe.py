"""Handlers that look without changing anything: status (once or --watch) and doctor."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from reconciler.cli.common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_NOT_CONVERGED, EXIT_OK, emit, emit_json, load

Report = dict[str, Any]
CLEAR_SCREEN = "\x1b[H\x1b[2J"


def status(args: argparse.Namespace) -> int:
    from reconciler import commands

    deployment = load(args).deployment
    with commands.session(deployment) as transports:
        if args.watch is None:
            report = commands.status(deployment, transports, probe=args.probe)
            _show(report, as_json=args.json, watching=False)
            return exit_code(report)
        try:
            while True:
                _show(commands.status(deployment, transports, probe=args.probe), as_json=args.json, watching=True)
                time.sleep(args.watch)
        except KeyboardInterrupt:  # the way a watch ends: nothing was interrupted that needs redoing
            return EXIT_INTERRUPTED


def exit_code(report: Report) -> int:
    return EXIT_OK if report["converged"] else EXIT_NOT_CONVERGED


def _show(report: Report, *, as_json: bool, watching: bool) -> None:
    if as_json and watching:
        sys.stdout.write(json.dumps(report) + "\n")  # one object per line, for a script reading along
    elif as_json:
        emit_json(report)
    else:
        clear = CLEAR_SCREEN if watching and sys.stdout.isatty() else ""
        sys.stdout.write(clear + render_status(report) + ("\n" if watching else ""))
    sys.stdout.flush()


def render_status(report: Report) -> str:
    from reconciler import starts

    lines = [f"deployment {report['deployment']}: {_verdict(report)}"]
    lines += _loop_lines(report.get("loop"))
    lines += ["", *_table(report)]
    steps = _next_steps(report)
    lines += ["", "next step of each component:", *steps] if steps else []
    lines.append("")
    lines.append(f"api: {report['api']} (the front)")
    if report.get("tls_fingerprint"):
        lines.append(f"tls: sha256 fingerprint {report['tls_fingerprint']}")
    lines.append(f"health: {report['health'] if report['health'] is not None else 'no answer'}")
    if report.get("liveness") is not None:
        verdict = "ok" if report["liveness"]["ok"] else "FAILED"
        lines.append(f"liveness: {verdict}: {report['liveness']['detail']}")
    lines += [f"! {condition}" for condition in report["conditions"]]
    lines += _host_lines(report)
    started = starts.summary(report.get("starts") or [])
    if started:
        lines.append(f"last start: {started}")
    last = report.get("last_incident")
    if last:
        lines.append(f"last incident: {last['id']} ({last['kind']}, {last['at']}): {last['cause'][:200]}")
        lines.append(f"  `reconciler incidents show {last['id']}` for its logs, facts and plan")
    return "\n".join(lines) + "\n"


def _verdict(report: Report) -> str:
    """Converged, or what keeps it from saying so: nodes it cannot see, steps to run, blocked parts."""
    if report["converged"]:
        return "converged"
    nodes = report["nodes"].values()
    unknown = [name for name, node in report["nodes"].items() if not node["reachable"]]
    if unknown:
        return f"UNKNOWN: {', '.join(unknown)} not answering"
    pending = sum(sum(node.get("pending_steps", {}).values()) for node in nodes)
    if pending:
        return f"NOT converged ({pending} step{'s' if pending != 1 else ''} pending)"
    return "NOT converged (nothing can be planned: see the conditions below)"


def _host_lines(report: Report) -> list[str]:
    """Each node's kernel, driver, Docker and toolkit, and what changed under a running rank."""
    lines = []
    for name, node in report["nodes"].items():
        host = node.get("host") or {}
        if not any(host.values()):
            continue
        parts = [
            f"{label} {host[key]}"
            for key, label in (("kernel", "kernel"), ("driver", "driver"), ("docker", "Docker"), ("toolkit", "toolkit"))
            if host.get(key)
        ]
        boot = f", boot {host['boot_id'][:8]}" if host.get("boot_id") else ""
        lines.append(f"host {name}: {', '.join(parts)}{boot}")
        lines += [f"! {name}: {change}" for change in node.get("host_changes", [])]
    return lines


def events(args: argparse.Namespace) -> int:
    from reconciler import events as history

    deployment = load(args).deployment
    path = history.history_path(deployment.state_dir)
    found = history.follow(path, args.since) if args.follow else iter(history.read_events(path, args.since))
    if args.json and not args.follow:
        emit_json({"events": list(found), "file": str(path)})
        return EXIT_OK
    for event in found:
        sys.stdout.write((json.dumps(event) if args.json else _event_line(event)) + "\n")
        sys.stdout.flush()
    return EXIT_OK


def _event_line(event: Report) -> str:
    """One event as a line: when, what, and its fields."""
    from reconciler.progress import printable

    fields = " ".join(f"{key}={value}" for key, value in event.items() if key not in {"at", "kind"})
    return printable(f"{event['at']} {event['kind']:<9} {fields}", 400)


def incidents(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from reconciler import incidents as records
    from reconciler.errors import ReconcilerError

    deployment = load(args).deployment
    if args.which is None:
        found = records.list_incidents(deployment)
        where = str(records.incidents_dir(deployment))
        emit(
            args.json,
            {"incidents": [asdict(item) for item in found], "dir": where},
            lambda: _render_incidents(found, where),
        )
        return EXIT_OK
    if not args.id:
        raise ReconcilerError("`incidents show` needs an ID", "`reconciler incidents` lists them")
    incident, files = records.show(deployment, args.id)
    emit(args.json, {"incident": asdict(incident), "files": files}, lambda: _render_incident(asdict(incident), files))
    return EXIT_OK


def _render_incidents(found: list[Any], where: str) -> str:
    if not found:
        return f"no incidents recorded (under {where})\n"
    lines = [f"{item.id}  {item.kind:<13} {item.cause[:120]}" for item in found]
    return "\n".join([*lines, f"({len(found)} under {where}; `reconciler incidents show ID` prints one)"]) + "\n"


def _render_incident(incident: Report, files: dict[str, str]) -> str:
    lines = [f"incident {incident['id']}: {incident['kind']} at {incident['at']}", f"  {incident['cause']}", ""]
    for rank in incident["ranks"]:
        state = ", ".join(f"{key} {value}" for key, value in rank.items() if key not in {"rank", "node", "container"})
        lines.append(f"  r{rank['rank']} {rank['container']} on {rank['node']}: {state}")
    lines += [f"  note: {note}" for note in incident.get("notes", [])]
    for name, text in files.items():
        if name.endswith(".log"):
            lines += ["", f"==== {name} (last lines)", *text.splitlines()[-40:]]
    lines += ["", f"files: {', '.join(incident['files'])} (facts.json and plan.json in full with --json)"]
    return "\n".join(lines) + "\n"


def _loop_lines(loop: Report | None) -> list[str]:
    from reconciler import loopstatus

    if not loop:
        return ["loop: not running here (no loop status; `reconciler install-service` runs it at boot)"]
    return [line.strip() for line in loopstatus.render(loop)]


# The table fits 100 columns: containers without the deployment's prefix (the first line names
# it), memory as the free amount, a hold and a trip without their times (the conditions and the
# incident line below have them).
TABLE_HEADER = ("NODE", "RANK", "CONTAINERS", "STATE", "MEM FREE", "GUARD", "SYNC")


def _table(report: Report) -> list[str]:
    prefix = f"{report['deployment']}-"
    rows = [TABLE_HEADER, *(_row(name, node, prefix) for name, node in report["nodes"].items())]
    widths = [max(len(row[column]) for row in rows) for column in range(len(TABLE_HEADER))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]


def _row(name: str, node: Report, prefix: str) -> tuple[str, str, str, str, str, str, str]:
    if not node["reachable"]:  # nothing of it is known: no container, guard or sync to claim
        return (name, f"r{node['rank']}", "?", "UNKNOWN", "-", "?", "? (see below)")
    shown = (f"{c['name'].removeprefix(prefix)} {c['status']}{_exit(c)}" for c in node["containers"])
    containers = ", ".join(shown) or "none"
    memory = f"{node['mem_available_gib']:.1f} GiB" if node["mem_available_gib"] is not None else "-"
    return (name, f"r{node['rank']}", containers, _state(node), memory, _guard(node["guard"]), _sync(node))


def _state(node: Report) -> str:
    return "held" if node["hold"] else "reachable"


def _guard(guard: Report) -> str:
    if guard["trip"]:
        return "TRIPPED"
    return "running" if guard["running"] else "not running"


def _sync(node: Report) -> str:
    steps = sum(node.get("pending_steps", {}).values())
    blocked = [name for name, state in node["components"].items() if state.startswith("blocked")]
    parts = [f"{steps} step{'s' if steps != 1 else ''} pending"] if steps else []
    parts += [f"{', '.join(blocked)} blocked"] if blocked else []
    return "; ".join(parts) or "in sync"


def _exit(container: Report) -> str:
    return f" (exit {container['exit_code']})" if container["exit_code"] is not None else ""


def _next_steps(report: Report) -> list[str]:
    """Only what is not in sync: the step each component waits on, on which node. A node that
    does not answer has one line, among the conditions, not one per component."""
    return [
        f"  {component} on {name}: {state}"
        for name, node in report["nodes"].items()
        if node["reachable"]
        for component, state in sorted(node["components"].items())
        if not state.startswith("in sync")
    ]


def doctor(args: argparse.Namespace) -> int:
    from reconciler import commands, doctor

    deployment = load(args).deployment
    with commands.session(deployment) as transports:
        report = doctor.run(deployment, transports)
    emit(args.json, report.to_dict(), lambda: doctor.render_text(report))
    return EXIT_ERROR if report.failed else EXIT_OK
