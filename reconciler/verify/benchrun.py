"""`reconciler bench`: the requests behind the numbers, timed on the client, saved as they come.

Steps run in order — an unrecorded warm-up, prefill per prompt length, decode per concurrency
and kind, the recall check per context length — and the JSON report is rewritten (atomically)
after every step, so an interrupted or failed run keeps every step it finished (a decode step
with all its repetitions: its streams are parsed when it ends). The
arithmetic lives in reconciler/verify/benchmark/; this module only sends requests and times them.

How streams are read decides what the numbers mean: as `vllm bench serve` reads them, one
event loop, one connection per stream opened before the clock starts, every network read timed
the moment it returns and parsed only after the step (docs/bench.md, "How streams are read", says
why; the streams no timing can vindicate are flagged and counted: docs/bench-metrics.md).
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import random
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import httpx

from reconciler.clock import utc_iso
from reconciler.constants import RANDOM_KIND
from reconciler.errors import BenchError, ReconcilerError, StreamError
from reconciler.verify import benchmark
from reconciler.verify.apiclient import (
    STREAM_WITH_USAGE,
    ApiTarget,
    JsonObject,
    async_client,
    client,
    discover_model,
    error_text,
    transport_problem,
)

WARM_UP_PROMPT = "Say hello."
# The warm-up is capped: a model that never emits EOS (random weights, a broken tokenizer)
# would otherwise run to max-model-len before the first measurement.
WARM_UP_MAX_TOKENS = 32
RANDOM_OUTPUT_TOKENS = 128  # vllm bench serve's --random-output-len default
# Streams one decode step may hold (--conc x --reps): every read is kept, bytes and time, until
# the step ends and is parsed, a few hundred bytes an output token.
MAX_STEP_STREAMS = 4096


@dataclass(frozen=True)
class BenchSettings:
    conc: tuple[int, ...] = (1, 2)
    prefill: tuple[int, ...] = (8192, 32768)
    kinds: tuple[str, ...] = ("prose", "code")
    ctx: tuple[int, ...] = ()
    depth: float = 0.5
    reps: int = 3
    max_tokens: int | None = None
    label: str = ""
    input_len: int = 256

    def to_dict(self) -> dict[str, Any]:
        return {name: list(value) if isinstance(value, tuple) else value for name, value in asdict(self).items()}


@dataclass
class BenchRun:
    """One bench run against one target, writing `out` after every step."""

    target: ApiTarget
    settings: BenchSettings
    out: Path
    progress: Callable[[str], None] = lambda _message: None
    rng: random.Random = field(default_factory=lambda: random.Random(os.urandom(16)))
    report: benchmark.Report = field(default_factory=dict)

    def run(self) -> benchmark.Report:
        with client(self.target) as http:
            model = self.target.model or discover_model(http)
            settings = self.settings.to_dict()
            self.report = benchmark.new_report(self.settings.label, model, self.target.url, utc_iso(), settings)
            self.save()
            try:
                self._warm_up(http, model)
                for step in self._steps(model):
                    message = step()
                    self.save()
                    self.progress(message)
            except (httpx.HTTPError, StreamError, BenchError) as exc:
                self._fail(self.target.redact(_describe(exc)))
        self.report["complete"] = True
        self.report["finished"] = utc_iso()
        self.save()
        return self.report

    def interrupted(self) -> None:
        """Record an interruption (Ctrl-C) in the saved report."""
        if self.report:
            self.report["error"] = "interrupted"
            self.save()

    def save(self) -> None:
        self.report["summary"] = benchmark.summarize(self.report)
        temporary = self.out.with_name(self.out.name + ".tmp")
        temporary.write_text(json.dumps(self.report, indent=1) + "\n", encoding="utf-8")
        temporary.replace(self.out)

    def _fail(self, message: str) -> NoReturn:
        self.report["error"] = message
        self.save()
        done = len(self.report["prefill"]) + len(self.report["decode"]) + len(self.report["recall"])
        raise BenchError(f"bench stopped: {message}", f"{self.out} keeps what was measured before it ({done} steps)")

    def _steps(self, model: str) -> Iterator[Callable[[], str]]:
        reps = self.settings.reps
        for length in self.settings.prefill:
            for rep in range(1, reps + 1):
                yield functools.partial(self._prefill, model, length, rep)
        for conc in self.settings.conc:
            for kind in self.settings.kinds:
                yield functools.partial(self._decode, model, conc, kind)
        for length in self.settings.ctx:
            yield functools.partial(self._recall, model, length)

    def _warm_up(self, http: httpx.Client, model: str) -> None:
        started = time.monotonic()
        body = {
            "model": model,
            "messages": [{"role": "user", "content": WARM_UP_PROMPT}],
            "max_tokens": WARM_UP_MAX_TOKENS,
        }
        response = http.post("/v1/chat/completions", json=body)
        if response.status_code != 200:
            raise BenchError(f"warm-up: POST /v1/chat/completions: {error_text(response)}")
        self.progress(f"warm-up done in {time.monotonic() - started:.1f} s (not recorded)")

    def _prefill(self, model: str, length: int, rep: int) -> str:
        ids = benchmark.prefill_ids(length, self.rng)
        body: JsonObject = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0, **STREAM_WITH_USAGE}
        record = benchmark.prefill_record(length, rep, timed_stream(self.target, "/v1/completions", body), len(ids))
        self.report["prefill"].append(record)
        return (
            f"prefill {length} tokens, rep {rep}/{self.settings.reps}: TTFT {record['ttft_s']:.3f} s, "
            f"{record['tok_s']:.0f} tok/s"
        )

    def _decode(self, model: str, conc: int, kind: str) -> str:
        """One step: `reps` requests through each of `conc` slots, as `vllm bench serve
        --max-concurrency conc` sends them (a slot's next request leaves when its last one
        ends); repetition k is the k-th request of every slot."""
        path = "/v1/completions" if kind == RANDOM_KIND else "/v1/chat/completions"
        reps = self.settings.reps
        bodies = [[self._decode_body(model, kind) for _ in range(conc)] for _ in range(reps)]
        origin, rows = slotted_streams(self.target, path, bodies)
        records = benchmark.with_step_aggregates(
            [benchmark.decode_record(conc, kind, rep, row, origin) for rep, row in enumerate(rows, 1)]
        )
        self.report["decode"] += records
        streams = [stream for record in records for stream in record["streams"]]
        per_stream = benchmark.stats(stream["tok_s"] for stream in streams)
        aggregate = benchmark.stats(record["aggregate_tok_s"] for record in records)
        tokens = sum(stream["completion_tokens"] for stream in streams)
        bursts = sum(bool(stream["flags"]) for stream in streams)
        return (
            f"decode c{conc} {kind}, {reps} reps: "
            f"{_number(per_stream['median'] if per_stream else None)} tok/s per stream (median), "
            f"{_number(aggregate['median'] if aggregate else None)} aggregate, {tokens} tokens"
            + (f"; {bursts} stream(s) flagged as arriving in a burst (counted)" if bursts else "")
        )

    def _decode_body(self, model: str, kind: str) -> JsonObject:
        if kind == RANDOM_KIND:
            return self._random_body(model)
        prompt = benchmark.decode_prompt(kind, _nonce(self.rng))
        body: JsonObject = {"model": model, "messages": [{"role": "user", "content": prompt}], **STREAM_WITH_USAGE}
        if self.settings.max_tokens is not None:
            body["max_tokens"] = self.settings.max_tokens
        return body

    def _random_body(self, model: str) -> JsonObject:
        """vLLM's random workload: fresh random ids, exactly the output length (EOS ignored)."""
        return {
            "model": model,
            "prompt": benchmark.prefill_ids(self.settings.input_len, self.rng),
            "max_tokens": self.settings.max_tokens or RANDOM_OUTPUT_TOKENS,
            "ignore_eos": True,
            **STREAM_WITH_USAGE,
        }

    def _recall(self, model: str, length: int) -> str:
        key = str(self.rng.randrange(10_000, 100_000))
        prompt = benchmark.recall_prompt(length, self.settings.depth, key, _nonce(self.rng))
        body: JsonObject = {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0}
        stream = timed_stream(self.target, "/v1/chat/completions", {**body, **STREAM_WITH_USAGE})
        record = benchmark.recall_record(length, self.settings.depth, key, stream)
        self.report["recall"].append(record)
        verdict = "PASS" if record["pass"] else f"FAIL (answered {record['answer']!r})"
        return f"recall {length} tokens at depth {self.settings.depth:g}: {verdict}"


def timed_stream(target: ApiTarget, path: str, body: JsonObject) -> benchmark.Stream:
    _sent, streams = slotted_streams(target, path, [[body]])
    (only,) = streams[0]  # one repetition of one slot
    return only


def slotted_streams(
    target: ApiTarget, path: str, bodies: list[list[JsonObject]], clock: Callable[[], float] = time.perf_counter
) -> tuple[float, list[list[benchmark.Stream]]]:
    """(when the first request left, streams[rep][slot]): each slot sends its column of
    `bodies` back to back, each on its own connection, all slots at once, all read by one event loop."""
    return asyncio.run(_slotted(target, path, bodies, clock))


async def _slotted(
    target: ApiTarget, path: str, bodies: list[list[JsonObject]], clock: Callable[[], float]
) -> tuple[float, list[list[benchmark.Stream]]]:
    slots = len(bodies[0])
    contents = [[json.dumps(body).encode() for body in row] for row in bodies]
    async with async_client(target, connections=slots) as http:
        await _open_connections(http, slots)

        async def slot(index: int) -> list[tuple[float, list[benchmark.TimedRead]]]:
            # No pause between a slot's requests: the engine never idles between them, as
            # under vLLM's bench, and a request's prefill meets the other slots' decodes.
            return [await _timed_reads(http, path, row[index], clock) for row in contents]

        origin = clock()
        columns = await asyncio.gather(*(slot(index) for index in range(slots)))
    rows = [[benchmark.parse_stream(*columns[index][rep]) for index in range(slots)] for rep in range(len(bodies))]
    return origin, rows


async def _open_connections(http: httpx.AsyncClient, count: int) -> None:
    """`count` kept-alive connections in the pool, so no stream's TTFT holds a handshake."""
    answers = await asyncio.gather(*(http.get("/v1/models") for _ in range(count)))
    for answer in answers:
        if answer.status_code != 200:
            raise BenchError(f"GET /v1/models: {error_text(answer)}", "check `reconciler logs r0`")


async def _timed_reads(
    http: httpx.AsyncClient, path: str, content: bytes, clock: Callable[[], float]
) -> tuple[float, list[benchmark.TimedRead]]:
    """(sent, every network read with the time it returned) of the request `content` (its JSON,
    encoded before any stream of the step starts); nothing else in the loop."""
    headers = {"content-type": "application/json"}
    reads: list[benchmark.TimedRead] = []
    sent = clock()
    async with http.stream("POST", path, content=content, headers=headers) as response:
        if response.status_code != 200:
            await response.aread()
            raise BenchError(f"POST {path}: {error_text(response)}", "check `reconciler logs r0`")
        _refuse_encoded(response, path)
        async for data in response.aiter_raw():
            reads.append((clock(), data))
    return sent, reads


def _refuse_encoded(response: httpx.Response, path: str) -> None:
    """A compressed stream arrives in the compressor's blocks, not as the engine made it."""
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise BenchError(
            f"POST {path}: the stream came compressed ({encoding}), so its chunks cannot be timed",
            "reach the API directly, not through a proxy that compresses event streams",
        )


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _nonce(rng: random.Random) -> str:
    return uuid.UUID(int=rng.getrandbits(128)).hex[:12]


def _describe(exc: Exception) -> str:
    if isinstance(exc, ReconcilerError):
        return exc.message
    if isinstance(exc, httpx.HTTPError):
        return f"no answer: {transport_problem(exc)}"
    return str(exc)


def load_report(path: str) -> benchmark.Report:
    """A saved report, for `bench compare`: ours, or a `vllm bench serve --save-result` file."""
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ReconcilerError(f"cannot read bench report {path}: {exc}", _REPORT_HINT) from None
    if isinstance(report, dict) and "format" not in report and report.keys() >= _VLLM_MARKS:
        return vllm_result(path, report)
    if not isinstance(report, dict) or report.get("format") != benchmark.FORMAT:
        raise ReconcilerError(f"{path} is not a bench report ({benchmark.FORMAT})", _REPORT_HINT)
    problem = _number_problem(report, "") or _summary_problem(report.get("summary"))
    if problem is not None:
        raise ReconcilerError(
            f"{path} is not a bench report this version can read: {problem}",
            "pass a file written by `reconciler bench --out`, unedited",
        )
    return report


_REPORT_HINT = "pass a file written by `reconciler bench --out` or `vllm bench serve --save-result`"
# Keys every `vllm bench serve --save-result` file has (and a report of ours has not).
_VLLM_MARKS = {"completed", "duration", "output_throughput", "median_ttft_ms"}


def vllm_result(path: str, raw: dict[str, Any]) -> benchmark.Report:
    """The figures `bench compare` reads from a vLLM result, checked as ours are."""
    conc = raw.get("max_concurrency")
    if not isinstance(conc, int) or isinstance(conc, bool) or conc < 1:
        raise ReconcilerError(
            f"{path}: a vllm bench serve result without max_concurrency cannot be matched to a decode step",
            "run vllm bench serve with --max-concurrency N (the bench's --conc) and --save-result",
        )
    metrics = {key: raw.get(key) for key, _label, _better in benchmark.VLLM_COMPARED}
    problem = next((key for key, value in metrics.items() if value is not None and not _is_number(value)), None)
    problem = f"{problem} is {metrics[problem]!r}" if problem else _number_problem(metrics, "")
    if problem is not None:
        raise ReconcilerError(f"{path} is not a vllm bench serve result this version can read: {problem}", _REPORT_HINT)
    label = raw.get("label")
    return {
        "format": benchmark.VLLM_FORMAT,
        "label": label if isinstance(label, str) and label else f"vllm bench serve c{conc}",
        "max_concurrency": conc,
        "metrics": metrics,
    }


# Fields of a summary entry that name the step, and the statistics compare and plot read.
_SUMMARY_FIELDS = {
    "prefill": (("target",), ("tok_s", "ttft_s")),
    "decode": (("conc",), ("per_stream_tok_s", "aggregate_tok_s", "ttft_s", "tpot_s", "itl_s")),
    "recall": (("length",), ()),
}


def _number_problem(value: object, where: str) -> str | None:
    """Every number in a report is a finite count, size, rate or time: never NaN, infinite,
    negative or astronomically large (each would end in a crash or a lie when compared or drawn)."""
    if isinstance(value, dict):
        found = (_number_problem(item, f"{where}.{key}") for key, item in value.items())
    elif isinstance(value, list):
        found = (_number_problem(item, f"{where}[{index}]") for index, item in enumerate(value))
    elif isinstance(value, bool) or not isinstance(value, int | float):
        return None
    else:
        good = math.isfinite(value) and 0 <= value < 1e15
        return None if good else f"{where.lstrip('.')} is {value!r}"
    return next((problem for problem in found if problem is not None), None)


def _summary_problem(summary: object) -> str | None:
    if summary is None:
        return None
    if not isinstance(summary, dict):
        return "summary is not an object"
    for part, (keys, figures) in _SUMMARY_FIELDS.items():
        entries = summary.get(part, [])
        if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
            return f"summary.{part} is not a list of objects"
        for index, entry in enumerate(entries):
            where = f"summary.{part}[{index}]"
            if any(not _is_number(entry.get(key)) for key in keys):
                return f"{where} has no {' and '.join(keys)}"
            for figure in figures:
                stats = entry.get(figure)
                if stats is not None and not (isinstance(stats, dict) and all(map(_is_number, stats.values()))):
                    return f"{where}.{figure} is not a set of statistics"
            problem = _decode_entry_problem(entry, where) if part == "decode" else None
            if problem is not None:
                return problem
    return None


def _decode_entry_problem(entry: dict[str, Any], where: str) -> str | None:
    """A decode step's name, its flagged streams and its figures in vLLM's terms, as written."""
    if not isinstance(entry.get("kind"), str):
        return f"{where} has no kind"
    flagged = entry.get("flagged", [])
    if not isinstance(flagged, list) or not all(_is_flag(item) for item in flagged):
        return f"{where}.flagged is not a list of flagged streams"
    figures = entry.get("vllm")
    if figures is not None and not (
        isinstance(figures, dict) and all(value is None or _is_number(value) for value in figures.values())
    ):
        return f"{where}.vllm is not a set of figures"
    return None


def _is_flag(item: object) -> bool:
    return (
        isinstance(item, dict)
        and _is_number(item.get("rep"))
        and _is_number(item.get("stream"))
        and isinstance(item.get("flags"), list)
        and all(isinstance(flag, str) for flag in item["flags"])
    )


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
