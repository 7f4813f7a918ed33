"""The bench's arithmetic, prompts, report, table and comparison: pure, no I/O (its pictures are
in reconciler/verify/plot.py, its timed requests in reconciler/verify/benchrun.py).

    stream.py    one streamed request, timed chunk by chunk
    records.py   statistics, and the records of one step with their flags
    prompts.py   decode, prefill and recall prompts
    report.py    the report and its summary, vLLM's metrics
    table.py     the summary as terminal tables
    compare.py   two runs side by side (ours or vLLM's --save-result)

Definitions follow `vllm bench serve` (see docs/sources.md) so numbers can be compared
with what users measure there; decode rates are measured between output chunks:

- TTFT: request sent -> first streamed chunk carrying output (content, reasoning or a tool
  call; for /v1/completions the first chunk with a choice, as vLLM counts it). A role-only
  chunk is not output: vLLM sends it together with the first token, other servers may not.
- E2EL (`latency_s`): sent -> the last chunk with a choice (vLLM's end; the usage chunk after
  it carries no token).
- TPOT, per request: (E2EL - TTFT) / (output tokens - 1).
- ITL: the gaps between successive output chunks, pooled over requests. With speculative
  decoding one chunk carries several tokens: compare TPOT.
- Output tokens: `completion_tokens` of the final usage chunk; output chunks only when a
  server sends no usage.
- Prefill tok/s: prompt tokens / TTFT of a 1-token completion of a fresh random prompt
  (prefix caching cannot serve it); TTFT also holds one decode step and the network, so this
  is a slight underestimate.
- Decode tok/s per stream: (output tokens - 1) / (last output chunk - first output chunk).
  Aggregate at concurrency C, per repetition (the k-th request of each of the C slots): the
  output tokens every stream of the step delivered from the first output chunk of those C
  requests to the last of them, less one, over that span. The slots drift apart when answers
  differ in length, so the repetition's own requests may hardly overlap; counting every
  stream's tokens in the span measures what the engine delivered then. Not all n tokens
  count: the first one arrives at the start of the span, not within it, and without the
  -1 a single stream's aggregate would exceed its own rate by n/(n-1).
- mean, median, p90 and p99 (linear interpolation, numpy's default) over the samples; the
  summary's `vllm` object has vLLM's `--save-result` keys (std as numpy's, the population's).
- Every statistic counts every completed stream, as vLLM's bench counts every successful
  request. Sanity: a stream whose chunks came faster than an engine makes them (`burst`) or
  whose rate is far beyond its step's others (`rate_outlier`) is listed as flagged, and still
  counted: a server that sends its chunks in bursts delivers them so to its users (and vLLM's
  bench times them so), while a reader that fell behind is told by the flag, not hidden.
"""

from reconciler.verify.benchmark.compare import VLLM_COMPARED, VLLM_FORMAT, compare, is_vllm_result, render_compare
from reconciler.verify.benchmark.prompts import (
    CHARS_PER_TOKEN,
    DECODE_PROMPTS,
    PROMPT_ID_RANGE,
    RECALL_QUESTION,
    decode_prompt,
    prefill_ids,
    recall_prompt,
)
from reconciler.verify.benchmark.records import (
    Stats,
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
    "DECODE_PROMPTS",
    "FORMAT",
    "PROMPT_ID_RANGE",
    "RECALL_QUESTION",
    "VLLM_COMPARED",
    "VLLM_FORMAT",
    "Report",
    "Stats",
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
