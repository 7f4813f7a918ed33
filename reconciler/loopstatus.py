"""What the loop is doing, as the head keeps it: STATE_DIR/loop-status.json.

Written by `reconciler run` after every pass (and during long ones); read by `reconciler status`
and by anyone looking at the head. A file of its own so that `status` can read it without the
loop, and the loop can write it without the commands.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reconciler.errors import UntrustedFileError
from reconciler.fsutil import read_bounded, write_private
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
    return Path(os.path.expanduser(deployment.state_dir)) / "loop-status.json"


def write_status(deployment: Deployment, status: LoopStatus) -> None:
    write_private(status_path(deployment), redact(json.dumps(asdict(status), indent=2)) + "\n")


def read_status(deployment: Deployment) -> dict[str, Any] | None:
    try:
        loaded = json.loads(read_bounded(status_path(deployment), limit=1024 * 1024))
    except (UntrustedFileError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None
