"""Comparing two bench runs (ours or `vllm bench serve --save-result` files), metric by metric."""

from __future__ import annotations

from typing import Any

from reconciler.constants import RANDOM_KIND
from reconciler.errors import ReconcilerError
from reconciler.verify.benchmark.records import Stats
from reconciler.verify.benchmark.report import VLLM_LATENCIES, Report, summarize
from reconciler.verify.benchmark.table import text_table


def compare(a: Report, b: Report) -> list[dict[str, Any]]:
    """Each metric both runs have (or either has), with B's change relative to A. A `vllm bench
    serve` result on either side is compared in vLLM's terms at its concurrency."""
    if is_vllm_result(a) or is_vllm_result(b):
        conc = (a if is_vllm_result(a) else b)["max_concurrency"]
        if is_vllm_result(a) and is_vllm_result(b) and a["max_concurrency"] != b["max_concurrency"]:
            raise ReconcilerError(
                f"the vllm bench serve results ran at concurrency {a['max_concurrency']} and "
                f"{b['max_concurrency']}: their figures do not compare",
                "compare two results of the same --max-concurrency",
            )
        left, right = _serving_metrics(a, conc), _serving_metrics(b, conc)
    else:
        left, right = _metrics(a), _metrics(b)
    return [_row(name, *left.get(name, (None, "")), *right.get(name, (None, ""))) for name in {**left, **right}]


def _row(name: str, value_a: Any, better: str, value_b: Any, better_b: str) -> dict[str, Any]:
    change = _change(value_a, value_b)
    return {"metric": name, "a": value_a, "b": value_b, "change_pct": change, "better": better or better_b}


VLLM_FORMAT = "vllm bench serve --save-result"


# The figures of a `vllm bench serve --save-result` file that `bench compare` reads.
VLLM_COMPARED = (
    ("request_throughput", "req/s", "higher"),
    ("output_throughput", "output tok/s", "higher"),
    *(
        (f"{which}_{name}_ms", f"{name.upper()} ms {which}", "lower")
        for name in VLLM_LATENCIES
        for which in ("mean", "median", "p99")
    ),
)


def is_vllm_result(report: Report) -> bool:
    return report.get("format") == VLLM_FORMAT


def _serving_metrics(report: Report, conc: int) -> dict[str, tuple[Any, str]]:
    """vLLM's figures at concurrency `conc`: a vLLM result's own, or the decode step of ours at
    that concurrency (the `random` kind, vLLM's workload, when the report has it)."""
    if is_vllm_result(report):
        figures: dict[str, Any] = report["metrics"]
    else:
        summary = report.get("summary") or summarize(report)
        level = next((s for s in summary["decode"] if s["conc"] == conc and s["kind"] == RANDOM_KIND), None)
        if level is None:
            raise ReconcilerError(
                f"{report.get('label') or 'our report'} has no decode step of the random kind at concurrency "
                f"{conc}: vLLM's random workload has nothing of ours to compare with",
                f"run `reconciler bench --kinds random --conc {conc} --input-len N --max-tokens M` with the "
                "lengths vllm bench serve used",
            )
        if not isinstance(level.get("vllm"), dict):
            raise ReconcilerError(
                f"{report.get('label') or 'our report'} was written before reports held vLLM's figures",
                "run `reconciler bench --kinds random` again with this version",
            )
        figures = level["vllm"]
    return {f"c{conc}: {label}": (figures.get(key), better) for key, label, better in VLLM_COMPARED}


def _metrics(report: Report) -> dict[str, tuple[Any, str]]:
    summary = report.get("summary") or summarize(report)
    metrics: dict[str, tuple[Any, str]] = {}
    for s in summary["prefill"]:
        metrics[f"prefill {s['target']}: tok/s median"] = (_pick(s["tok_s"], "median"), "higher")
        metrics[f"prefill {s['target']}: TTFT s median"] = (_pick(s["ttft_s"], "median"), "lower")
    for s in summary["decode"]:
        where = f"decode c{s['conc']} {s['kind']}"
        metrics[f"{where}: tok/s per stream median"] = (_pick(s["per_stream_tok_s"], "median"), "higher")
        metrics[f"{where}: aggregate tok/s median"] = (_pick(s["aggregate_tok_s"], "median"), "higher")
        metrics[f"{where}: TTFT s mean"] = (_pick(s["ttft_s"], "mean"), "lower")
        metrics[f"{where}: TPOT ms mean"] = (_pick(s["tpot_s"], "mean", 1000), "lower")
        metrics[f"{where}: ITL ms mean"] = (_pick(s["itl_s"], "mean", 1000), "lower")
        figures = s.get("vllm") or {}
        metrics[f"{where}: output tok/s"] = (figures.get("output_throughput"), "higher")
        for name in VLLM_LATENCIES:
            metrics[f"{where}: {name.upper()} ms median"] = (figures.get(f"median_{name}_ms"), "lower")
    for r in summary["recall"]:
        metrics[f"recall {r['length']} at depth {r['depth']:g}"] = ("PASS" if r["pass"] else "FAIL", "")
    return metrics


def _pick(values: Stats | None, which: str, scale: float = 1.0) -> float | None:
    return None if values is None else round(values[which] * scale, 6)


def _change(a: Any, b: Any) -> float | None:
    if not isinstance(a, float | int) or not isinstance(b, float | int) or a == 0:
        return None
    return round(100 * (b - a) / a, 2)


def render_compare(rows: list[dict[str, Any]], label_a: str, label_b: str) -> str:
    table_rows = [(row["metric"], _cell(row["a"]), _cell(row["b"]), _verdict(row)) for row in rows]
    return text_table(("metric", f"A {label_a}", f"B {label_b}", "change"), table_rows, left=1) + "\n"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _verdict(row: dict[str, Any]) -> str:
    change = row["change_pct"]
    if change is None:
        return "-" if row["a"] == row["b"] or not row["better"] else "n/a"
    if change == 0:
        return "0.0%"
    improved = (change > 0) == (row["better"] == "higher")
    return f"{change:+.1f}% ({'better' if improved else 'worse'})"
