"""The bench's arithmetic, prompts, report, table and comparison: pure, no I/O (its pictures are
in reconciler/verify/plot.py, its timed requests in reconciler/verify/benchrun.py).

    stream.py    one streamed request, timed chunk by chunk
    records.py   statistics, and the records of one step with their flags
    prompts.py   decode, prefill and recall prompts
    report.py    the report and its summary, vLLM's metrics
    table.py     the summary as terminal tables
    compare.py   two runs side by side (ours or vLLM's --save-result)

The metric definitions (TTFT, E2EL, TPOT, ITL, prefill and decode rates, flags) and why they
are so: docs/bench-metrics.md, and README.md (Bench) beside `vllm bench serve`'s.
"""

from reconciler.verify.benchmark.compare import VLLM_COMPARED, VLLM_FORMAT, compare, is_vllm_result, render_compare
from reconciler.verify.benchmark.prompts import (
    CHARS_PER_TOKEN,
    RECALL_QUESTION,
    decode_prompt,
    prefill_ids,
    recall_prompt,
)
from reconciler.verify.benchmark.records import (
    aggregate_tok_s,
    burst_flags,
    decode_record,
    decode_stream_record,
    percentile,
    prefill_record,
    recall_record,
    stats,
    with_step_aggregates,
)
from reconciler.verify.benchmark.report import FORMAT, Report, new_report, summarize
from reconciler.verify.benchmark.stream import Stream, TimedRead, parse_stream, read_stream
from reconciler.verify.benchmark.table import render_table

__all__ = [
    "CHARS_PER_TOKEN",
    "FORMAT",
    "RECALL_QUESTION",
    "VLLM_COMPARED",
    "VLLM_FORMAT",
    "Report",
    "Stream",
    "TimedRead",
    "aggregate_tok_s",
    "burst_flags",
    "compare",
    "decode_prompt",
    "decode_record",
    "decode_stream_record",
    "is_vllm_result",
    "new_report",
    "parse_stream",
    "percentile",
    "prefill_ids",
    "prefill_record",
    "read_stream",
    "recall_prompt",
    "recall_record",
    "render_compare",
    "render_table",
    "stats",
    "summarize",
    "with_step_aggregates",
]
