"""`reconciler bench`: the requests behind the numbers, timed on the client, saved as they come.

Steps run in order — an unrecorded warm-up, prefill per prompt length, decode per concurrency
and kind, the recall check per context length — and the JSON report is rewritten (atomically)
after every step, so an interrupted or failed run keeps everything it measured. The
arithmetic lives in reconciler/verify/benchmark.py; this module only sends requests and times them.
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import httpx

from reconciler.clock import utc_iso
from reconciler.errors import BenchError, ReconcilerError, StreamError
from reconciler.verify import benchmark
from reconciler.verify.apiclient import ApiTarget, JsonObject, client, discover_model, error_text

WARM_UP_PROMPT = "Say hello."
# The reference's warm-up has no cap; a model that never emits EOS (random weights, a broken
# tokenizer) would then run to max-model-len before the first measurement.
WARM_UP_MAX_TOKENS = 32
BARRIER_TIMEOUT_S = 60.0


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
                for step in self._steps(http, model):
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

    def _steps(self, http: httpx.Client, model: str) -> Iterator[Callable[[], str]]:
        reps = self.settings.reps
        for length in self.settings.prefill:
            for rep in range(1, reps + 1):
                yield functools.partial(self._prefill, http, model, length, rep)
        for conc in self.settings.conc:
            for kind in self.settings.kinds:
                for rep in range(1, reps + 1):
                    yield functools.partial(self._decode, model, conc, kind, rep)
        for length in self.settings.ctx:
            yield functools.partial(self._recall, http, model, length)

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

    def _prefill(self, http: httpx.Client, model: str, length: int, rep: int) -> str:
        ids = benchmark.prefill_ids(length, self.rng)
        body: JsonObject = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0, **_STREAM}
        record = benchmark.prefill_record(length, rep, timed_stream(http, "/v1/completions", body), len(ids))
        self.report["prefill"].append(record)
        return (
            f"prefill {length} tokens, rep {rep}/{self.settings.reps}: TTFT {record['ttft_s']:.3f} s, "
            f"{record['tok_s']:.0f} tok/s"
        )

    def _decode(self, model: str, conc: int, kind: str, rep: int) -> str:
        streams = concurrent_streams(self.target, [self._decode_body(model, kind) for _ in range(conc)])
        record = benchmark.decode_record(conc, kind, rep, streams)
        self.report["decode"].append(record)
        per_stream = benchmark.stats(stream["tok_s"] for stream in record["streams"])
        tokens = sum(stream["completion_tokens"] for stream in record["streams"])
        return (
            f"decode c{conc} {kind}, rep {rep}/{self.settings.reps}: "
            f"{_number(per_stream['median'] if per_stream else None)} tok/s per stream (median), "
            f"{_number(record['aggregate_tok_s'])} aggregate, {tokens} tokens"
        )

    def _decode_body(self, model: str, kind: str) -> JsonObject:
        prompt = benchmark.decode_prompt(kind, _nonce(self.rng))
        body: JsonObject = {"model": model, "messages": [{"role": "user", "content": prompt}], **_STREAM}
        if self.settings.max_tokens is not None:
            body["max_tokens"] = self.settings.max_tokens
        return body

    def _recall(self, http: httpx.Client, model: str, length: int) -> str:
        key = str(self.rng.randrange(10_000, 100_000))
        prompt = benchmark.recall_prompt(length, self.settings.depth, key, _nonce(self.rng))
        body: JsonObject = {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0}
        stream = timed_stream(http, "/v1/chat/completions", {**body, **_STREAM})
        record = benchmark.recall_record(length, self.settings.depth, key, stream)
        self.report["recall"].append(record)
        verdict = "PASS" if record["pass"] else f"FAIL (answered {record['answer']!r})"
        return f"recall {length} tokens at depth {self.settings.depth:g}: {verdict}"


_STREAM: JsonObject = {"stream": True, "stream_options": {"include_usage": True}}


def timed_stream(http: httpx.Client, path: str, body: JsonObject) -> benchmark.Stream:
    sent = time.perf_counter()
    with http.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            response.read()
            raise BenchError(f"POST {path}: {error_text(response)}", "check `reconciler logs r0`")
        return benchmark.read_stream(sent, response.iter_lines(), time.perf_counter)


def concurrent_streams(target: ApiTarget, bodies: list[JsonObject]) -> list[benchmark.Stream]:
    """The streams sent together (a barrier releases them at once), each on its own connection."""
    barrier = threading.Barrier(len(bodies))

    def one(body: JsonObject) -> benchmark.Stream:
        with client(target) as http:
            barrier.wait(BARRIER_TIMEOUT_S)
            return timed_stream(http, "/v1/chat/completions", body)

    with ThreadPoolExecutor(max_workers=len(bodies), thread_name_prefix="bench-stream") as pool:
        return list(pool.map(one, bodies))


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _nonce(rng: random.Random) -> str:
    return uuid.UUID(int=rng.getrandbits(128)).hex[:12]


def _describe(exc: Exception) -> str:
    if isinstance(exc, ReconcilerError):
        return exc.message
    if isinstance(exc, httpx.HTTPError):
        return f"no answer: {type(exc).__name__}: {exc}"
    return str(exc)


def load_report(path: str) -> benchmark.Report:
    """A saved report, for `bench compare`."""
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ReconcilerError(
            f"cannot read bench report {path}: {exc}", "pass a file written by `reconciler bench --out`"
        ) from None
    if not isinstance(report, dict) or report.get("format") != benchmark.FORMAT:
        raise ReconcilerError(
            f"{path} is not a bench report ({benchmark.FORMAT})", "pass a file written by `reconciler bench --out`"
        )
    problem = _number_problem(report, "") or _summary_problem(report.get("summary"))
    if problem is not None:
        raise ReconcilerError(
            f"{path} is not a bench report this version can read: {problem}",
            "pass a file written by `reconciler bench --out`, unedited",
        )
    return report


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
    return None


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
