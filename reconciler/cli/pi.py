"""Handlers for the Pi coding agent on this machine: pi install, uninstall, status."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.cli.common import EXIT_OK, emit, emit_json, spec_path
from reconciler.constants import PI_PROVIDER

if TYPE_CHECKING:
    from reconciler.spec import Deployment


def _pi_spec(args: argparse.Namespace) -> Deployment | None:
    """The spec when one is given or found; Pi on a machine without one uses a two-node spec's defaults."""
    from reconciler.spec import load_spec

    path = spec_path(args.spec)
    if args.spec is None and not Path(path).exists():
        return None
    return load_spec(path).deployment


def _provider(deployment: Deployment | None) -> str:
    return deployment.pi.provider if deployment is not None else PI_PROVIDER


def _holding(deployment: Deployment | None, args: argparse.Namespace) -> Callable[[], AbstractContextManager[object]]:
    """The deployment's lock, which a converge holds while it configures Pi; none without a spec."""
    if deployment is None:
        return contextlib.nullcontext
    from reconciler.lock import deployment_lock

    doing = f"pi {args.pi_action}"
    return lambda: deployment_lock(deployment, doing, wait_s=args.wait, on_wait=_say)


def _say(line: str) -> None:
    sys.stderr.write(f"{line}\n")


def install(args: argparse.Namespace) -> int:
    from reconciler.pi import agent

    deployment = _pi_spec(args)
    target = agent.install_target(deployment, args.base_url, args.key_env, args.set_default)
    report = agent.install(target, _holding(deployment, args))
    if args.json:
        emit_json(report)
        return EXIT_OK
    where = f"the key file {deployment.key_file()} on {deployment.head.name}" if deployment else "the deployment's key"
    found = report["pi"]
    now = ", installed now" if found["installed_now"] else ""
    lines = [f"Pi: {found['path']} ({found['package'] or 'unknown package'}{now})"]
    lines += [f"  note: {note}" for note in report["notes"]]
    lines += _changes(report, f"unchanged (provider {report['provider']} -> {report['base_url']})")
    lines += [
        "Use it:",
        f"  export {report['key_env']}=<the API key>    # {where}",
        f"  pi --model {report['model']}",
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    return EXIT_OK


def _changes(report: dict[str, Any], unchanged: str) -> list[str]:
    if not report["changed"]:
        return [f"Pi config in {report['dir']}: {unchanged}"]
    lines = [f"Pi config in {report['dir']}:"]
    lines += [f"  {change}" for change in report["changes"]]
    lines += [f"  backup: {backup}" for backup in report["backups"]]
    return lines


def uninstall(args: argparse.Namespace) -> int:
    from reconciler.pi import agent

    deployment = _pi_spec(args)
    report = agent.uninstall(_provider(deployment), _holding(deployment, args))
    emit(args.json, report, lambda: "\n".join(_changes(report, "nothing to remove")) + "\n")
    return EXIT_OK


def status(args: argparse.Namespace) -> int:
    from reconciler.facts.pi import pi_status

    report = pi_status(_provider(_pi_spec(args)))
    emit(args.json, report, lambda: render_status(report))
    return EXIT_OK


def render_status(report: dict[str, Any]) -> str:
    found = report["pi"]
    lines = [
        f"Pi: {found['path']} ({found['package'] or 'unknown package'})"
        if found["path"]
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
