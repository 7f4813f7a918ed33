"""Handlers for the owner's housekeeping and the way out: rotate-key, storage, uninstall."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler.cli.common import EXIT_ERROR, EXIT_OK, ask, emit, emit_json, load, spec_path, warn
from reconciler.errors import ReconcilerError

if TYPE_CHECKING:
    from reconciler.spec import Deployment


def rotate_key(args: argparse.Namespace) -> int:
    from reconciler import commands, lifecycle
    from reconciler.execution import Progress

    loaded = load(args)
    warn(loaded)
    deployment = loaded.deployment
    question = (
        f"a new API key replaces the one in {deployment.key_file()} on {deployment.head.name}: every client "
        "holding the old key is refused from then on"
    )
    if not ask(question, args.yes):
        return EXIT_ERROR
    with commands.session(deployment) as transports:
        outcome = lifecycle.rotate_key(deployment, transports, Progress())
    front = [action.summary for action, _, _ in outcome.result.done]
    pending = lifecycle.front_pending(outcome)
    ok = not pending
    if args.json:
        emit_json({"ok": ok, "key_file": deployment.key_file(), "front": front, "front_pending": pending})
        return EXIT_OK if ok else EXIT_ERROR
    lines = [f"A new API key is in {deployment.key_file()} on {deployment.head.name} (mode 0600, never printed)."]
    lines.append(
        "The front took it; the ranks kept serving." if ok else "The front still has to take it: " + "; ".join(pending)
    )
    lines += _client_hints(deployment)
    sys.stdout.write("\n".join(lines) + "\n")
    return EXIT_OK if ok else EXIT_ERROR


def _client_hints(deployment: Deployment) -> list[str]:
    """How clients get the new key: Pi reads it from an environment variable we never set."""
    from reconciler.constants import PI_KEY_ENV
    from reconciler.facts.pi import pi_status

    key_env = PI_KEY_ENV
    if deployment.pi.enabled:
        key_env = str(pi_status(deployment.pi.provider).get("key_env") or PI_KEY_ENV)
    read = f"cat {deployment.key_file()}"
    if deployment.head.ssh is not None:
        read = f"ssh {deployment.head.ssh.login} {read}"
    return [
        "Give clients the new key. For Pi, in each shell (or where you set it, e.g. ~/.bashrc):",
        f'  export {key_env}="$({read})"',
    ]


def storage(args: argparse.Namespace) -> int:
    from reconciler import commands, lifecycle
    from reconciler.lock import deployment_lock

    loaded = load(args)
    warn(loaded)
    deployment = loaded.deployment
    with commands.session(deployment) as transports:
        items = lifecycle.storage(deployment, transports)
        releasable = [item for item in items if item.releasable]
        if not (args.release and releasable):
            emit(
                args.json, {"ok": True, "items": [i.to_dict() for i in items]}, lambda: lifecycle.render_storage(items)
            )
            return EXIT_OK
        if not args.json:
            sys.stdout.write(lifecycle.render_storage(items))
        what = ", ".join(f"{item.node}: {item.what}" for item in releasable)
        if not ask(f"release {len(releasable)} item{'s' if len(releasable) != 1 else ''} ({what})", args.yes):
            return EXIT_ERROR
        with deployment_lock(deployment, "reconciler storage --release", wait_s=600, on_wait=_say):
            # Measured again under the lock: what a pass or an edit changed since the question stays.
            now = lifecycle.storage(deployment, transports)
            released, failed = lifecycle.release(deployment, transports, now, items)
    if args.json:
        emit_json(
            {
                "ok": not failed,
                "items": [item.to_dict() for item in now],
                "released": [item.to_dict() for item in released],
                "failed": failed,
            }
        )
    else:
        sys.stdout.write(lifecycle.render_storage(now, released))
        sys.stdout.write("".join(f"  ! {line}\n" for line in failed))
    return EXIT_ERROR if failed else EXIT_OK


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")


def refuse_sudo() -> None:
    """Uninstall runs as the owner: `~` in the spec, the SSH keys and agent, Pi's config are
    theirs. Root is asked (through sudo) for the boot service alone."""
    import os

    user = os.environ.get("SUDO_USER")
    if os.geteuid() == 0 and user and user != "root":
        raise ReconcilerError(
            f"run uninstall as {user}, not under sudo: the spec's paths, the SSH keys and Pi's config are theirs",
            "run `reconciler uninstall` without sudo; it asks sudo for the boot service alone",
        )


def uninstall(args: argparse.Namespace) -> int:
    from reconciler import commands, lifecycle, service

    refuse_sudo()
    path = spec_path(args.spec)
    loaded = load(args)
    deployment = loaded.deployment
    with commands.session(deployment) as transports:
        planned = lifecycle.uninstall_plan(
            deployment, transports, path, checkpoint=args.checkpoint, unit_dir=Path(service.UNIT_DIR)
        )
        if args.dry_run or not planned.removals:
            if args.json:
                emit_json({"ok": True, "dry_run": args.dry_run, **planned.to_dict(), "removed": []})
            else:
                sys.stdout.write(lifecycle.render_uninstall_plan(planned))
            return EXIT_OK
        if not args.json:
            sys.stdout.write(lifecycle.render_uninstall_plan(planned))
        if not ask(f"uninstall removes the {len(planned.removals)} things listed above", args.yes):
            return EXIT_ERROR

        def say(line: str) -> None:
            if not args.json:
                sys.stdout.write(line + "\n")

        outcome = lifecycle.uninstall(deployment, transports, planned, spec_path=path, say=say)
    left = [f"{node}: not answering, nothing removed there" for node in planned.unreachable] + outcome.failed
    if args.json:
        removed = [r.to_dict() for r in outcome.done]
        emit_json({"ok": not left, "dry_run": False, **planned.to_dict(), "removed": removed, "left": left})
    else:
        summary = f"Uninstalled: {len(outcome.done)} removed." + "".join(f"\n  ! {line}" for line in left)
        hint = (
            "\n  hint: run `reconciler uninstall` again once that is fixed: it removes only what is left"
            if left
            else ""
        )
        sys.stdout.write(summary + hint + "\n")
    return EXIT_ERROR if left else EXIT_OK
