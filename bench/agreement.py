"""The arithmetic of bench/vllm_agreement.py: both tools' requests pooled, figures in vLLM's
definitions, the rounds' differences. Pure, no I/O, so it is unit-tested without a testbed.

Both sides count every request after each slot's first, flagged or not (our report counts
flagged streams in its figures, as vLLM's bench counts every successful request): a slot's
first request leaves together with the other slots' at an idle engine, and vLLM's bench sends
its first prompt before the measured run (a test request and the warm-ups), so that one's TTFT
is the prefix cache's. The steady state is compared.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
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
