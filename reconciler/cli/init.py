"""`reconciler init` on the command line: its options, and rendering what init did.

Its heavy imports (paramiko, the probe, the spec model) load only when init runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler.cli.common import EXIT_OK, emit_json, warn
from reconciler.constants import DEFAULT_SPEC_PATH, SCHEMA_PATH, default_spec_path
from reconciler.errors import ReconcilerError

if TYPE_CHECKING:
    from reconciler.init import Draft, InitRequest, Probed


def cmd_init(args: argparse.Namespace) -> int:
    from reconciler import init

    out = _checked_out(args.out)
    _refuse_existing(out)
    _check_writable(out)
    request = _request(args)
    init.check_distinct(request)
    probed = init.probe_nodes(request)
    drafted = init.draft(request, probed, schema_ref=_schema_ref(out))
    loaded = init.validated(drafted.text, str(out))
    _write(out, drafted.text)
    same = os.path.abspath(out) == os.path.abspath(default_spec_path())  # then the next steps need no --spec
    steps = init.next_steps("" if same else f" --spec {out}")
    if args.json:
        emit_json({**_report(out, drafted, probed, steps), "warnings": [w.to_dict() for w in loaded.warnings]})
        return EXIT_OK
    warn(loaded)
    sys.stdout.write(_render(out, drafted, probed, steps))
    return EXIT_OK


def _write(out: Path, text: str) -> None:
    """Whole or not at all; a spec holds no secret, so it is readable like any config (0644)."""
    from reconciler.fsutil import atomic_write

    _refuse_existing(out)  # again: probing takes a while, and someone may have written it since
    try:
        atomic_write(str(out), text.encode("utf-8"), 0o644)
    except OSError as exc:
        raise ReconcilerError(f"cannot write {out}: {exc.strerror or exc}", "give --out a writable path") from None


def _checked_out(text: str) -> Path:
    """--out as a file path; an empty one would mean the current directory."""
    if not text.strip():
        raise ReconcilerError("--out is empty", f"give the spec file to write, e.g. --out {DEFAULT_SPEC_PATH}")
    out = Path(text)
    if text.endswith("/") or out.is_dir():
        raise ReconcilerError(
            f"--out {text!r} names a directory", f"give the spec file to write, e.g. --out {out / 'deployment.yaml'}"
        )
    return out


def _check_writable(out: Path) -> None:
    """Before probing, which takes a while: the write creates missing parent directories, so the
    nearest one that exists must be a directory this user may create entries in."""
    parent = out.absolute().parent
    existing = next(directory for directory in (parent, *parent.parents) if directory.exists())
    if not existing.is_dir():
        raise ReconcilerError(
            f"cannot write {out}: {existing} is not a directory", "give --out a path under a directory"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        what = f"cannot write {out}" if existing == parent else f"cannot create {parent} for {out}"
        raise ReconcilerError(
            f"{what}: {existing} is not writable by this user",
            f"write elsewhere with --out PATH, or make {existing} writable (or create {parent}) first",
        )


def _refuse_existing(out: Path) -> None:
    if out.exists() or out.is_symlink():
        raise ReconcilerError(
            f"{out} exists; init never overwrites a spec",
            f"move it aside (mv {out} {out}.old) or write elsewhere with --out PATH",
        )


def _request(args: argparse.Namespace) -> InitRequest:
    from reconciler import init
    from reconciler.spec import SshTarget

    def target(text: str, option: str) -> SshTarget:
        return init.ssh_target(
            text,
            option,
            port=args.ssh_port,
            identity_file=_absolute(args.identity_file),
            known_hosts=_absolute(args.known_hosts),
        )

    head = target(args.head, "--head") if args.head is not None else None
    workers = tuple(target(text, "--worker") for text in args.worker)
    model_dir = init.checked_model_dir(args.model_dir) if args.model_dir is not None else init.DEFAULT_MODEL_DIR
    return init.InitRequest(head=head, workers=workers, model_dir=model_dir)


def _absolute(path: str | None) -> str | None:
    """A path given relative to here becomes absolute: the spec is read from other directories."""
    if path is None or path.startswith(("/", "~")):
        return path
    return os.path.abspath(path)


def _schema_ref(out: Path) -> str | None:
    """The editor modeline's schema: the one this reconciler ships, wherever it is installed.

    A spec written inside the checkout the reconciler runs from points at the checkout's
    schemas/ by a relative path, as the committed specs do: it stays right when the checkout is
    moved or cloned, and a committed spec must not carry one machine's absolute path. Anywhere
    else (a pip or pipx install, a spec outside the checkout) it is the package's own copy as a
    file:// URI, which the YAML language server reads as it is; a bare path with a space in it
    would be cut there, a URI has none. None when the package carries no readable schema."""
    from reconciler.spec.schema import shipped_schema

    shipped = shipped_schema()
    if shipped is None:
        return None
    shipped = shipped.resolve()
    checkout = shipped.parents[2]  # <checkout>/reconciler/data/deployment.schema.json
    directory = out.absolute().parent.resolve()
    if (checkout / SCHEMA_PATH).is_file() and directory.is_relative_to(checkout):
        return os.path.relpath(checkout / SCHEMA_PATH, directory)
    return shipped.as_uri()


def _report(out: Path, drafted: Draft, probed: list[Probed], steps: list[str]) -> dict[str, object]:
    nodes = []
    for name, item in zip(drafted.names, probed, strict=True):
        facts = item.facts
        fabric = facts.fabric
        nodes.append(
            {
                "name": name,
                "role": item.role,
                "ssh": None if item.target is None else item.target.model_dump(exclude_unset=True),
                "route": None if item.route is None else item.route.describe(),
                "hostname": facts.hostname,
                "home": facts.home,
                "user": item.user,
                "fabric": {
                    "ifname": fabric.ifname,
                    "ip": fabric.ip,
                    "prefixlen": fabric.prefixlen,
                    "hcas": fabric.hcas,
                },
                "disk_free": facts.checkpoint.disk_free,
                "memory": facts.memory.model_dump() if facts.memory else None,
            }
        )
    review = [note.to_dict() for note in drafted.notes]
    return {"ok": True, "path": str(out), "nodes": nodes, "review": review, "next": steps}


def _render(out: Path, drafted: Draft, probed: list[Probed], steps: list[str]) -> str:
    lines = [f"Probed {len(probed)} nodes:"]
    for name, item in zip(drafted.names, probed, strict=True):
        fabric = item.facts.fabric
        where = "this machine" if item.target is None else item.target.login
        found = f"{fabric.ifname} {fabric.ip}" if fabric.ifname and fabric.ip else "fabric undecided"
        lines.append(f"  {name:<16} {item.role:<7} {where:<24} {found}")
    lines.append(f"Wrote {out}.")
    if drafted.notes:
        lines.append(f"Review before applying ({len(drafted.notes)}, marked REVIEW in the file):")
        lines += [f"  {note.where}: {note.message}" for note in drafted.notes]
    lines.append("Next:")
    lines += [f"  {step}" for step in steps]
    return "\n".join(lines) + "\n"
