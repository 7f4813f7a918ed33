"""The bench's summary as terminal tables."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from reconciler.verify.benchmark.records import Stats
from reconciler.verify.benchmark.report import VLLM_LATENCIES, Report


def render_table(report: Report) -> str:
    summary = report["summary"]
    parts = [f"bench {report['label'] or ''} model {report['model']} at {report['url']}".replace("  ", " ")]
    if summary["prefill"]:
        parts += _section("Prefill (prompt tokens / TTFT, unique prompts)", _PREFILL, summary["prefill"])
    if summary["decode"]:
        cap = report["settings"].get("max_tokens")
        title = f"Decode (output capped at {cap} tokens)" if cap else "Decode (no output cap)"
        parts += _section(title, _DECODE, summary["decode"])
        parts += _section("Serving, in `vllm bench serve` terms", _VLLM, summary["decode"])
        parts += _flag_lines(summary)
    if summary["recall"]:
        parts += _section("Long-context recall (pass key)", _RECALL, summary["recall"])
    if not report["complete"]:
        parts += ["", f"INCOMPLETE: {report['error'] or 'interrupted'}"]
    return "\n".join(parts) + "\n"


# A table's columns: each one's heading and how a summary entry fills its cell.
Column = tuple[str, Callable[[dict[str, Any]], str]]


def _section(title: str, columns: Sequence[Column], entries: list[dict[str, Any]]) -> list[str]:
    rows = [tuple(cell(entry) for _, cell in columns) for entry in entries]
    return ["", title, text_table([head for head, _ in columns], rows)]


_PREFILL: tuple[Column, ...] = (
    ("target", lambda s: str(s["target"])),
    ("prompt tok", lambda s: f"{s['prompt_tokens']:g}"),
    ("tok/s median", lambda s: _fmt(s["tok_s"], "median")),
    ("TTFT s median", lambda s: _fmt(s["ttft_s"], "median", 3)),
    ("runs", lambda s: str(s["runs"])),
)


_STEP: tuple[Column, ...] = (("conc", lambda s: str(s["conc"])), ("kind", lambda s: s["kind"]))


_DECODE: tuple[Column, ...] = (
    *_STEP,
    ("tok/s/stream med", lambda s: _fmt(s["per_stream_tok_s"], "median")),
    ("aggregate tok/s med", lambda s: _fmt(s["aggregate_tok_s"], "median")),
    ("TTFT s mean/med/p99", lambda s: _triple(s["ttft_s"], 1, 3)),
    ("TPOT ms mean/med/p99", lambda s: _triple(s["tpot_s"], 1000, 1)),
    ("ITL ms mean/med/p99", lambda s: _triple(s["itl_s"], 1000, 1)),
    ("out tok mean", lambda s: _fmt(s["completion_tokens"], "mean", 0)),
    ("flagged", lambda s: f"{len(s['flagged'])}/{s['streams']}"),
)


def _vllm_latency(name: str) -> Column:
    return f"{name.upper()} ms mean/med/p99", lambda s: _vllm_triple(s["vllm"], name)


_VLLM: tuple[Column, ...] = (
    *_STEP,
    ("requests", lambda s: str(s["vllm"]["completed"])),
    ("req/s", lambda s: _number_cell(s["vllm"]["request_throughput"], 2)),
    ("output tok/s", lambda s: _number_cell(s["vllm"]["output_throughput"], 1)),
    *(_vllm_latency(name) for name in VLLM_LATENCIES),
)


_RECALL: tuple[Column, ...] = (
    ("length", lambda r: str(r["length"])),
    ("depth", lambda r: f"{r['depth']:g}"),
    ("prompt tok", lambda r: str(r["prompt_tokens"] if r["prompt_tokens"] is not None else "?")),
    ("TTFT s", lambda r: f"{r['ttft_s']:.3f}" if r["ttft_s"] is not None else "-"),
    ("result", lambda r: "PASS" if r["pass"] else "FAIL"),
)


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
