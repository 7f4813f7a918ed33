"""The bench's arithmetic, prompts, report, table and comparison: pure, no I/O (its pictures are
in reconciler/verify/plot.py).

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

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from reconciler.constants import RANDOM_KIND
from reconciler.errors import ReconcilerError, StreamError
from reconciler.verify.apiclient import chunk_json, shorten, sse_payloads

FORMAT = "spark-reconciler-bench/1"
PROMPT_ID_RANGE = (100, 1000)  # token ids every tokenizer has, far from special tokens
CHARS_PER_TOKEN = 4  # English filler; the usage chunk reports the true count
OUTPUT_FIELDS = ("content", "reasoning_content", "reasoning", "tool_calls")
DECODE_PROMPTS = {
    "prose": (
        "Write a detailed essay of about 800 words on the history of the printing press and how it changed Europe."
    ),
    "code": (
        "Write a complete, well-commented Python module implementing a thread-safe LRU cache with per-entry "
        "expiry, followed by pytest unit tests for it."
    ),
}
RECALL_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
RECALL_QUESTION = "What is the pass key? Answer with the number only."

Report = dict[str, Any]
Stats = dict[str, float]


# --- one streamed request ---------------------------------------------------------------------


@dataclass(frozen=True)
class Stream:
    """What the client saw of one streamed request; times are seconds of one monotonic clock."""

    sent: float
    output_times: tuple[float, ...]
    first_choice: float | None
    end: float
    completion_tokens: int | None
    prompt_tokens: int | None
    content: str
    # The last chunk with a choice: where vLLM's bench ends a request (not at the usage chunk).
    last_choice: float | None = None


TimedRead = tuple[float, bytes]


def parse_stream(sent: float, reads: Iterable[TimedRead]) -> Stream:
    """A stream from the network reads it arrived in, each timed when it arrived: a line is
    as old as the read that completed it. Parsing happens after the stream has ended, so the
    time the client spends on JSON cannot delay (or batch) the reading."""
    return stream_from_events(sent, sse_events(reads))


def sse_events(reads: Iterable[TimedRead]) -> Iterator[tuple[float, str]]:
    """(arrival time, data) of each `data:` line in a byte stream cut into timed reads."""
    pending = b""
    for arrived, data in reads:
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            text = line.decode("utf-8", "replace").rstrip("\r")
            if text.startswith("data:"):
                yield arrived, text[5:].strip()


def read_stream(sent: float, lines: Iterable[str], clock: Callable[[], float]) -> Stream:
    """Time every chunk as it arrives (`clock` is read right after each line)."""
    return stream_from_events(sent, ((clock(), payload) for payload in sse_payloads(lines)))


def stream_from_events(sent: float, events: Iterable[tuple[float, str]]) -> Stream:
    output_times: list[float] = []
    first_choice: float | None = None
    last_choice: float | None = None
    end = sent
    usage: dict[str, Any] = {}
    content: list[str] = []
    for now, payload in events:
        if payload == "[DONE]":
            break
        chunk = chunk_json(payload)
        if "error" in chunk:
            raise StreamError(f"the stream carried an error: {shorten(str(chunk['error']), 160)}")
        end = now
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
        choice = _first_choice(chunk)
        if choice is None:
            continue
        first_choice = now if first_choice is None else first_choice
        last_choice = now
        piece, carries = _output(choice)
        content.append(piece)
        if carries:
            output_times.append(now)
    return Stream(
        sent,
        tuple(output_times),
        first_choice,
        end,
        _count(usage, "completion_tokens"),
        _count(usage, "prompt_tokens"),
        "".join(content),
        last_choice,
    )


def _first_choice(chunk: dict[str, Any]) -> dict[str, Any] | None:
    choices = chunk.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    return first if isinstance(first, dict) else None


def _output(choice: dict[str, Any]) -> tuple[str, bool]:
    """(answer text in this chunk, whether the chunk carries any output at all)."""
    delta = choice.get("delta")
    if isinstance(delta, dict):
        text = delta.get("content")
        return (text if isinstance(text, str) else ""), any(delta.get(name) for name in OUTPUT_FIELDS)
    # A completion chunk is a step's output even with empty text (a special token, or bytes the
    # detokenizer holds back until a character is whole): vLLM's bench counts it so.
    text = choice.get("text")
    return (text, True) if isinstance(text, str) else ("", False)


def _count(usage: dict[str, Any], name: str) -> int | None:
    value = usage.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# --- statistics -------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """numpy.percentile's default (linear interpolation between closest ranks)."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def stats(values: Iterable[float | None]) -> Stats | None:
    present = [value for value in values if value is not None]
    if not present:
        return None
    return {
        "mean": statistics.fmean(present),
        "median": statistics.median(present),
        "p90": percentile(present, 90),
        "p99": percentile(present, 99),
        "n": len(present),
    }


# --- records of one step ----------------------------------------------------------------------

# Sanity: no decode step of an engine makes two tokens of one stream within 0.2 ms (the fastest
# seen, a tiny model on CPU, takes 1.1 ms a step). Gaps that short mean the chunks were sent
# together (real vLLM serving that tiny model fast writes several at once) or waited in the
# client's buffer and were read together; the flag says so, the figures count them either way.
BURST_GAP_S = 0.0002
BURST_SHARE = 0.25  # more than this share of a stream's gaps that short: the stream is a burst
OUTLIER_FACTOR = 3.0  # a stream this many times faster than the median of its step's others


def decode_stream_record(stream: Stream, origin: float) -> dict[str, Any]:
    """One decode stream in vLLM's terms; `origin` is when the concurrent streams started."""
    times = stream.output_times
    if not times:
        raise StreamError("the stream carried no output")
    tokens = stream.completion_tokens if stream.completion_tokens is not None else len(times)
    ttft = times[0] - stream.sent
    latency = (stream.last_choice if stream.last_choice is not None else times[-1]) - stream.sent
    decode = times[-1] - times[0]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    return {
        "ttft_s": _round(ttft),
        "latency_s": _round(latency),
        "completion_tokens": tokens,
        "prompt_tokens": stream.prompt_tokens,
        "tokens_from_usage": stream.completion_tokens is not None,
        "chunks": len(times),
        "tok_s": _round((tokens - 1) / decode) if tokens > 1 and decode > 0 else None,
        "tpot_s": _round((latency - ttft) / (tokens - 1)) if tokens > 1 else None,
        "sent_s": _round(stream.sent - origin),
        "t_first_s": _round(times[0] - origin),
        "t_last_s": _round(times[-1] - origin),
        "itl_s": [_round(gap) for gap in gaps],
        "flags": burst_flags(tokens, gaps),
    }


def burst_flags(tokens: int, gaps: list[float]) -> list[str]:
    """["burst"] when the chunks arrived faster than any engine makes them (see BURST_GAP_S)."""
    if tokens < 2 or not gaps:
        return []
    short = sum(gap < BURST_GAP_S for gap in gaps)
    # One short gap is a server's doing (a finish chunk right behind the last token), not a burst.
    return ["burst"] if short >= 2 and short > BURST_SHARE * len(gaps) else []


def aggregate_tok_s(streams: list[dict[str, Any]], step: list[dict[str, Any]] | None = None) -> float | None:
    """The output tokens delivered after the first one over the span from the first output of
    `streams` to their last: every stream of `step` (default: these) counts its tokens in it."""
    start, end = min(s["t_first_s"] for s in streams), max(s["t_last_s"] for s in streams)
    if end <= start:
        return None
    tokens = sum(_tokens_between(stream, start, end) for stream in (streams if step is None else step))
    return _round((tokens - 1) / (end - start))


def _tokens_between(stream: dict[str, Any], start: float, end: float) -> float:
    """A stream's output tokens whose chunks arrived in [start, end], each chunk carrying an
    equal share of its completion tokens (several per chunk under speculative decoding)."""
    times: list[float] = list(itertools.accumulate(stream["itl_s"], initial=stream["t_first_s"]))
    # The stored times are rounded to microseconds. Summed, the gaps drift by up to half of one
    # each, so the last chunk is the stored t_last_s itself and none is later; the span's own
    # ends count within the rounding.
    times = [min(time, stream["t_last_s"]) for time in times[:-1]] + [stream["t_last_s"]]
    share = float(stream["completion_tokens"]) / len(times)
    return share * sum(start - 1e-6 <= time <= end + 1e-6 for time in times)


def with_step_aggregates(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The repetitions of one step, each one's aggregate over every stream of the step."""
    step = [stream for record in records for stream in record["streams"]]
    return [{**record, "aggregate_tok_s": aggregate_tok_s(record["streams"], step)} for record in records]


def decode_record(conc: int, kind: str, rep: int, streams: list[Stream], origin: float | None = None) -> dict[str, Any]:
    """One repetition: the rep-th request of each of the step's `conc` slots. `origin` is when
    the step started (all its repetitions share it); by default the first stream's sending."""
    start = min(stream.sent for stream in streams) if origin is None else origin
    records = [decode_stream_record(stream, start) for stream in streams]
    first = min(record["sent_s"] for record in records)
    # vLLM's benchmark duration: the first request sent -> the last one finished.
    duration = max(record["sent_s"] + record["latency_s"] for record in records) - first
    return {
        "conc": conc,
        "kind": kind,
        "rep": rep,
        "duration_s": _round(duration),
        "aggregate_tok_s": aggregate_tok_s(records),
        "streams": records,
    }


def prefill_record(target: int, rep: int, stream: Stream, sent_tokens: int) -> dict[str, Any]:
    if stream.first_choice is None:
        raise StreamError("the completion streamed no choice")
    ttft = stream.first_choice - stream.sent
    tokens = stream.prompt_tokens if stream.prompt_tokens is not None else sent_tokens
    return {
        "target": target,
        "rep": rep,
        "prompt_tokens": tokens,
        "ttft_s": _round(ttft),
        "tok_s": _round(tokens / ttft),
    }


def recall_record(length: int, depth: float, key: str, stream: Stream) -> dict[str, Any]:
    ttft = stream.output_times[0] - stream.sent if stream.output_times else None
    return {
        "length": length,
        "depth": depth,
        "prompt_tokens": stream.prompt_tokens,
        "ttft_s": _round(ttft) if ttft is not None else None,
        "key": key,
        "pass": key in stream.content,
        "answer": shorten(stream.content, 120),
    }


def _round(value: float) -> float:
    return round(value, 6)


# --- prompts ----------------------------------------------------------------------------------


def decode_prompt(kind: str, nonce: str) -> str:
    """The kind's task after a unique first line, so no prompt is ever served from the prefix cache."""
    return f"Request {nonce}.\n{DECODE_PROMPTS[kind]}"


def prefill_ids(count: int, rng: random.Random) -> list[int]:
    return [rng.randrange(*PROMPT_ID_RANGE) for _ in range(count)]


def recall_prompt(length: int, depth: float, key: str, nonce: str) -> str:
    """The pass-key test: `key` hidden at `depth` (0 = start, 1 = end) of ~`length` tokens of filler."""
    intro = f"Session {nonce}. A pass key is hidden in the long text below. Find it and remember it.\n\n"
    needle = f"The pass key is {key}. Remember it. {key} is the pass key. "
    question = f"\n\n{RECALL_QUESTION}"
    room = length * CHARS_PER_TOKEN - len(intro) - len(needle) - len(question)
    units = max(1, room // len(RECALL_FILLER))
    before = round(units * min(1.0, max(0.0, depth)))
    return intro + RECALL_FILLER * before + needle + RECALL_FILLER * (units - before) + question


# --- the report -------------------------------------------------------------------------------


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
    return {
        "conc": key[0],
        "kind": key[1],
        "reps": len(reps),
        "streams": len(streams),
        "flagged": [
            {"rep": rep, "stream": index, "flags": reasons, "tok_s": _stream(reps, rep, index)["tok_s"]}
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


def _stream(reps: list[dict[str, Any]], rep: int, index: int) -> dict[str, Any]:
    streams: list[dict[str, Any]] = next(r for r in reps if r["rep"] == rep)["streams"]
    return streams[index]


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
        "duration": _round(duration),
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
    return _round(count / duration) if duration > 0 else None


def _ms_stats(name: str, values: list[float]) -> dict[str, float | None]:
    if not values:
        return {f"{which}_{name}_ms": None for which in VLLM_STATS}
    ms = [value * 1000 for value in values]
    return {
        f"mean_{name}_ms": _round(statistics.fmean(ms)),
        f"median_{name}_ms": _round(statistics.median(ms)),
        f"std_{name}_ms": _round(statistics.pstdev(ms)),  # numpy.std's default: the population's
        f"p90_{name}_ms": _round(percentile(ms, 90)),
        f"p99_{name}_ms": _round(percentile(ms, 99)),
    }


VLLM_STATS = ("mean", "median", "std", "p90", "p99")
VLLM_LATENCIES = ("ttft", "tpot", "itl", "e2el")


# --- the terminal table -----------------------------------------------------------------------


def render_table(report: Report) -> str:
    summary = report["summary"]
    parts = [f"bench {report['label'] or ''} model {report['model']} at {report['url']}".replace("  ", " ")]
    if summary["prefill"]:
        parts += ["", "Prefill (prompt tokens / TTFT, unique prompts)", _table(_PREFILL_HEAD, _prefill_rows(summary))]
    if summary["decode"]:
        cap = report["settings"].get("max_tokens")
        title = f"Decode (output capped at {cap} tokens)" if cap else "Decode (no output cap)"
        parts += ["", title, _table(_DECODE_HEAD, _decode_rows(summary))]
        parts += ["", "Serving, in `vllm bench serve` terms", _table(_VLLM_HEAD, _vllm_rows(summary))]
        parts += _flag_lines(summary)
    if summary["recall"]:
        parts += ["", "Long-context recall (pass key)", _table(_RECALL_HEAD, _recall_rows(summary))]
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


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], left: int = 0) -> str:
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


# --- comparing two runs -----------------------------------------------------------------------


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
    rows = []
    for name in [*left, *(name for name in right if name not in left)]:
        value_a, better = left.get(name, (None, ""))
        value_b, better_b = right.get(name, (None, ""))
        rows.append(
            {
                "metric": name,
                "a": value_a,
                "b": value_b,
                "change_pct": _change(value_a, value_b),
                "better": better or better_b,
            }
        )
    return rows


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
    return _table(("metric", f"A {label_a}", f"B {label_b}", "change"), table_rows, left=1) + "\n"


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
