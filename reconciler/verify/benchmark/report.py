"""The bench's report as JSON and its summary: per prefill target and decode step, the
statistics, the flagged streams and vLLM's `--save-result` metrics."""

from __future__ import annotations

import statistics
from typing import Any

from reconciler.verify.benchmark.records import OUTLIER_FACTOR, rounded, stats

FORMAT = "spark-reconciler-bench/1"


Report = dict[str, Any]


def new_report(label: str, model: str, url: str, started: str, settings: dict[str, Any]) -> Report:
    return {
        "format": FORMAT,
        "label": label,
        "model": model,
        "url": url,
        "started": started,
        "finished": None,
        "complete": False,
        "error": None,
        "settings": settings,
        "prefill": [],
        "decode": [],
        "recall": [],
        "summary": {"prefill": [], "decode": [], "recall": []},
    }


def summarize(report: Report) -> dict[str, list[dict[str, Any]]]:
    """Per prompt length, per (concurrency, kind), per recall length: the statistics."""
    return {
        "prefill": [_prefill_summary(target, runs) for target, runs in _groups(report["prefill"], ("target",))],
        "decode": [_decode_summary(key, reps) for key, reps in _groups(report["decode"], ("conc", "kind"))],
        "recall": [
            {k: run[k] for k in ("length", "depth", "prompt_tokens", "ttft_s", "pass")} for run in report["recall"]
        ],
    }


def _groups(records: list[dict[str, Any]], keys: tuple[str, ...]) -> list[tuple[tuple[Any, ...], list[Any]]]:
    grouped: dict[tuple[Any, ...], list[Any]] = {}
    for record in records:
        grouped.setdefault(tuple(record[key] for key in keys), []).append(record)
    return list(grouped.items())


def _prefill_summary(key: tuple[Any, ...], runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "target": key[0],
        "runs": len(runs),
        "prompt_tokens": statistics.median(run["prompt_tokens"] for run in runs),
        "tok_s": stats(run["tok_s"] for run in runs),
        "ttft_s": stats(run["ttft_s"] for run in runs),
    }


def _decode_summary(key: tuple[Any, ...], reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Statistics over every stream of the step, as `vllm bench serve` counts every request;
    the streams the sanity checks flag are listed in `flagged` with the reason."""
    streams = [stream for rep in reps for stream in rep["streams"]]
    placed = {(rep["rep"], index): stream for rep in reps for index, stream in enumerate(rep["streams"])}
    return {
        "conc": key[0],
        "kind": key[1],
        "reps": len(reps),
        "streams": len(streams),
        "flagged": [
            {"rep": rep, "stream": index, "flags": reasons, "tok_s": placed[rep, index]["tok_s"]}
            for (rep, index), reasons in group_flags(reps).items()
        ],
        "per_stream_tok_s": stats(stream["tok_s"] for stream in streams),
        "aggregate_tok_s": stats(rep["aggregate_tok_s"] for rep in reps),
        "ttft_s": stats(stream["ttft_s"] for stream in streams),
        "tpot_s": stats(stream["tpot_s"] for stream in streams),
        "itl_s": stats(gap for stream in streams for gap in stream["itl_s"]),
        "completion_tokens": stats(stream["completion_tokens"] for stream in streams),
        "vllm": vllm_metrics(reps),
    }


def group_flags(reps: list[dict[str, Any]]) -> dict[tuple[int, int], list[str]]:
    """(rep, stream index) -> why that stream's timing is suspect: its own burst flag, or a
    rate more than OUTLIER_FACTOR times the median of the group's other unflagged streams."""
    streams = [(rep["rep"], index, stream) for rep in reps for index, stream in enumerate(rep["streams"])]
    bursts = {(rep, index): list(stream.get("flags") or []) for rep, index, stream in streams}
    # Outliers are judged against the streams not flagged as bursts, as they were before any
    # outlier was marked: the verdict must not depend on the order the streams are listed in.
    flags = {where: list(reasons) for where, reasons in bursts.items()}
    for rep, index, stream in streams:
        others = [s["tok_s"] for r, i, s in streams if (r, i) != (rep, index) and s["tok_s"] and not bursts[r, i]]
        if stream["tok_s"] and len(others) >= 2 and stream["tok_s"] > OUTLIER_FACTOR * statistics.median(others):
            flags[rep, index].append("rate_outlier")
    return {where: reasons for where, reasons in flags.items() if reasons}


def vllm_metrics(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """The group in the keys of `vllm bench serve --save-result`, over every request as its
    calculate_metrics counts every successful one: throughput over the step's duration (its
    first request sent -> its last finished, as vLLM's duration: the repetitions' times share
    the step's origin), the latency statistics over the requests' samples."""
    every = [stream for rep in reps for stream in rep["streams"]]
    duration = _step_duration(reps, every)
    output = sum(stream["completion_tokens"] for stream in every)
    prompt = sum(stream.get("prompt_tokens") or 0 for stream in every)
    metrics: dict[str, Any] = {
        "completed": len(every),
        "max_concurrency": reps[0]["conc"],
        "duration": rounded(duration),
        "total_input_tokens": prompt,
        "total_output_tokens": output,
        "request_throughput": _per(len(every), duration),
        "output_throughput": _per(output, duration),
        "total_token_throughput": _per(prompt + output, duration),
    }
    samples = {
        "ttft": [s["ttft_s"] for s in every],
        "tpot": [s["tpot_s"] for s in every if s.get("tpot_s") is not None],
        "itl": [gap for s in every for gap in s["itl_s"]],
        "e2el": [s["latency_s"] for s in every if s.get("latency_s") is not None],
    }
    for name, values in samples.items():
        metrics.update(_ms_stats(name, values))
    return metrics


def _step_duration(reps: list[dict[str, Any]], streams: list[dict[str, Any]]) -> float:
    """First request sent -> last finished, from the streams' times on the step's clock; a
    report written before the repetitions shared that clock has each repetition's own span."""
    if all(isinstance(s.get("sent_s"), int | float) and isinstance(s.get("latency_s"), int | float) for s in streams):
        return float(max(s["sent_s"] + s["latency_s"] for s in streams) - min(s["sent_s"] for s in streams))
    return float(sum(rep.get("duration_s") or 0.0 for rep in reps))


def _per(count: float, duration: float) -> float | None:
    return rounded(count / duration) if duration > 0 else None


def _ms_stats(name: str, values: list[float]) -> dict[str, float | None]:
    ms = [value * 1000 for value in values]
    figures = stats(ms)
    if figures is None:
        return {f"{which}_{name}_ms": None for which in VLLM_STATS}
    figures["std"] = statistics.pstdev(ms)  # numpy.std's default: the population's
    return {f"{which}_{name}_ms": rounded(figures[which]) for which in VLLM_STATS}


VLLM_STATS = ("mean", "median", "std", "p90", "p99")


VLLM_LATENCIES = ("ttft", "tpot", "itl", "e2el")
