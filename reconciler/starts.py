"""How long each group start took, phase by phase, kept on the machine running the reconciler.

A group start that became ready (its wait-ready step done) is recorded from the steps the same
converge ran: each phase's wall time, from the first of its steps starting to the last ending.
Steps of a pipelined checkpoint group overlap (a file is copied while the next downloads), so
phases may add up to more than the whole. "Ready after start" runs from the first rank's
container start to the API's readiness: the time the API is down in a restart, the figure
owners compare. The newest KEEP records stay in `STATE_DIR/starts.json`; `status` shows the
last beside the one before, the metrics carry the last.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reconciler.actions import Action, StartRank, Step, StopRank
from reconciler.clock import parse_utc_iso, utc_iso
from reconciler.components.ranks import REBOOTED, RESUMING
from reconciler.errors import UntrustedFileError
from reconciler.fsutil import read_bounded, write_private
from reconciler.nodeside.statedir import StateDir

NAME = "starts.json"
KEEP = 20
# Longer than any start could take (a week): a larger figure is no duration we wrote.
MAX_SECONDS = 7 * 86_400
MAX_FILE_BYTES = 1024 * 1024

# The phases in the order a first start runs them (a restart drains and stops first).
PHASES: dict[Step, str] = {
    Step.PULL: "image_pull",
    Step.FETCH_IMAGE: "image_pull",
    Step.COPY_IMAGE: "image_pull",
    Step.DOWNLOAD: "checkpoint_download",
    Step.REASSEMBLE: "checkpoint_download",
    Step.COPY: "checkpoint_copy",
    Step.VERIFY: "checkpoint_verify",
    Step.DRAIN: "drain",
    Step.STOP_RANK: "stop",
    Step.START_RANK: "container_start",
    Step.WAIT_READY: "engine_load",
    Step.SMOKE: "smoke",
}

# (action, started, ended): monotonic seconds of each step done.
Span = tuple[Action, float, float]


def start_record(spans: Sequence[Span]) -> dict[str, Any] | None:
    """The record of the group start among these steps, or None when no start became ready."""
    ready = [end for action, _, end in spans if action.step is Step.WAIT_READY]
    starts = [span for span in spans if span[0].step is Step.START_RANK]
    if not ready or not starts:
        return None
    phased = [(PHASES[action.step], begin, end) for action, begin, end in spans if action.step in PHASES]
    phases: dict[str, float] = {}
    for phase in dict.fromkeys(name for name, _, _ in phased):
        mine = [(begin, end) for name, begin, end in phased if name == phase]
        phases[phase] = round(max(end for _, end in mine) - min(begin for begin, _ in mine), 2)
    first_start = min(begin for _, begin, _ in starts)
    return {
        "at": utc_iso(),
        "cause_kind": _cause_kind([action for action, _, _ in spans]),
        "ready_s": round(max(ready) - first_start, 2),
        "total_s": round(max(end for _, _, end in phased) - min(begin for _, begin, _ in phased), 2),
        "phases": phases,
    }


def _cause_kind(actions: list[Action]) -> str:
    """A start answering a failure, a restart the owner asked for, or a start of a group that ran not."""
    for action in actions:
        # The restart's first action carries the failure: a stop when a rank still ran, else a start.
        if isinstance(action.payload, StartRank | StopRank) and action.payload.unplanned is not None:
            return restart_cause(action.payload.unplanned, planned=False)
    restarted = any(action.step is Step.STOP_RANK for action in actions)
    replaced = any(action.step is Step.START_RANK and action.verb == "replace" for action in actions)
    return "planned" if restarted or replaced else "start"


def restart_cause(cause: str, *, planned: bool) -> str:
    """The kind of failure an unplanned restart answers, from the cause the plan wrote."""
    if planned:
        return "planned"
    if cause.startswith("liveness:"):
        return "liveness"
    if cause.startswith(RESUMING):  # its text may quote the failure it was resuming from
        return "unfinished_start"
    if REBOOTED in cause:
        return "reboot"
    return "rank_exit"


def starts_path(state_dir: str) -> Path:
    return Path(StateDir(state_dir).expanded().root) / NAME


def read_starts(path: Path) -> list[dict[str, Any]]:
    """The records, oldest first; an unreadable or foreign file reads as none (it is only history)."""
    with contextlib.suppress(OSError, UntrustedFileError, ValueError, RecursionError):
        loaded = json.loads(read_bounded(path, limit=MAX_FILE_BYTES))
        if isinstance(loaded, list):
            return [item for item in loaded if _is_record(item)]
    return []


def _is_record(item: object) -> bool:
    """A record as keep_start writes it: anything else in the file (edited, or not ours) is left
    out, so that nothing in it can reach a terminal or fail the arithmetic."""
    if not isinstance(item, dict) or not isinstance(item.get("at"), str) or not isinstance(item.get("phases"), dict):
        return False
    known = set(PHASES.values())
    return (
        parse_utc_iso(item["at"]) is not None
        and _seconds(item.get("ready_s"))
        and all(name in known and _seconds(value) for name, value in item["phases"].items())
    )


def _seconds(value: object) -> bool:
    """A duration as written: a finite number of seconds (no bool, NaN or Infinity)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < MAX_SECONDS


def keep_start(path: Path, record: dict[str, Any]) -> None:
    """Append a record, the newest KEEP kept; a file that cannot be written loses this one only."""
    kept = [*read_starts(path), record][-KEEP:]
    with contextlib.suppress(OSError):
        write_private(path, json.dumps(kept, indent=1) + "\n")


def duration_text(seconds: float) -> str:
    """11m02s, 48s, 1h05m."""
    whole = round(seconds)
    if whole >= 3600:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    if whole >= 60:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole}s"


def summary(records: list[dict[str, Any]]) -> str | None:
    """`ready 11m02s after start (engine_load 10m40s, smoke 12s); previous 10m48s`, or None."""
    if not records:
        return None
    last = records[-1]
    phases = ", ".join(f"{name} {duration_text(seconds)}" for name, seconds in last["phases"].items())
    line = f"ready {duration_text(last['ready_s'])} after start ({phases}) at {last['at']}"
    if len(records) > 1:
        line += f"; previous {duration_text(records[-2]['ready_s'])}"
    return line


# A first start of the group on Sparks: 11-13 minutes from container start to ready.
REFERENCE_READY = "11-13 minutes (a first start on Sparks; none recorded here yet)"


def downtime(restarting: bool, records: list[dict[str, Any]]) -> str:
    """What a plan that starts the group means for the API, from the last start recorded here."""
    expected = (
        f"about {duration_text(records[-1]['ready_s'])} (the last start recorded here)" if records else REFERENCE_READY
    )
    return f"The API is down for {expected}." if restarting else f"The API answers {expected} after the ranks start."
