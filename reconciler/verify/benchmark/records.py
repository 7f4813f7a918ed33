"""The bench's statistics and the records of one step: per stream, per repetition, aggregates
over the span the step's requests ran, and the flags of a stream an engine cannot have made."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable
from typing import Any

from reconciler.errors import StreamError
from reconciler.verify.apiclient import shorten
from reconciler.verify.benchmark.stream import Stream

Stats = dict[str, float]


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
        "ttft_s": rounded(ttft),
        "latency_s": rounded(latency),
        "completion_tokens": tokens,
        "prompt_tokens": stream.prompt_tokens,
        "tokens_from_usage": stream.completion_tokens is not None,
        "chunks": len(times),
        "tok_s": rounded((tokens - 1) / decode) if tokens > 1 and decode > 0 else None,
        "tpot_s": rounded((latency - ttft) / (tokens - 1)) if tokens > 1 else None,
        "sent_s": rounded(stream.sent - origin),
        "t_first_s": rounded(times[0] - origin),
        "t_last_s": rounded(times[-1] - origin),
        "itl_s": [rounded(gap) for gap in gaps],
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
    return rounded((tokens - 1) / (end - start))


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
        "duration_s": rounded(duration),
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
        "ttft_s": rounded(ttft),
        "tok_s": rounded(tokens / ttft),
    }


def recall_record(length: int, depth: float, key: str, stream: Stream) -> dict[str, Any]:
    ttft = stream.output_times[0] - stream.sent if stream.output_times else None
    return {
        "length": length,
        "depth": depth,
        "prompt_tokens": stream.prompt_tokens,
        "ttft_s": rounded(ttft) if ttft is not None else None,
        "key": key,
        "pass": key in stream.content,
        "answer": shorten(stream.content, 120),
    }


def rounded(value: float) -> float:
    return round(value, 6)
