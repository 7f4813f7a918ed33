"""One streamed request as the bench times it: server-sent events read as they arrive, each
output chunk's time, the usage the server reported."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from reconciler.errors import StreamError
from reconciler.verify.apiclient import chunk_json, first_choice, shorten, sse_payloads

OUTPUT_FIELDS = ("content", "reasoning_content", "reasoning", "tool_calls")


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
        for payload in sse_payloads(line.decode("utf-8", "replace").rstrip("\r") for line in lines):
            yield arrived, payload


def read_stream(sent: float, lines: Iterable[str], clock: Callable[[], float]) -> Stream:
    """Time every chunk as it arrives (`clock` is read right after each line)."""
    return stream_from_events(sent, ((clock(), payload) for payload in sse_payloads(lines)))


def stream_from_events(sent: float, events: Iterable[tuple[float, str]]) -> Stream:
    output_times: list[float] = []
    first_choice_at: float | None = None
    last_choice_at: float | None = None
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
        choice = first_choice(chunk)
        if choice is None:
            continue
        first_choice_at = now if first_choice_at is None else first_choice_at
        last_choice_at = now
        piece, carries = _output(choice)
        content.append(piece)
        if carries:
            output_times.append(now)
    return Stream(
        sent,
        tuple(output_times),
        first_choice_at,
        end,
        _count(usage, "completion_tokens"),
        _count(usage, "prompt_tokens"),
        "".join(content),
        last_choice_at,
    )


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
