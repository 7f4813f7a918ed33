"""The bench's arithmetic, prompts, report, table and comparison: pure, no I/O (its pictures are
in reconciler/verify/plot.py, its timed requests in reconciler/verify/benchrun.py).

    stream.py    one streamed request, timed chunk by chunk
    records.py   statistics, and the records of one step with their flags
    prompts.py   decode, prefill and recall prompts
    report.py    the report and its summary, vLLM's metrics
    table.py     the summary as terminal tables
    compare.py   two runs side by side (ours or vLLM's --save-result)

The metric definitions (TTFT, E2EL, TPOT, ITL, prefill and decode rates, flags) and why they
are so: docs/bench-metrics.md, and docs/bench.md beside `vllm bench serve`'s.
"""

from reconciler.verify.benchmark.compare import VLLM_COMPARED as VLLM_COMPARED
from reconciler.verify.benchmark.compare import VLLM_FORMAT as VLLM_FORMAT
from reconciler.verify.benchmark.compare import compare as compare
from reconciler.verify.benchmark.compare import is_vllm_result as is_vllm_result
from reconciler.verify.benchmark.compare import render_compare as render_compare
from reconciler.verify.benchmark.prompts import CHARS_PER_TOKEN as CHARS_PER_TOKEN
from reconciler.verify.benchmark.prompts import RECALL_QUESTION as RECALL_QUESTION
from reconciler.verify.benchmark.prompts import decode_prompt as decode_prompt
from reconciler.verify.benchmark.prompts import prefill_ids as prefill_ids
from reconciler.verify.benchmark.prompts import recall_prompt as recall_prompt
from reconciler.verify.benchmark.records import aggregate_tok_s as aggregate_tok_s
from reconciler.verify.benchmark.records import burst_flags as burst_flags
from reconciler.verify.benchmark.records import decode_record as decode_record
from reconciler.verify.benchmark.records import decode_stream_record as decode_stream_record
from reconciler.verify.benchmark.records import percentile as percentile
from reconciler.verify.benchmark.records import prefill_record as prefill_record
from reconciler.verify.benchmark.records import recall_record as recall_record
from reconciler.verify.benchmark.records import stats as stats
from reconciler.verify.benchmark.records import with_step_aggregates as with_step_aggregates
from reconciler.verify.benchmark.report import FORMAT as FORMAT
from reconciler.verify.benchmark.report import Report as Report
from reconciler.verify.benchmark.report import new_report as new_report
from reconciler.verify.benchmark.report import summarize as summarize
from reconciler.verify.benchmark.stream import Stream as Stream
from reconciler.verify.benchmark.stream import TimedRead as TimedRead
from reconciler.verify.benchmark.stream import parse_stream as parse_stream
from reconciler.verify.benchmark.stream import read_stream as read_stream
from reconciler.verify.benchmark.table import render_table as render_table
