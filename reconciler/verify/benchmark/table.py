"""The bench's summary as terminal tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from reconciler.verify.benchmark.records import Stats
from reconciler.verify.benchmark.report import VLLM_LATENCIES, Report


def render_table(report: Report) -> str:
    summary = report["summary"]
    parts = [f"bench {report['label'] or ''} model {report['model']} at {report['url']}".replace("  ", " ")]
    if summary["prefill"]:
        parts += [
            "",
            "Prefill (prompt tokens / TTFT, unique prompts)",
            text_table(_PREFILL_HEAD, _prefill_rows(summary)),
        ]
    if summary["decode"]:
        cap = report["settings"].get("max_tokens")
        title = f"Decode (output capped at {cap} tokens)" if cap else "Decode (no output cap)"
        parts += ["", title, text_table(_DECODE_HEAD, _decode_rows(summary))]
        parts += ["", "Serving, in `vllm bench serve` terms", text_table(_VLLM_HEAD, _vllm_rows(summary))]
        parts += _flag_lines(summary)
    if summary["recall"]:
        parts += ["", "Long-context recall (pass key)", text_table(_RECALL_HEAD, _recall_rows(summary))]
    if not report["complete"]:
        parts += ["", f"INCOMPLETE: {report['error'] or 'interrupted'}"]
    return "\n".join(parts) + "\n"


_PREFILL_HEAD = ("target", "prompt tok", "tok/s median", "TTFT s median", "runs")


_DECODE_HEAD = (
    "conc",
    "kind",
    "tok/s/stream med",
    "aggregate tok/s med",
    "TTFT s mean/med/p99",
    "TPOT ms mean/med/p99",
    "ITL ms mean/med/p99",
    "out tok mean",
    "flagged",
)


_VLLM_HEAD = (
    "conc",
    "kind",
    "requests",
    "req/s",
    "output tok/s",
    "TTFT ms mean/med/p99",
    "TPOT ms mean/med/p99",
    "ITL ms mean/med/p99",
    "E2EL ms mean/med/p99",
)


_RECALL_HEAD = ("length", "depth", "prompt tok", "TTFT s", "result")


def _prefill_rows(summary: dict[str, Any]) -> list[tuple[str, ...]]:
    return [
        (
            str(s["target"]),
            f"{s['prompt_tokens']:g}",
            _fmt(s["tok_s"], "median"),
            _fmt(s["ttft_s"], "median", 3),
            str(s["runs"]),
        )
        for s in summary["prefill"]
    ]


def _decode_rows(summary: dict[str, Any]) -> list[tuple[str, ...]]:
    return [
        (
            str(s["conc"]),
            s["kind"],
            _fmt(s["per_stream_tok_s"], "median"),
            _fmt(s["aggregate_tok_s"], "median"),
            _triple(s["ttft_s"], 1, 3),
            _triple(s["tpot_s"], 1000, 1),
            _triple(s["itl_s"], 1000, 1),
            _fmt(s["completion_tokens"], "mean", 0),
            f"{len(s['flagged'])}/{s['streams']}",
        )
        for s in summary["decode"]
    ]


def _vllm_rows(summary: dict[str, Any]) -> list[tuple[str, ...]]:
    return [
        (
            str(s["conc"]),
            s["kind"],
            str(s["vllm"]["completed"]),
            _number_cell(s["vllm"]["request_throughput"], 2),
            _number_cell(s["vllm"]["output_throughput"], 1),
            *(_vllm_triple(s["vllm"], name) for name in VLLM_LATENCIES),
        )
        for s in summary["decode"]
    ]


def _vllm_triple(metrics: dict[str, Any], name: str) -> str:
    return "/".join(_number_cell(metrics[f"{which}_{name}_ms"], 2) for which in ("mean", "median", "p99"))


def _number_cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _flag_lines(summary: dict[str, Any]) -> list[str]:
    """Every flagged stream, and why: counted in the figures, never silently."""
    lines = [
        f"  FLAGGED c{s['conc']} {s['kind']} rep {f['rep']} stream {f['stream'] + 1}: {', '.join(f['flags'])}"
        f" ({_number_cell(f['tok_s'], 0)} tok/s; counted, as vllm bench serve counts it)"
        for s in summary["decode"]
        for f in s["flagged"]
    ]
    return ["", *lines, f"  {FLAG_NOTE}"] if lines else []


FLAG_NOTE = (
    "burst: most chunks arrived less than 0.2 ms apart, faster than an engine makes them (the server sent "
    "them together, or the client read them late from a buffer); "
    "rate_outlier: over 3x the median rate of the other streams of its step"
)


def _recall_rows(summary: dict[str, Any]) -> list[tuple[str, ...]]:
    return [
        (
            str(r["length"]),
            f"{r['depth']:g}",
            str(r["prompt_tokens"] if r["prompt_tokens"] is not None else "?"),
            f"{r['ttft_s']:.3f}" if r["ttft_s"] is not None else "-",
            "PASS" if r["pass"] else "FAIL",
        )
        for r in summary["recall"]
    ]


def _fmt(values: Stats | None, which: str, digits: int = 1, scale: float = 1.0) -> str:
    return "-" if values is None else f"{values[which] * scale:.{digits}f}"


def _triple(values: Stats | None, scale: float, digits: int) -> str:
    return "/".join(_fmt(values, which, digits, scale) for which in ("mean", "median", "p99"))


def text_table(head: Sequence[str], rows: Sequence[Sequence[str]], left: int = 0) -> str:
    """Columns right-aligned (numbers), except the first `left` ones (names)."""
    widths = [max(len(cell) for cell in column) for column in zip(head, *rows, strict=True)]
    lines = [
        "  ".join(
            cell.ljust(width) if index < left else cell.rjust(width)
            for index, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [head, *rows]
    ]
    return "\n".join("  " + line for line in lines)
