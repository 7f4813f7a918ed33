"""Memory you can plan with: what a serving edit will leave of MemAvailable, before it restarts.

A Spark's CPU and GPU share one pool, and the guard kills the ranks when MemAvailable falls
under its floor. The guard also keeps a record: each window's lowest MemAvailable with the
rank config that ran through it. An edit of a field that sizes memory (`kv_bytes`, `gpu_util`,
`max_num_seqs`, `max_model_len`) is judged against that record before the group restarts:

- the record is the lowest MemAvailable seen while the running config ran (its start-up
  included: the guard trips on any dip, so a dip is what counts), once it ran long enough;
- `kv_bytes` is allocated whole at start, so the prediction moves by its difference per rank;
- `gpu_util` sizes the KV pool only where `kv_bytes` is not rendered (the upstream profile),
  by its difference times MemTotal; with `kv_bytes` set it is only vLLM's start-up check;
- `max_num_seqs` and `max_model_len` leave the pool as it is; what they change in activations
  and CUDA graphs the record cannot tell, and the plan says so.

A prediction under the guard's floor plus a margin blocks the restart; `--accept-memory-risk`
lets it proceed (the guard still stops the ranks if the prediction was right).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reconciler.actions import Blocker, Component
from reconciler.facts.containers import ContainerFacts
from reconciler.facts.memory import KIB_PER_GIB
from reconciler.facts.node import NodeFacts
from reconciler.serving import LABEL_CONFIG_HASH, RankContainer, flag_values
from reconciler.spec import Deployment

GIB = 1024**3
# How every note and blocker of this module begins (saved plans compare them without figures).
NOTE_PREFIX = "memory on "
# The reference config's steady state is 2-3 GiB over the default 1 GiB floor: a margin of one
# GiB lets it run, and refuses an edit that would leave less than that between steady state and
# the kill.
MARGIN_GIB = 1.0
KV_FLAG, UTIL_FLAG = "--kv-cache-memory-bytes", "--gpu-memory-utilization"
MEMORY_FLAGS = {
    KV_FLAG: "kv_bytes",
    UTIL_FLAG: "gpu_util",
    "--max-num-seqs": "max_num_seqs",
    "--max-model-len": "max_model_len",
}


@dataclass(frozen=True)
class Record:
    """A node's lowest MemAvailable while its running rank config ran, and for how long."""

    low_gib: float
    seconds: float


@dataclass
class Outlook:
    """The plan's notes on memory and, when a prediction falls too low, the blockers."""

    notes: list[str] = field(default_factory=list)
    blockers: list[Blocker] = field(default_factory=list)


def recorded(observed: NodeFacts, config_hash: str) -> Record | None:
    """The guard's windows that ran exactly this rank config, summed up."""
    guard = observed.guard
    windows = [window for window in guard.windows if window.ranks == [config_hash]]
    if not windows or guard.window_s is None:
        return None
    return Record(min(window.low_gib for window in windows), len(windows) * guard.window_s)


def outlook(
    deployment: Deployment,
    nodes: dict[str, NodeFacts],
    changes: list[tuple[RankContainer, ContainerFacts]],
    *,
    accept_risk: bool,
) -> Outlook:
    """For each rank about to be replaced by a config that sizes memory differently: the
    prediction from its node's record, and a blocker when it falls under floor plus margin."""
    result = Outlook()
    for desired, running in changes:
        edits = _memory_edits(desired, running)
        if edits:
            _judge(deployment, nodes[desired.node], desired, running, edits, accept_risk, result)
    return result


def _memory_edits(desired: RankContainer, running: ContainerFacts) -> dict[str, tuple[str | None, str | None]]:
    before, after = flag_values(running.command), flag_values([*desired.entrypoint, *desired.command])
    return {flag: (before.get(flag), after.get(flag)) for flag in MEMORY_FLAGS if before.get(flag) != after.get(flag)}


def _judge(
    deployment: Deployment,
    observed: NodeFacts,
    desired: RankContainer,
    running: ContainerFacts,
    edits: dict[str, tuple[str | None, str | None]],
    accept_risk: bool,
    result: Outlook,
) -> None:
    node = desired.node
    edited = ", ".join(
        f"{MEMORY_FLAGS[flag]} {old or 'unset'} -> {new or 'unset'}" for flag, (old, new) in edits.items()
    )
    record = recorded(observed, running.labels.get(LABEL_CONFIG_HASH, ""))
    needed = deployment.memguard.record_s
    if record is None or record.seconds < needed or not deployment.memguard.enabled:
        ran = f"{record.seconds / 60:.1f}" if record else "0"
        result.notes.append(
            f"{NOTE_PREFIX}{node}: {edited}; no prediction: the guard's record holds {ran} of the "
            f"{needed / 60:g} minutes of the running config it needs (memguard.record_s)"
        )
        return
    total_gib = observed.memory.total_kib / KIB_PER_GIB if observed.memory else None
    pinned = KV_FLAG in flag_values([*desired.entrypoint, *desired.command])
    grows, caveats = _growth_gib(edits, total_gib, pinned=pinned)
    if grows is None:
        result.notes.append(f"{NOTE_PREFIX}{node}: {edited}; no prediction: {caveats[0]}")
        return
    predicted = record.low_gib - grows
    floor = deployment.memguard.floor_gib if deployment.memguard.enabled else 0.0
    message = (
        f"{NOTE_PREFIX}{node}: {edited}; lowest MemAvailable under the running config {record.low_gib:.1f} GiB "
        f"(over {record.seconds / 60:.0f} min), predicted {predicted:.1f} GiB ({_signed(-grows)} GiB)"
        + "".join(f"; {caveat}" for caveat in caveats)
    )
    if predicted >= floor + MARGIN_GIB:
        result.notes.append(message)
        return
    limit = f"under the guard's floor {floor:g} GiB + {MARGIN_GIB:g} GiB margin"
    if accept_risk:
        result.notes.append(f"{message}: {limit}, accepted with --accept-memory-risk")
        return
    hint = (
        "lower serving.kv_bytes (or serving.gpu_util) so the prediction stays above "
        f"{floor + MARGIN_GIB:g} GiB, or run `reconciler apply --accept-memory-risk` to restart anyway"
    )
    result.blockers.append(Blocker(node, Component.RANKS, f"{message}: {limit}", hint))


def _growth_gib(
    edits: dict[str, tuple[str | None, str | None]], total_gib: float | None, *, pinned: bool
) -> tuple[float | None, list[str]]:
    """How much more memory the edit takes per rank (GiB; None: it cannot be told), and what
    the record cannot tell; `pinned`: kv_bytes is rendered, so the KV pool is its size."""
    grows, caveats = 0.0, []
    if KV_FLAG in edits:
        old, new = (_number(value) for value in edits[KV_FLAG])
        if old is None or new is None:
            return None, ["kv_bytes set on one side only: the other side's pool follows gpu_util x MemTotal"]
        grows += (new - old) / GIB
    if UTIL_FLAG in edits:
        old, new = (_number(value) for value in edits[UTIL_FLAG])
        if pinned:
            caveats.append("gpu_util with kv_bytes set moves only vLLM's start-up check, not the steady state")
        elif total_gib is None or old is None or new is None:
            return None, ["gpu_util sizes the pool, and its old or new value or MemTotal is unknown"]
        else:
            grows += (new - old) * total_gib
    unknown = [MEMORY_FLAGS[flag] for flag in edits if flag not in (KV_FLAG, UTIL_FLAG)]
    if unknown:
        caveats.append(
            f"{' and '.join(unknown)} change activation and CUDA-graph memory by an amount the record cannot tell"
        )
    return grows, caveats


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _signed(value: float) -> str:
    return f"{value + 0.0:+.1f}"  # + 0.0: no "-0.0" for an edit that moves nothing
