"""What the loop is doing, as the head keeps it: STATE_DIR/loop-status.json.

Written by `reconciler run` after every pass; its `pass` entry, while a pass runs (the loop's or
a manual `apply`'s), every few seconds by that pass: the step, its bytes, rate and ETA. Read by
`reconciler status` and by anyone looking at the head. A file of its own so that `status` can
read it without the loop, and the loop can write it without the commands. Each writer replaces
only its own entries, and always the whole file by a rename: a reader never sees half of it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reconciler.errors import UntrustedFileError
from reconciler.fsutil import read_bounded, write_private
from reconciler.nodeside.statedir import StateDir
from reconciler.progress import printable
from reconciler.redact import redact
from reconciler.spec import Deployment


@dataclass
class LoopStatus:
    """What the loop is doing, for STATUS=, the journal and `reconciler status`."""

    condition: str = "starting"
    spec_error: str | None = None
    last_pass: str | None = None
    failures: int = 0
    next_try: str | None = None
    liveness_failures: int = 0
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        """The one line for STATUS= and the journal."""
        return self.condition + (f" | {self.spec_error}" if self.spec_error else "")


def status_path(deployment: Deployment) -> Path:
    return Path(StateDir(deployment.state_dir).expanded().loop_status)


def write_status(deployment: Deployment, status: LoopStatus) -> None:
    """The loop's entries; the pass entry stays as the pass left it."""
    _update(deployment, asdict(status), durable=True)


def write_pass(deployment: Deployment, state: dict[str, Any] | None) -> None:
    """The pass under way (None: none is). Not fsynced: it is rewritten every few seconds, and a
    power cut ends the pass it describes anyway."""
    _update(deployment, {"pass": state}, durable=False)


def _update(deployment: Deployment, entries: dict[str, Any], *, durable: bool) -> None:
    path = status_path(deployment)
    current = _load(path) or {}
    current.update(entries)
    write_private(path, redact(json.dumps(current, indent=2)) + "\n", durable=durable)


def read_status(deployment: Deployment) -> dict[str, Any] | None:
    """The file as written, but a pass whose process is gone (killed mid-pass) is no longer in progress."""
    loaded = _load(status_path(deployment))
    if loaded is not None and isinstance(loaded.get("pass"), dict) and not _alive(loaded["pass"].get("pid")):
        loaded["pass"] = None
    return loaded


def _load(path: Path) -> dict[str, Any] | None:
    try:
        loaded = json.loads(read_bounded(path, limit=1024 * 1024))
    except (UntrustedFileError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def _alive(pid: object) -> bool:
    """Whether the process that wrote a pass still runs (the file is this machine's)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user
        return True
    return True


# The pass's line joins every step under way; the other entries are short.
_MAX_SHOWN = 1000


def render(loop: dict[str, Any] | None) -> list[str]:
    """The loop's lines of `reconciler status`: its condition, a spec error, the pass under way.

    Each entry is one printable line: the file quotes nodes (a failure's message, a log line).
    """
    if not loop:
        return []
    lines: list[str] = []
    if "condition" in loop:
        lines.append(f"  loop: {_shown(loop['condition'])} (last pass {_shown(loop.get('last_pass')) or 'none yet'})")
    if loop.get("spec_error"):
        lines.append(f"  loop: spec error: {_shown(loop['spec_error'])}")
    current = loop.get("pass")
    if isinstance(current, dict) and isinstance(current.get("line"), str):
        by, updated = _shown(current.get("by")) or "?", _shown(current.get("updated")) or "?"
        lines.append(f"  {_shown(current['line'])} ({by}, updated {updated})")
    return lines


def _shown(value: object) -> str:
    return printable(str(value), _MAX_SHOWN).strip() if value else ""
