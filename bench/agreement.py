"""The arithmetic of bench/vllm_agreement.py: both tools' requests pooled, figures in vLLM's
definitions, the rounds' differences. Pure, no I/O, so it is unit-tested without a testbed.

Both sides count every request after each slot's first, flagged or not (our report counts
flagged streams in its figures, as vLLM's bench counts every successful request): a slot's
first request leaves together with the other slots' at an idle engine, and vLLM's bench sends
its first prompt before the measured run (a test request and the warm-ups), so that one's TTFT
is the prefix cache's. The steady state is compared.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Figures = dict[str, float]

# What is compared, in the keys of `vllm bench serve --save-result`. At two streams the TTFT has
# two modes (one request of a pair waits for the other's prefill step), so its median falls on
# either mode or between them by a single sample: read the mean there.
FIGURES = ("median_ttft_ms", "mean_ttft_ms", "median_tpot_ms", "median_itl_ms", "output_throughput")


@dataclass
class Pooled:
    """One tool's requests its latency figures count, and the output tokens and the duration
    its throughput counts (every request of its runs, the first ones too, as each tool states)."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    tokens: int = 0
    duration: float = 0.0

    def add(self, other: Pooled) -> None:
        self.requests += other.requests
        self.tokens += other.tokens
        self.duration += other.duration


def from_vllm_result(saved: dict[str, Any], conc: int) -> Pooled:
    """A `vllm bench serve --save-result --save-detailed` file, its first `conc` requests left
    out of the latencies. vLLM's bench exits 0 with failed requests in it (their TTFT 0, no
    tokens), which its own figures leave out: a run with any is refused, not averaged."""
    failed = int(saved.get("failed") or 0) or sum(1 for error in saved.get("errors") or [] if error)
    if failed:
        raise ValueError(f"vllm bench serve: {failed} of its requests failed; the round has no figures")
    requests = [
        {"ttft": ttft, "itl": itl, "e2el": ttft + sum(itl), "tokens": tokens}
        for ttft, itl, tokens in zip(saved["ttfts"], saved["itls"], saved["output_lens"], strict=True)
    ]
    return Pooled(requests[conc:], sum(saved["output_lens"]), float(saved["duration"]))


def from_our_report(report: dict[str, Any]) -> Pooled:
    """A `reconciler bench --kinds random` report of one concurrency, repetition 1 (each slot's
    first request) left out of the latencies; its throughput's tokens and duration as stated."""
    (level,) = report["summary"]["decode"]
    requests = [
        {"ttft": s["ttft_s"], "itl": s["itl_s"], "e2el": s["latency_s"], "tokens": s["completion_tokens"]}
        for rep in report["decode"]
        if rep["rep"] > 1
        for s in rep["streams"]
    ]
    return Pooled(requests, int(level["vllm"]["total_output_tokens"]), float(level["vllm"]["duration"]))


def vllm_figures(pooled: Pooled) -> Figures:
    """vLLM's definitions (calculate_metrics in vllm/benchmarks/serve.py), over pooled requests."""
    requests = pooled.requests
    ttfts = [r["ttft"] * 1000 for r in requests]
    tpots = [(r["e2el"] - r["ttft"]) / (r["tokens"] - 1) * 1000 for r in requests if r["tokens"] > 1]
    itls = [gap * 1000 for r in requests for gap in r["itl"]]
    return {
        "median_ttft_ms": statistics.median(ttfts),
        "mean_ttft_ms": statistics.fmean(ttfts),
        "median_tpot_ms": statistics.median(tpots),
        "median_itl_ms": statistics.median(itls),
        "output_throughput": pooled.tokens / pooled.duration,
    }


def difference(theirs: float, ours: float) -> float | None:
    """Ours relative to vLLM's; none when vLLM's is 0 (a median ITL of chunks sent together)."""
    return ours / theirs - 1 if theirs else None


def differences(rounds: Sequence[tuple[Figures, Figures]]) -> dict[str, list[float | None]]:
    """Per figure, each round's (vLLM's, ours) difference, in round order."""
    return {key: [difference(theirs[key], ours[key]) for theirs, ours in rounds] for key in FIGURES}


def median_difference(changes: Sequence[float | None]) -> float | None:
    """The median of the rounds' differences: one run meeting a slower or faster engine (load
    elsewhere on the machine) cannot move it alone."""
    present = [change for change in changes if change is not None]
    return statistics.median(present) if present else None


def percent(change: float | None) -> str:
    return "-" if change is None else f"{change:+.1%}"


def round_line(conc: int, round_: int, theirs: Figures, ours: Figures) -> str:
    figures = "  ".join(f"{key} {theirs[key]:.2f}/{ours[key]:.2f}" for key in FIGURES)
    return f"c{conc} round {round_} (vllm/ours): {figures}"


def figure_line(conc: int, key: str, theirs: float, ours: float, changes: Sequence[float | None]) -> str:
    """One figure of a concurrency: both tools' pooled values, the rounds' differences and their median."""
    by_round = " ".join(percent(change) for change in changes)
    return (
        f"c{conc} {key:18} vllm bench serve {theirs:9.3f}   reconciler bench {ours:9.3f}   "
        f"by round {by_round} -> {percent(median_difference(changes))}"
    )


# --- the engine's own view -------------------------------------------------------------------

# vLLM's histograms of every request it served, read from its /metrics before and after a run:
# they say how fast the engine itself was during that run, whichever client sent the requests.
SERVER_HISTOGRAMS = {
    "server_mean_ttft_ms": "vllm:time_to_first_token_seconds",
    "server_mean_itl_ms": "vllm:inter_token_latency_seconds",
}
_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)$")


def histogram_totals(text: str) -> dict[str, float]:
    """The `_sum` and `_count` samples of the server histograms in a Prometheus text page,
    summed over their labels (one engine, one model: one series each in practice)."""
    wanted = {f"{name}{suffix}" for name in SERVER_HISTOGRAMS.values() for suffix in ("_sum", "_count")}
    totals: dict[str, float] = {}
    for line in text.splitlines():
        sample = _SAMPLE.match(line.strip())
        if sample and sample["name"] in wanted:
            totals[sample["name"]] = totals.get(sample["name"], 0.0) + float(sample["value"])
    return totals


def server_figures(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float | None]:
    """The engine's mean TTFT and ITL over the requests served between two readings (a run's
    warm-ups included: they are few, and both tools send some); none when it served none."""
    figures: dict[str, float | None] = {}
    for key, name in SERVER_HISTOGRAMS.items():
        count = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
        total = after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
        figures[key] = total / count * 1000 if count > 0 else None
    return figures


def server_line(conc: int, round_: int, theirs: Mapping[str, float | None], ours: Mapping[str, float | None]) -> str:
    shown = "  ".join(f"{key} {_ms(theirs[key])}/{_ms(ours[key])}" for key in SERVER_HISTOGRAMS)
    return f"c{conc} round {round_} engine during (vllm/ours): {shown}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def engine_differences(
    rounds: Sequence[tuple[Mapping[str, float | None], Mapping[str, float | None]]],
) -> dict[str, list[float | None]]:
    """Per server figure, each round's (during vLLM's run, during ours) difference: the part of
    the tools' difference that the engine itself shows."""
    return {key: [_engine_difference(theirs[key], ours[key]) for theirs, ours in rounds] for key in SERVER_HISTOGRAMS}


def _engine_difference(theirs: float | None, ours: float | None) -> float | None:
    return None if theirs is None or ours is None else difference(theirs, ours)
