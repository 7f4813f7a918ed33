"""How the bench reads streams, and what it does with streams it could not have timed.

The reading tests use a lockstep server: it sends a chunk only after the client's clock has
ticked since the previous one, so a client that times each chunk when its read returns sees
exactly the tick that followed the send. A client that waited for more data, parsed before
timing or read several chunks at once would see a later tick (or stall the server): the
burst-reading fault of issue 18, made deterministic instead of depending on the machine's load.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from reconciler.cli import main
from reconciler.errors import BenchError
from reconciler.verify import benchmark, benchrun
from reconciler.verify.apiclient import ApiTarget, async_client

KEY = "test-key-not-secret"
CHUNKS = 6
TURN_TIMEOUT_S = 30.0  # only a broken reader waits this long; a loaded machine may take seconds


def answer_models(handler: BaseHTTPRequestHandler) -> None:
    """GET /v1/models of the test servers: one model, "m" (the bench opens its connections so)."""
    body = b'{"object": "list", "data": [{"id": "m"}]}'
    handler.send_response(200)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class TickClock:
    """A clock that counts its calls; the server waits on it."""

    def __init__(self) -> None:
        self.ticks = 0
        self.changed = threading.Condition()

    def __call__(self) -> float:
        with self.changed:
            self.ticks += 1
            self.changed.notify_all()
            return float(self.ticks)

    def wait_past(self, tick: int) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.ticks > tick, TURN_TIMEOUT_S)


class Lockstep:
    """What the server shares between its handler threads: the clock, whose turn it is (the
    streams alternate, one unread chunk in the whole server at a time), the record."""

    def __init__(self, clock: TickClock, names: tuple[str, ...]) -> None:
        self.clock = clock
        self.names = names
        self.arrived = threading.Barrier(len(names), timeout=TURN_TIMEOUT_S)
        self.turn = threading.Condition()
        self.whose = names[0]
        self.sent_at: dict[str, list[int]] = {}
        self.stalled = False

    def send(self, name: str, write: Callable[[bytes], object], event: bytes) -> None:
        with self.turn:
            if not self.turn.wait_for(lambda: self.whose == name, TURN_TIMEOUT_S):
                self.stalled = True
            tick = self.clock.ticks  # before the write: the client may read it at once
            write(b"%x\r\n%s\r\n" % (len(event), event))
            self.sent_at.setdefault(name, []).append(tick)
            if not self.clock.wait_past(tick):
                self.stalled = True
            self.whose = self.names[(self.names.index(name) + 1) % len(self.names)]
            self.turn.notify_all()


def chunk(text: str) -> bytes:
    body = {"choices": [{"index": 0, "text": text, "finish_reason": None}]}
    return f"data: {json.dumps(body)}\n\n".encode()


def usage() -> bytes:
    body = {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": CHUNKS}}
    return f"data: {json.dumps(body)}\n\n".encode()


def make_handler(state: Lockstep) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            del format, args

        def do_GET(self) -> None:
            answer_models(self)

        def do_POST(self) -> None:
            name = json.loads(self.rfile.read(int(self.headers["content-length"])))["prompt"]
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            state.arrived.wait()  # every stream has been sent (its clock read) before any chunk
            events = [chunk(f"{name}{index}") for index in range(CHUNKS)] + [usage(), b"data: [DONE]\n\n"]
            for event in events:
                state.send(name, self.wfile.write, event)
            self.wfile.write(b"0\r\n\r\n")

    return Handler


@pytest.fixture
def lockstep_server() -> Iterator[tuple[str, TickClock, Lockstep]]:
    clock = TickClock()
    state = Lockstep(clock, ("a", "b"))
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", clock, state
    finally:
        server.shutdown()
        server.server_close()


def test_each_chunk_is_timed_by_the_read_that_brought_it_while_the_other_stream_runs(
    lockstep_server: tuple[str, TickClock, Lockstep],
) -> None:
    url, clock, state = lockstep_server
    target = ApiTarget(url, KEY, "m")
    bodies: list[dict[str, Any]] = [{"model": "m", "prompt": name, "stream": True} for name in ("a", "b")]
    _origin, (streams,) = benchrun.slotted_streams(target, "/v1/completions", [bodies], clock)
    assert state.stalled is False  # the client never left a sent chunk unread
    for name, stream in zip(("a", "b"), streams, strict=True):
        sent = state.sent_at[name]
        # Chunk k is timed at the tick right after it was sent: read at once, on its own.
        assert stream.output_times == tuple(float(tick + 1) for tick in sent[:CHUNKS])
        assert stream.content == "".join(f"{name}{index}" for index in range(CHUNKS))
        assert stream.completion_tokens == CHUNKS
        record = benchmark.decode_stream_record(stream, 0.0)
        assert record["flags"] == []
    # Both streams were open at once: their chunks alternated on the one clock.
    assert state.sent_at["a"][0] < state.sent_at["b"][0] < state.sent_at["a"][1] < state.sent_at["b"][1]


# --- burst streams are flagged, and counted as vLLM's bench counts them ----------------------


def reads(*timed: tuple[float, list[bytes]]) -> list[benchmark.TimedRead]:
    """Network reads: (when it returned, the SSE events it carried)."""
    return [(when, b"".join(events)) for when, events in timed]


def chat_events(count: int) -> list[bytes]:
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    events = [f"data: {json.dumps(role)}\n\n".encode()]
    for index in range(count):
        body = {"choices": [{"index": 0, "delta": {"content": f"t{index} "}}]}
        events.append(f"data: {json.dumps(body)}\n\n".encode())
    done = {"choices": [], "usage": {"prompt_tokens": 256, "completion_tokens": count}}
    return [*events, f"data: {json.dumps(done)}\n\n".encode(), b"data: [DONE]\n\n"]


def spaced(sent: float, first: float, gap: float, count: int) -> benchmark.Stream:
    """A stream whose chunks arrived one per read, `gap` apart."""
    events = chat_events(count)
    timed = [(first, events[:2])] + [(first + gap * index, [event]) for index, event in enumerate(events[2:-2], 1)]
    return benchmark.parse_stream(sent, reads(*timed, (first + gap * count, events[-2:])))


def burst(sent: float, at: float, count: int) -> benchmark.Stream:
    """The whole answer in one read: the client was not reading while it was made."""
    return benchmark.parse_stream(sent, reads((at, chat_events(count))))


def trickle(sent: float, at: float, count: int, gap: float) -> benchmark.Stream:
    """One chunk per read but microseconds apart: a buffer drained late, chunk by chunk."""
    events = chat_events(count)
    timed = [(at + gap * index, [event]) for index, event in enumerate(events)]
    return benchmark.parse_stream(sent, reads(*timed))


def in_bursts(sent: float, first: float, gap: float, count: int, per_read: int) -> benchmark.Stream:
    """A server that makes a token every `gap` but writes `per_read` of them at once (as real
    vLLM serving a tiny model fast did): every read `per_read` chunks, `per_read * gap` apart."""
    events = chat_events(count)
    outputs = events[1:-2]
    timed = [
        (first + gap * start, ([events[0]] if start == 0 else []) + outputs[start : start + per_read])
        for start in range(0, count, per_read)
    ]
    return benchmark.parse_stream(sent, reads(*timed, (timed[-1][0], events[-2:])))


def report_of(*reps: list[benchmark.Stream], conc: int = 1) -> benchmark.Report:
    report = benchmark.new_report("t", "m", "http://x", "2026-12-01T00:00:00Z", {"max_tokens": 64})
    # The streams' times are on one clock from 0, as the repetitions of one step are.
    records = [benchmark.decode_record(conc, "random", rep, streams, 0.0) for rep, streams in enumerate(reps, 1)]
    report["decode"] = records
    report["complete"] = True
    report["summary"] = benchmark.summarize(report)
    return report


def test_the_events_of_one_read_share_its_time_and_lines_may_span_reads() -> None:
    whole = b"".join(chat_events(2))
    cut = [(1.0, whole[:30]), (2.0, whole[30:100]), (3.0, whole[100:])]
    stream = benchmark.parse_stream(0.5, cut)
    assert stream.content == "t0 t1 "
    assert stream.first_choice == 2.0  # the role chunk's line ended in the second read
    assert all(time in (2.0, 3.0) for time in stream.output_times)


def test_a_stream_read_in_one_burst_is_flagged_and_counted_in_the_statistics() -> None:
    good = [spaced(0.0, 0.013, 0.0016, 64) for _ in range(3)]
    late = burst(0.0, 0.115, 64)
    report = report_of([good[0]], [good[1]], [late], [good[2]])
    level = report["summary"]["decode"][0]
    assert report["decode"][2]["streams"][0]["flags"] == ["burst"]
    assert report["decode"][2]["streams"][0]["tok_s"] is None  # no span to divide by
    assert level["flagged"] == [{"rep": 3, "stream": 0, "flags": ["burst"], "tok_s": None}]
    assert level["per_stream_tok_s"]["n"] == 3  # the burst has no rate, only its TTFT and TPOT
    assert level["per_stream_tok_s"]["median"] == pytest.approx(63 / (63 * 0.0016))
    assert level["ttft_s"]["n"] == 4
    assert level["ttft_s"]["mean"] == pytest.approx((3 * 0.013 + 0.115) / 4)  # the late burst's 115 ms too
    assert level["vllm"]["mean_ttft_ms"] == pytest.approx(1000 * (3 * 0.013 + 0.115) / 4)
    assert level["vllm"]["median_tpot_ms"] == pytest.approx(1.6, rel=0.05)
    assert level["tpot_s"]["n"] == 4
    table = benchmark.render_table(report)
    assert "FLAGGED c1 random rep 3 stream 1: burst (- tok/s; counted, as vllm bench serve counts it)" in table
    assert "1/4" in table


def test_a_server_that_sends_in_bursts_is_flagged_and_every_figure_is_still_reported() -> None:
    """A fast server that sends its chunks in bursts once had every stream of the step flagged and
    a summary without TPOT, ITL or throughput. The bursts are what the server delivers, and what
    vLLM's bench counts."""
    gap, count = 0.0011, 64
    streams = [in_bursts(0.076 * k, 0.076 * k + 0.010, gap, count, 4) for k in range(3)]
    report = report_of(*[[stream] for stream in streams])
    level = report["summary"]["decode"][0]
    assert [f["flags"] for f in level["flagged"]] == [["burst"]] * 3
    decode = gap * (count - 4)  # the first read brings chunks 0-3, the last 60-63
    assert level["ttft_s"]["mean"] == pytest.approx(0.010)
    assert level["tpot_s"]["median"] == pytest.approx(decode / (count - 1), rel=1e-3)  # µs in the records
    assert level["itl_s"]["mean"] == pytest.approx(decode / (count - 1), rel=1e-3)
    assert level["per_stream_tok_s"]["median"] == pytest.approx((count - 1) / decode, rel=1e-4)
    assert level["aggregate_tok_s"]["median"] == pytest.approx((count - 1) / decode, rel=1e-4)
    assert level["completion_tokens"]["mean"] == count
    figures = level["vllm"]
    assert figures["completed"] == 3
    assert figures["output_throughput"] == pytest.approx(3 * count / (3 * 0.076), rel=1e-4)
    assert figures["median_ttft_ms"] == pytest.approx(10.0)
    assert figures["median_tpot_ms"] == pytest.approx(1000 * decode / (count - 1), rel=1e-3)
    assert figures["mean_itl_ms"] == pytest.approx(1000 * decode / (count - 1), rel=1e-3)
    assert figures["median_itl_ms"] == pytest.approx(0.0)  # three chunks of four share a read
    assert None not in figures.values()
    table = benchmark.render_table(report)
    assert "3/3" in table
    assert "FLAGGED c1 random rep 1 stream 1: burst (955 tok/s; counted, as vllm bench serve counts it)" in table


def test_a_late_buffer_drained_chunk_by_chunk_is_flagged_as_a_burst() -> None:
    """The issue's numbers: 60 chunks within a millisecond, 'decode' at tens of thousands tok/s."""
    good = [spaced(0.0, 0.013, 0.0016, 60) for _ in range(2)]
    late = trickle(0.0, 0.2, 60, 0.000015)
    record = benchmark.decode_record(1, "random", 1, [late])["streams"][0]
    assert record["tok_s"] > 10_000
    assert record["flags"] == ["burst"]
    report = report_of([good[0]], [late], [good[1]])
    level = report["summary"]["decode"][0]
    assert [f["flags"] for f in level["flagged"]] == [["burst", "rate_outlier"]]
    assert level["flagged"][0]["tok_s"] > 10_000  # the impossible rate is in plain view
    assert level["per_stream_tok_s"]["n"] == 3
    assert level["per_stream_tok_s"]["median"] == pytest.approx(625, rel=1e-3)  # the median stands


def test_a_rate_far_beyond_the_rest_of_its_step_is_flagged() -> None:
    """Not a burst by its gaps (0.3 ms), but ten times its neighbours: flagged all the same."""
    normal = [spaced(0.0, 0.013, 0.003, 64) for _ in range(3)]
    fast = spaced(0.0, 0.013, 0.0003, 64)
    report = report_of(normal[:2], [normal[2], fast], conc=2)
    level = report["summary"]["decode"][0]
    assert report["decode"][1]["streams"][1]["flags"] == []
    assert [(f["rep"], f["stream"], f["flags"]) for f in level["flagged"]] == [(2, 1, ["rate_outlier"])]
    assert level["per_stream_tok_s"]["n"] == 4
    assert level["aggregate_tok_s"]["n"] == 2  # the repetition holding the outlier counts too
    assert "rate_outlier" in json.dumps(report["summary"])


def test_one_short_gap_is_not_a_burst_two_in_a_short_stream_are() -> None:
    assert benchmark.burst_flags(4, [0.002, 0.00001, 0.002]) == []
    assert benchmark.burst_flags(4, [0.00001, 0.00001, 0.002]) == ["burst"]
    assert benchmark.burst_flags(65, [0.0016] * 50 + [0.00001] * 13) == []  # a fifth: read in time
    assert benchmark.burst_flags(65, [0.0016] * 40 + [0.00001] * 23) == ["burst"]


def test_clean_streams_are_not_flagged() -> None:
    report = report_of([spaced(0.0, 0.013, 0.0016, 64), spaced(0.0, 0.014, 0.0017, 64)], conc=2)
    assert report["summary"]["decode"][0]["flagged"] == []
    assert "FLAGGED" not in benchmark.render_table(report)


# --- vLLM's vocabulary --------------------------------------------------------------------------


def test_the_summary_holds_vllms_figures_with_its_definitions() -> None:
    """TPOT = (E2EL - TTFT) / (tokens - 1); E2EL ends at the last chunk with a choice; output
    throughput = output tokens / (the step's first request sent -> its last finished)."""
    one = spaced(0.0, 0.010, 0.002, 11)  # E2EL 0.010 + 10 * 0.002 = 0.030 (the usage chunk is later)
    two = spaced(0.030, 0.050, 0.004, 11)  # sent as the first ended (one slot): E2EL 0.060
    report = report_of([one], [two])
    figures = report["summary"]["decode"][0]["vllm"]
    assert figures["completed"] == 2
    assert figures["max_concurrency"] == 1
    assert figures["total_input_tokens"] == 512
    assert figures["total_output_tokens"] == 22
    assert figures["duration"] == pytest.approx(0.030 + 0.060)
    assert figures["output_throughput"] == pytest.approx(22 / 0.090, rel=1e-4)
    assert figures["request_throughput"] == pytest.approx(2 / 0.090, rel=1e-4)
    assert figures["median_ttft_ms"] == pytest.approx(15.0)
    assert figures["mean_tpot_ms"] == pytest.approx(((0.030 - 0.010) / 10 + (0.060 - 0.020) / 10) / 2 * 1000)
    assert figures["median_itl_ms"] == pytest.approx(3.0)  # ten gaps of 2 ms and ten of 4 ms
    assert figures["median_e2el_ms"] == pytest.approx(45.0)
    assert figures["std_ttft_ms"] == pytest.approx(5.0)  # numpy.std: the population's
    assert set(figures) >= {
        f"{w}_{n}_ms" for w in ("mean", "median", "std", "p90", "p99") for n in ("ttft", "tpot", "itl", "e2el")
    }
    table = benchmark.render_table(report)
    assert "Serving, in `vllm bench serve` terms" in table
    assert "15.00/15.00/19.90" in table  # TTFT ms mean/median/p99


# --- bench compare against a `vllm bench serve --save-result` file -----------------------------


def vllm_file(path: Path, **overrides: Any) -> Path:
    result = {
        "date": "20261201-120000",
        "backend": "openai",
        "model_id": "m",
        "max_concurrency": 1,
        "duration": 0.1,
        "completed": 2,
        "failed": 0,
        "total_input_tokens": 512,
        "total_output_tokens": 22,
        "request_throughput": 20.0,
        "output_throughput": 220.0,
        "mean_ttft_ms": 15.0,
        "median_ttft_ms": 15.0,
        "std_ttft_ms": 5.0,
        "p99_ttft_ms": 19.9,
        "mean_tpot_ms": 3.0,
        "median_tpot_ms": 3.0,
        "p99_tpot_ms": 3.98,
        "mean_itl_ms": 3.0,
        "median_itl_ms": 3.0,
        "p99_itl_ms": 4.0,
        "mean_e2el_ms": 45.0,
        "median_e2el_ms": 45.0,
        "p99_e2el_ms": 59.7,
        "ttfts": [0.01, 0.02],
        "itls": [[0.002] * 10, [0.004] * 10],
        **overrides,
    }
    path.write_text(json.dumps(result), encoding="utf-8")
    return path


def test_compare_sets_our_report_next_to_a_vllm_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ours = tmp_path / "ours.json"
    ours.write_text(json.dumps(report_of([spaced(0.0, 0.010, 0.002, 11)], [spaced(0.030, 0.050, 0.004, 11)])))
    theirs = vllm_file(tmp_path / "vllm.json")
    assert main(["bench", "compare", str(theirs), str(ours), "--json"]) == 0
    rows = {row["metric"]: row for row in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["c1: TTFT ms median"]["a"] == 15.0
    assert rows["c1: TTFT ms median"]["b"] == pytest.approx(15.0)
    assert rows["c1: output tok/s"]["change_pct"] == pytest.approx(100 * (22 / 0.09 - 220) / 220, abs=0.01)
    assert rows["c1: TPOT ms median"]["better"] == "lower"
    assert main(["bench", "compare", str(ours), str(theirs)]) == 0
    text = capsys.readouterr().out
    assert "B vllm bench serve c1" in text.splitlines()[0]
    assert "c1: ITL ms median" in text


def test_compare_with_vllm_has_our_figures_when_every_stream_is_flagged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ours = tmp_path / "ours.json"
    ours.write_text(
        json.dumps(report_of(*[[in_bursts(0.076 * k, 0.076 * k + 0.010, 0.0011, 64, 4)] for k in range(3)]))
    )
    theirs = vllm_file(tmp_path / "vllm.json")
    assert main(["bench", "compare", str(theirs), str(ours), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [row["metric"] for row in rows if row["b"] is None] == []


def test_compare_refuses_a_vllm_result_it_cannot_place(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ours = tmp_path / "ours.json"
    ours.write_text(json.dumps(report_of([spaced(0.0, 0.010, 0.002, 11)])))
    unplaced = vllm_file(tmp_path / "unplaced.json", max_concurrency=None)
    assert main(["bench", "compare", str(ours), str(unplaced), "--json"]) == 1
    error = json.loads(capsys.readouterr().out)
    assert "without max_concurrency" in error["message"]
    assert "--max-concurrency N" in error["hint"]
    broken = vllm_file(tmp_path / "broken.json", median_ttft_ms="fast")
    assert main(["bench", "compare", str(ours), str(broken), "--json"]) == 1
    assert "median_ttft_ms is 'fast'" in json.loads(capsys.readouterr().out)["message"]
    negative = vllm_file(tmp_path / "negative.json", output_throughput=-1.0)
    assert main(["bench", "compare", str(ours), str(negative), "--json"]) == 1
    assert "output_throughput is -1.0" in json.loads(capsys.readouterr().out)["message"]


def broken_summary(report: benchmark.Report, change: Callable[[dict[str, Any]], None]) -> benchmark.Report:
    change(report["summary"]["decode"][0])
    return report


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda level: level.pop("vllm"), "was written before reports held vLLM's figures"),
        (lambda level: level.update(vllm=[1]), "summary.decode[0].vllm is not a set of figures"),
        (lambda level: level.update(vllm={"median_ttft_ms": "abc"}), "summary.decode[0].vllm is not a set"),
        (lambda level: level.pop("kind"), "summary.decode[0] has no kind"),
        (lambda level: level.update(flagged=[{"rep": "x"}]), "summary.decode[0].flagged is not a list"),
        (lambda level: level.update(kind="prose"), "no decode step of the random kind at concurrency 1"),
    ],
)
def test_compare_with_vllm_says_what_is_wrong_with_our_report(
    change: Callable[[dict[str, Any]], None], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An old, edited or mismatched report of ours: a located error, never a traceback."""
    ours = tmp_path / "ours.json"
    ours.write_text(json.dumps(broken_summary(report_of([spaced(0.0, 0.010, 0.002, 11)]), change)))
    theirs = vllm_file(tmp_path / "vllm.json")
    assert main(["bench", "compare", str(theirs), str(ours), "--json"]) == 1
    error = json.loads(capsys.readouterr().out)
    assert message in error["message"], error
    assert "internal error" not in error["message"]


def test_two_vllm_results_of_different_concurrency_are_not_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one, two = vllm_file(tmp_path / "c1.json"), vllm_file(tmp_path / "c2.json", max_concurrency=2)
    assert main(["bench", "compare", str(one), str(two), "--json"]) == 1
    assert "concurrency 1 and 2" in json.loads(capsys.readouterr().out)["message"]


def test_a_compressed_stream_is_refused_it_cannot_be_timed_chunk_by_chunk() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        assert request.headers["accept-encoding"] == "identity"
        return httpx.Response(200, headers={"content-encoding": "gzip"}, content=b"")

    async def run() -> None:
        headers = {"accept-encoding": "identity"}
        async with httpx.AsyncClient(
            transport=httpx.MockTransport(answer), base_url="http://x", headers=headers
        ) as http:
            await benchrun._timed_reads(http, "/v1/completions", b'{"stream": true}', lambda: 0.0)

    with pytest.raises(BenchError, match=r"the stream came compressed \(gzip\), so its chunks cannot be timed"):
        asyncio.run(run())


def test_the_streaming_client_asks_for_no_compression() -> None:
    http = async_client(ApiTarget("http://x", KEY, "m"), connections=2)
    assert http.headers["accept-encoding"] == "identity"
    assert http.headers["authorization"] == f"Bearer {KEY}"
    asyncio.run(http.aclose())


# --- a decode step sends as vllm bench serve --max-concurrency does ---------------------------


class Slots:
    """The server's record of the requests in order of events; r1s1 (slot 1's first request)
    is held until r3s0 (slot 0's third) has arrived, which only a client whose slots do not
    wait for each other (no waves of `conc` requests) ever sends."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.lock = threading.Lock()
        self.third_of_slot0 = threading.Event()

    def note(self, event: str) -> None:
        with self.lock:
            self.events.append(event)


def slots_handler(state: Slots) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            del format, args

        def do_GET(self) -> None:
            answer_models(self)

        def do_POST(self) -> None:
            name = json.loads(self.rfile.read(int(self.headers["content-length"])))["prompt"]
            state.note(f"{name} sent")
            if name == "r3s0":
                state.third_of_slot0.set()
            if name == "r1s1":
                state.third_of_slot0.wait(TURN_TIMEOUT_S)
            body = b"".join(chat_events(3))
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            state.note(f"{name} ended")
            self.wfile.write(body)

    return Handler


def test_a_slot_sends_its_next_request_when_its_last_ends_without_waiting_for_the_others() -> None:
    state = Slots()
    server = ThreadingHTTPServer(("127.0.0.1", 0), slots_handler(state))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        target = ApiTarget(f"http://127.0.0.1:{server.server_address[1]}", KEY, "m")
        bodies: list[list[dict[str, Any]]] = [
            [{"model": "m", "prompt": f"r{rep}s{slot}", "stream": True} for slot in (0, 1)] for rep in (1, 2, 3)
        ]
        origin, rows = benchrun.slotted_streams(target, "/v1/chat/completions", bodies)
    finally:
        server.shutdown()
        server.server_close()
    assert state.third_of_slot0.is_set()
    order = state.events
    assert order.index("r3s0 sent") < order.index("r1s1 ended"), "slot 0 went on while slot 1 was busy"
    for slot in (0, 1):
        for rep in (1, 2):
            assert order.index(f"r{rep}s{slot} ended") < order.index(f"r{rep + 1}s{slot} sent"), order
    assert [[stream.content for stream in row] for row in rows] == [["t0 t1 t2 "] * 2] * 3
    assert all(origin <= stream.sent for row in rows for stream in row)


@pytest.mark.parametrize("rates", [[10, 40, 100, 11, 20], [20, 11, 100, 40, 10]])
def test_which_streams_are_outliers_does_not_depend_on_their_order(rates: list[int]) -> None:
    report = report_of(*[[spaced(0.0, 0.010, 1 / rate, 16)] for rate in rates])
    flagged = report["summary"]["decode"][0]["flagged"]
    assert [(rates[entry["rep"] - 1], entry["flags"]) for entry in flagged] == [(100, ["rate_outlier"])]


def test_an_edited_report_the_plot_cannot_read_is_an_error_not_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    report = report_of([spaced(0.0, 0.010, 0.002, 11)], [spaced(0.030, 0.040, 0.002, 11)])
    report["decode"][0]["streams"] = "edited"
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(report), encoding="utf-8")
    assert main(["bench", "compare", str(path), str(path), "--plot", str(tmp_path / "p.png")]) == 1
    err = capsys.readouterr().err
    assert "cannot draw" in err
    assert "unedited" in err
    assert "internal error" not in err
