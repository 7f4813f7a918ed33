"""Incident records: what the reconciler keeps of every unplanned failure.

A rank that exited or was killed, a node that rebooted, liveness probes that failed, a
memory-guard trip, a group start that never became ready: each leaves a directory
(`incidents/<id>/`) under the state dir of the machine that runs the reconciler (the head's, as
the service runs it), written when the pass that meets the failure plans what follows, before
it acts (the logs of the dead ranks are still there then). It holds each rank's last log lines,
its exit code and OOMKilled, each node's guard log tail, the facts the pass saw and the plan
that followed, everything redacted (and every variable whose name says secret masked). The
records are bounded in count and bytes (the oldest go), and one failure seen by several passes
is recorded once (its key: the exited containers and the time they finished, the guard trip's
time).

`detect` is pure; `record` reads the nodes and writes the files, and never fails a pass: a
record that cannot be made is said in the journal.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reconciler.actions import StartRank, StopRank, TripBreaker
from reconciler.clock import utc_iso, utc_stamp
from reconciler.components.memguard import trips
from reconciler.components.ranks import REBOOTED, RESUMING, SECRET_NAME_RE, owned_containers
from reconciler.errors import UntrustedFileError
from reconciler.facts.node import Facts
from reconciler.fsutil import read_bounded, write_private
from reconciler.nodeside.statedir import StateDir
from reconciler.plan import Plan
from reconciler.redact import REDACTED, redact
from reconciler.serving import container_name
from reconciler.spec import Deployment
from reconciler.transport.base import Transport

# Bounds: the newest records stay, at most this many and this many bytes in all.
MAX_INCIDENTS = 50
MAX_TOTAL_BYTES = 64 * 1024 * 1024
# Per record: each log's last lines (and bytes), the facts and the plan.
LOG_LINES = 200
LOG_BYTES = 64 * 1024
DOCUMENT_BYTES = 4 * 1024 * 1024
SUMMARY = "incident.json"
MASK = REDACTED


@dataclass(frozen=True)
class Found:
    """An unplanned failure a pass met: its kind, what happened, and the key that makes it one."""

    kind: str
    cause: str
    key: str


@dataclass
class Incident:
    """The summary of one record (its `incident.json`)."""

    id: str
    kind: str
    at: str
    cause: str
    key: str
    ranks: list[dict[str, Any]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def incidents_dir(deployment: Deployment) -> Path:
    return Path(StateDir(deployment.state_dir).expanded().incidents)


def detect(deployment: Deployment, facts: Facts, plan: Plan) -> list[Found]:
    """The unplanned failures in what a pass saw and planned: guard trips, and the failure an
    unplanned group restart (or the crash-loop breaker's hold) answers."""
    found = [
        Found("guard trip", f"memory guard tripped on {node} at {trip.at}", f"guard-trip {node} {trip.at}")
        for node, trip in trips(deployment, facts)
    ]
    cause = unplanned_cause(plan)
    # A resumed restart's failure was recorded when it failed (a failed start), or was no failure.
    if cause is not None and not cause.startswith(RESUMING):
        kind = "liveness" if cause.startswith("liveness:") else "reboot" if REBOOTED in cause else "rank exit"
        found.append(Found(kind, cause, _failure_key(deployment, facts, kind)))
    return found


def unplanned_cause(plan: Plan) -> str | None:
    """The failure an unplanned group restart (or the breaker's hold) in this plan answers."""
    for action in plan.actions:
        payload = action.payload
        if isinstance(payload, (StopRank, StartRank)) and payload.unplanned is not None:
            return payload.unplanned
        if isinstance(payload, TripBreaker):
            return payload.cause
    return None


def _failure_key(deployment: Deployment, facts: Facts, kind: str) -> str:
    """The stopped rank containers and when they finished: the same exit seen by a later pass
    (after a backoff) is the same incident. Liveness failures are one per pass that acts on them."""
    if kind == "liveness":
        return f"liveness {facts.taken_at}"
    stopped = sorted(
        f"{container.id[:12]}@{container.finished_at}"
        for _, node in deployment.ranked_nodes
        if facts.nodes[node.name].reachable
        for container in owned_containers(deployment, facts, node.name)
        if container.status != "running"
    )
    return "exit " + " ".join(stopped)


def failed_start(error: str, facts: Facts) -> Found:
    return Found("failed start", error, f"start {facts.taken_at}")


def record(
    deployment: Deployment,
    transports: dict[str, Transport],
    facts: Facts,
    plan: Plan,
    found: Found,
    *,
    log: Callable[[str], None],
) -> Incident | None:
    """Write the record of `found` unless one with its key exists; never raises (a record that
    cannot be made is logged)."""
    try:
        root = incidents_dir(deployment)
        if any(item.key == found.key for item in list_incidents(deployment)):
            return None
        incident = _write(deployment, transports, facts, plan, found, root)
        _prune(root)
    except Exception as exc:  # a record is a help, never a reason for the pass to fail
        log(f"cannot record the incident ({found.kind}): {type(exc).__name__}: {redact(str(exc))[:300]}")
        return None
    shown = redact(found.cause)[:300]
    log(f"incident {incident.id} recorded: {found.kind}: {shown} (`reconciler incidents show {incident.id}`)")
    return incident


def _write(
    deployment: Deployment, transports: dict[str, Transport], facts: Facts, plan: Plan, found: Found, root: Path
) -> Incident:
    at = utc_iso()
    incident_id = _new_id(root, utc_stamp(), found.kind.replace(" ", "-"))
    where = root / incident_id
    incident = Incident(incident_id, found.kind, at, redact(found.cause), found.key)
    for rank, node in deployment.ranked_nodes:
        state, log_text = _rank_record(transports.get(node.name), container_name(deployment, rank))
        incident.ranks.append({"rank": rank, "node": node.name, "container": container_name(deployment, rank), **state})
        if log_text is not None:
            name = f"r{rank}.log"
            _save(where / name, log_text, incident)
    for node in deployment.nodes:
        guard = _guard_tail(deployment, transports.get(node.name))
        if guard is not None:
            _save(where / f"memguard-{_safe(node.name)}.log", guard, incident)
    documents = {"facts.json": facts.model_dump(mode="json"), "plan.json": plan.to_dict()}
    for name, document in documents.items():
        _save(where / name, json.dumps(_masked(document), indent=1), incident, limit=DOCUMENT_BYTES)
    write_private(where / SUMMARY, redact(json.dumps(asdict(incident), indent=1)) + "\n")
    return incident


def _masked(document: Any) -> Any:
    """The document with the value of every variable whose name says it is a secret (a token in
    serving.extra_env, say) masked, as in a container's env {name: value} or a rank's
    [[name, value], ...]: the redaction catches only the secrets it was told of."""
    if isinstance(document, dict):
        return {key: _masked_value(key, value) for key, value in document.items()}
    if isinstance(document, list):
        pair = len(document) == 2 and isinstance(document[0], str) and isinstance(document[1], str)
        if pair and SECRET_NAME_RE.search(document[0]):
            return [document[0], MASK]
        return [_masked(item) for item in document]
    return document


def _masked_value(key: str, value: Any) -> Any:
    return MASK if isinstance(value, str) and SECRET_NAME_RE.search(key) else _masked(value)


def _save(path: Path, text: str, incident: Incident, *, limit: int = LOG_BYTES) -> None:
    """A file of the record, redacted and cut to its last `limit` bytes."""
    data = redact(text).encode("utf-8", errors="replace")
    if len(data) > limit:
        data = data[-limit:]
        incident.notes.append(f"{path.name}: only its last {limit} bytes are kept")
    write_private(path, data.decode("utf-8", errors="replace"))
    incident.files.append(path.name)


def _rank_record(transport: Transport | None, name: str) -> tuple[dict[str, Any], str | None]:
    """A rank container's state as Docker has it, and its last log lines."""
    if transport is None:
        return {"state": "node not connected"}, None
    from reconciler.transport.base import find_container

    try:
        container = find_container(transport.docker(), name)
        if container is None:
            return {"state": "no container"}, None
        state = container.attrs.get("State") or {}
        logs = container.logs(tail=LOG_LINES, timestamps=True)
    except Exception as exc:  # the node's Docker may be the failure itself
        return {"state": f"cannot read: {type(exc).__name__}: {redact(str(exc))[:200]}"}, None
    shown = {
        "state": state.get("Status"),
        "exit_code": state.get("ExitCode"),
        "oom_killed": state.get("OOMKilled"),
        "error": state.get("Error") or None,
        "started_at": state.get("StartedAt"),
        "finished_at": state.get("FinishedAt"),
    }
    return shown, logs.decode("utf-8", errors="replace") if isinstance(logs, bytes) else str(logs)


def _guard_tail(deployment: Deployment, transport: Transport | None) -> str | None:
    if transport is None:
        return None
    from reconciler.nodeops import NodeOps

    try:
        text = NodeOps(transport, None).read_text(StateDir(deployment.state_dir).guard_log, errors="replace")["text"]
    except Exception:  # a node that does not answer has no tail to give
        return None
    return None if text is None else "\n".join(text.splitlines()[-LOG_LINES:]) + "\n"


def _new_id(root: Path, stamp: str, kind: str) -> str:
    """`<UTC stamp>-<n>-<kind>`: ids sort in the order they were made, several in one second too."""
    taken = [path.name for path in root.iterdir()] if root.is_dir() else []
    numbers = [
        int(name.split("-")[2]) for name in taken if name.startswith(stamp + "-") and name.split("-")[2].isdigit()
    ]
    return f"{stamp}-{max(numbers, default=0) + 1:03d}-{kind}"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def _prune(root: Path) -> None:
    """Keep the newest MAX_INCIDENTS records and at most MAX_TOTAL_BYTES in all."""
    records = sorted((path for path in root.iterdir() if path.is_dir()), key=lambda path: path.name, reverse=True)
    total = 0
    for index, path in enumerate(records):
        total += sum(item.stat().st_size for item in path.iterdir() if item.is_file())
        if index >= MAX_INCIDENTS or (index > 0 and total > MAX_TOTAL_BYTES):
            shutil.rmtree(path, ignore_errors=True)


def list_incidents(deployment: Deployment) -> list[Incident]:
    """Every readable record, newest first."""
    root = incidents_dir(deployment)
    if not root.is_dir():
        return []
    found = [_load(path) for path in root.iterdir() if path.is_dir()]
    return sorted((item for item in found if item is not None), key=lambda item: item.id, reverse=True)


def _load(path: Path) -> Incident | None:
    with contextlib.suppress(UntrustedFileError, ValueError, TypeError, OSError):
        data = json.loads(read_bounded(path / SUMMARY, limit=1024 * 1024))
        if isinstance(data, dict) and data.get("id") == path.name:
            return Incident(**data)
    return None


def show(deployment: Deployment, incident_id: str) -> tuple[Incident, dict[str, str]]:
    """One record and its files' text, or ReconcilerError naming the records there are."""
    from reconciler.errors import ReconcilerError

    root = incidents_dir(deployment)
    incident = _load(root / incident_id) if _safe(incident_id) == incident_id and incident_id else None
    if incident is None:
        known = ", ".join(item.id for item in list_incidents(deployment)[:5]) or "none recorded"
        raise ReconcilerError(
            f"no incident {incident_id!r} under {root}", f"`reconciler incidents` lists them ({known})"
        )
    files: dict[str, str] = {}
    for name in incident.files:
        with contextlib.suppress(UntrustedFileError, OSError):
            files[name] = redact(
                read_bounded(root / incident_id / name, limit=DOCUMENT_BYTES * 2).decode("utf-8", "replace")
            )
    return incident, files


def last_incident(deployment: Deployment) -> dict[str, str] | None:
    """The newest record, in a line's worth, for `reconciler status`."""
    with contextlib.suppress(OSError):
        newest = next(iter(list_incidents(deployment)), None)
        if newest is not None:
            return {"id": newest.id, "kind": newest.kind, "at": newest.at, "cause": newest.cause}
    return None
