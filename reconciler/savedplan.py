"""Saved plans: `plan --out FILE` writes exactly what `apply FILE` will run, or refuses to.

A saved plan holds the plan with every action's payload, a fingerprint of the spec it was made
from and a fingerprint of the facts it saw, part by part (each node's containers, checkpoint,
guard, ...). Applying it gathers the facts again and plans from them: planning is pure, so if
the deployment is as it was, that plan is the saved one, payloads and all, and the saved actions
run. If not (a rank was killed, a file changed, the spec was edited, or the file itself was), the
plan is stale and is refused, naming the parts of the facts that changed and how to plan again.
Facts that moved without changing the plan (memory, an unrelated image) do not make it stale.

The file holds no secret: payloads name the key file, never the key, and facts describe the key
file without its content.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from reconciler import __version__
from reconciler.clock import utc_iso
from reconciler.components import headroom
from reconciler.errors import ReconcilerError, StalePlanError, UntrustedFileError
from reconciler.facts.node import Facts
from reconciler.fsutil import atomic_write, read_bounded
from reconciler.plan import Plan
from reconciler.spec import Deployment

# Format 2: each step has a payload kind of its own (stop-rank, halt-rank, start-guard, ...).
# Format 3: a download names every file it fetches, each as the Hub listed it (its blob id too).
FORMAT = 3
MAX_SAVED_BYTES = 64 * 1024 * 1024
# Observations that move on their own and decide no action.
_VOLATILE_NODE_FIELDS = {"memory"}
# Within a node's sections: what moves while nothing changes (free disk, the guard's memory
# record, which grows every window).
_VOLATILE_SECTION_FIELDS = {"checkpoint": {"disk_free"}, "guard": {"windows", "window_s"}}


@dataclass(frozen=True)
class SavedPlan:
    plan: Plan
    spec: str
    facts: dict[str, str]
    created_at: str
    made_by: str
    # `plan --update-revision --out`: applying it plans the same way.
    update_revision: bool = False
    # `plan --accept-memory-risk --out`: likewise.
    accept_memory_risk: bool = False
    # The spec file it was made from (absolute): `apply FILE` reads that one unless told another.
    spec_path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "made_by": self.made_by,
            "created_at": self.created_at,
            "update_revision": self.update_revision,
            "accept_memory_risk": self.accept_memory_risk,
            "spec_path": self.spec_path,
            "spec_fingerprint": self.spec,
            "facts_fingerprint": self.facts,
            "plan": self.plan.to_dict(),
        }


def _digest(value: object) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def spec_fingerprint(deployment: Deployment) -> str:
    """The validated spec, not its text: comments and key order do not make a plan stale."""
    return _digest(deployment.model_dump(mode="json"))


def facts_fingerprint(facts: Facts) -> dict[str, str]:
    """One digest per part of the facts ('spark-worker containers', 'pi', ...), volatile fields out."""
    parts: dict[str, str] = {}
    for name, node in sorted(facts.nodes.items()):
        observed = node.model_dump(mode="json", exclude=_VOLATILE_NODE_FIELDS)
        for section, volatile in _VOLATILE_SECTION_FIELDS.items():
            observed[section] = {key: value for key, value in observed[section].items() if key not in volatile}
        for section, value in sorted(observed.items()):
            parts[f"{name} {section}"] = _digest(value)
    parts["pi"] = _digest(facts.pi.model_dump(mode="json") if facts.pi is not None else None)
    return parts


def saved(
    plan: Plan,
    deployment: Deployment,
    facts: Facts,
    created_at: str | None = None,
    *,
    update_revision: bool = False,
    accept_memory_risk: bool = False,
    spec_path: str | None = None,
) -> SavedPlan:
    return SavedPlan(
        plan,
        spec_fingerprint(deployment),
        facts_fingerprint(facts),
        created_at or utc_iso(),
        __version__,
        update_revision,
        accept_memory_risk,
        spec_path,
    )


def write(path: Path, plan: SavedPlan) -> None:
    """Private (0600): the rank payloads hold the spec's environment, which may name tokens."""
    try:
        atomic_write(str(path), (json.dumps(plan.to_dict(), indent=2) + "\n").encode("utf-8"), 0o600)
    except OSError as exc:
        raise ReconcilerError(
            f"cannot write the plan to {path}: {exc.strerror or exc}", "give --out a file path in a writable directory"
        ) from None


def read(path: Path) -> SavedPlan:
    """A saved plan from its file; any problem with the file is a ReconcilerError naming it."""
    hint = "write it again with `reconciler plan --out FILE`"
    try:
        data = json.loads(read_bounded(path, limit=MAX_SAVED_BYTES).decode("utf-8"))
    except UntrustedFileError as exc:
        raise ReconcilerError(f"cannot read the saved plan {path}: {exc.reason}", hint) from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ReconcilerError(f"{path} is not a saved plan (not JSON)", hint) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ReconcilerError(f"{path} is not a saved plan of this version (format {FORMAT})", hint)
    try:
        return SavedPlan(
            plan=Plan.from_dict(data["plan"]),
            spec=str(data["spec_fingerprint"]),
            facts={str(key): str(value) for key, value in dict(data["facts_fingerprint"]).items()},
            created_at=str(data["created_at"]),
            made_by=str(data["made_by"]),
            update_revision=data.get("update_revision") is True,
            accept_memory_risk=data.get("accept_memory_risk") is True,
            spec_path=data["spec_path"] if isinstance(data.get("spec_path"), str) else None,
        )
    except (KeyError, TypeError, ValueError, ValidationError) as exc:
        raise ReconcilerError(f"{path} is not a valid saved plan: {type(exc).__name__}", hint) from None


def check_current(plan: SavedPlan, deployment: Deployment, facts: Facts, path: Path, fresh: Plan) -> None:
    """Refuse a plan made from another spec or version, or one that the facts no longer give.

    `fresh` is the plan of the facts now. Planning is pure, so a saved plan whose facts are as
    they were is exactly the fresh one, payloads included, and so are the blockers and notes the
    confirmation prompt shows and the run acts on: any difference means the deployment
    changed since (the fingerprint says which part) or the file was edited. Facts that changed
    without changing the plan (an unrelated image pulled, memory moving) do not make it stale.
    """
    spec = f" --spec {plan.spec_path}" if plan.spec_path else ""
    replan = f"run `reconciler plan{spec} --out {path}` again, review it, then `reconciler apply {path}`"
    if plan.made_by != __version__:
        raise StalePlanError(
            f"the saved plan {path} was made by reconciler {plan.made_by}, this is {__version__}", replan
        )
    if plan.plan.deployment != deployment.name or plan.spec != spec_fingerprint(deployment):
        raise StalePlanError(f"the saved plan {path} was made from another spec (or the spec changed since)", replan)
    differing = _differing_parts(plan.plan, fresh)
    if not differing:
        return
    now = facts_fingerprint(facts)
    changed = sorted(part for part in {*plan.facts, *now} if plan.facts.get(part) != now.get(part))
    if not changed:
        raise StalePlanError(
            f"the saved plan {path} differs from what its facts give (its {', '.join(differing)}): was it edited?",
            replan,
        )
    raise StalePlanError(
        f"the saved plan {path} is stale: the deployment changed since {plan.created_at} ({', '.join(changed)})",
        replan,
    )


def _differing_parts(saved: Plan, fresh: Plan) -> list[str]:
    """The parts of the plan (actions, blockers, notes, ...) in which the saved one is not the fresh one.
    The memory predictions' figures are left out: the guard's record behind them grows every
    minute (what they decided, a restart or not, is in the actions)."""
    ours, theirs = _without_memory_figures(saved.to_dict()), _without_memory_figures(fresh.to_dict())
    return [part for part in ours if ours[part] != theirs.get(part)]


def _without_memory_figures(plan: dict[str, Any]) -> dict[str, Any]:
    notes = [note for note in plan["notes"] if not note.startswith(headroom.NOTE_PREFIX)]
    blockers = [
        {**blocker, "message": headroom.NOTE_PREFIX} if blocker["message"].startswith(headroom.NOTE_PREFIX) else blocker
        for blocker in plan["blockers"]
    ]
    return {**plan, "notes": notes, "blockers": blockers}
