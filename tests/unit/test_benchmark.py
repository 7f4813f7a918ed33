"""`reconciler bench`: its numbers against the engine stand-in's known rates, the report saved
after every step, failures and interruptions keeping what was measured, the metric arithmetic
on synthetic timings, the table and the comparison (the plots: tests/unit/test_plot.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli import main
from reconciler.errors import BenchError, StreamError
from reconciler.verify import benchmark
from reconciler.verify.apiclient import ApiTarget
from reconciler.verify.benchrun import BenchRun, BenchSettings
from tests.ports import free_port
from tests.unit.test_engine_standin import KEY, MODEL, Launcher, single_argv, wait_healthy

TOKEN_DELAY_S = 0.02  # the stand-in's seconds per generated token: 50 tok/s per stream
PREFILL_DELAY_S = 0.0001  # seconds per prompt token: 10 000 tok/s of prefill
MAX_MODEL_LEN = 65536
TOLERANCE = 0.2


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    launcher = Launcher(tmp_path_factory.mktemp("bench"))
    port = free_port()
    argv = single_argv(
        launcher.model_dir,
        port,
        *("--max-model-len", str(MAX_MODEL_LEN), "--reasoning-parser", "deepseek_v41"),
    )
    env = {
        "VLLM_API_KEY": KEY,
        "ENGINE_TOKEN_DELAY_S": str(TOKEN_DELAY_S),
        "ENGINE_PREFILL_TOKEN_DELAY_S": str(PREFILL_DELAY_S),
    }
    engine = launcher.start(argv, env)
    try:
        wait_healthy(engine, f"http://127.0.0.1:{port}")
        yield f"http://127.0.0.1:{port}"
    finally:
        launcher.close()


def near(measured: float, truth: float, tolerance: float = TOLERANCE) -> bool:
    return abs(measured - truth) <= tolerance * truth


# The stand-in paces its tokens with sleeps, which a loaded machine can only stretch: measured
# against its known rates, a time may come out longer and a rate lower, by any amount, but never
# shorter or higher than the tolerance allows; a client that read in bursts or ahead of the
# engine would be. How much longer is not bounded by the truth but checked against the run's own
# measurements (`assert_timeline`), which a slow machine cannot make disagree.


def not_shorter(measured: float, truth: float) -> bool:
    return measured >= (1 - TOLERANCE) * truth


def not_faster(measured: float, truth: float) -> bool:
    return measured <= (1 + TOLERANCE) * truth


def assert_timeline(stream: dict[str, Any], wall_s: float) -> None:
    """A decode stream's numbers agree with each other and with the run's own duration."""
    gaps = sum(stream["itl_s"])
    assert 0 <= stream["sent_s"] < stream["t_first_s"] <= stream["t_last_s"]
    assert 0 < stream["ttft_s"] < stream["latency_s"] < wall_s
    assert stream["t_first_s"] == pytest.approx(stream["sent_s"] + stream["ttft_s"], abs=1e-5)
    # The stand-in's last token carries the finish: the latency ends at the last output chunk,
    # not at the usage chunk or [DONE] after it, so the gaps fill exactly latency - TTFT.
    assert gaps == pytest.approx(stream["latency_s"] - stream["ttft_s"], abs=1e-4)
    assert stream["t_last_s"] - stream["t_first_s"] == pytest.approx(gaps, abs=1e-4)
    tokens = stream["completion_tokens"]
    assert stream["tpot_s"] == pytest.approx(gaps / (tokens - 1), rel=1e-3)
    assert stream["tok_s"] == pytest.approx((tokens - 1) / gaps, rel=1e-3)


def bench(url: str, out: Path, **settings: Any) -> BenchRun:
    return BenchRun(ApiTarget(url, KEY, MODEL), BenchSettings(**settings), out)


# --- numbers against ground truth ---------------------------------------------------------------


def test_the_numbers_match_the_standins_known_rates(url: str, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    run = bench(url, out, conc=(1, 2), prefill=(4096,), kinds=("prose",), ctx=(2000,), reps=1)
    began = time.monotonic()
    report = run.run()
    wall_s = time.monotonic() - began
    assert json.loads(out.read_text(encoding="utf-8")) == report
    assert report["complete"] is True
    summary = report["summary"]

    prefill = summary["prefill"][0]
    assert prefill["prompt_tokens"] == 4096
    # The stand-in's TTFT: the prompt's prefill delay, then one token's delay.
    true_ttft = 4096 * PREFILL_DELAY_S + TOKEN_DELAY_S
    assert not_shorter(prefill["ttft_s"]["median"], true_ttft)
    assert prefill["ttft_s"]["median"] < wall_s
    assert not_faster(prefill["tok_s"]["median"], 4096 / true_ttft)
    assert prefill["tok_s"]["median"] == pytest.approx(4096 / prefill["ttft_s"]["median"], rel=1e-3)

    streams = [stream for rep in report["decode"] for stream in rep["streams"]]
    assert len(streams) == 3
    for stream in streams:
        # One token per chunk in the stand-in, so the usage count must equal the chunks seen.
        assert stream["tokens_from_usage"] is True
        assert stream["completion_tokens"] == stream["chunks"] > 10
        assert len(stream["itl_s"]) == stream["chunks"] - 1
        assert_timeline(stream, wall_s)
        assert not_shorter(stream["ttft_s"], stream["prompt_tokens"] * PREFILL_DELAY_S + TOKEN_DELAY_S)
        assert not_shorter(stream["latency_s"], stream["completion_tokens"] * TOKEN_DELAY_S)

    one, two = summary["decode"]
    for level in (one, two):
        assert not_faster(level["per_stream_tok_s"]["median"], 1 / TOKEN_DELAY_S)
        assert not_shorter(level["tpot_s"]["mean"], TOKEN_DELAY_S)
        assert not_shorter(level["itl_s"]["mean"], TOKEN_DELAY_S)
        assert not_shorter(level["itl_s"]["median"], TOKEN_DELAY_S)
    (alone,), (first, second) = (rep["streams"] for rep in report["decode"])
    assert not_faster(one["aggregate_tok_s"]["median"], alone["tok_s"])
    assert not_faster(two["aggregate_tok_s"]["median"], 2 / TOKEN_DELAY_S)
    # The two streams of c2 ran at once: each began before the other ended, so the engine's
    # output over their span is more than either stream's own.
    assert first["t_first_s"] < second["t_last_s"]
    assert second["t_first_s"] < first["t_last_s"]
    assert two["aggregate_tok_s"]["median"] > max(first["tok_s"], second["tok_s"])

    recall = summary["recall"][0]
    assert recall["pass"] is True
    assert near(recall["prompt_tokens"], 2000, 0.05)
    assert not_shorter(recall["ttft_s"], recall["prompt_tokens"] * PREFILL_DELAY_S + TOKEN_DELAY_S)
    assert recall["ttft_s"] < wall_s


def test_the_random_kind_sends_vllms_workload(url: str, tmp_path: Path) -> None:
    """Random ids of --input-len through /v1/completions, EOS ignored, --max-tokens out."""
    run = bench(
        url, tmp_path / "bench.json", conc=(2,), prefill=(), kinds=("random",), reps=1, max_tokens=8, input_len=64
    )
    body = run._decode_body(MODEL, "random")
    assert (len(body["prompt"]), body["max_tokens"], body["ignore_eos"], body["stream"]) == (64, 8, True, True)
    report = run.run()
    (level,) = report["summary"]["decode"]
    assert (level["conc"], level["kind"], level["vllm"]["completed"]) == (2, "random", 2)
    assert level["vllm"]["total_input_tokens"] == 128  # from usage: one token per id
    assert all(stream["completion_tokens"] == 8 for stream in report["decode"][0]["streams"])


def test_the_report_is_written_after_every_step(url: str, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    seen: list[tuple[str, int]] = []

    def progress(message: str) -> None:
        report = json.loads(out.read_text(encoding="utf-8"))
        seen.append((message.split(",")[0], len(report["prefill"]) + len(report["decode"])))

    run = bench(url, out, conc=(1,), prefill=(256,), kinds=("prose",), reps=2)
    run.progress = progress
    run.run()
    # When a step's progress line is shown, the file on disk already holds that step.
    assert [count for _, count in seen] == [0, 1, 2, 4]  # a decode step holds its repetitions
    assert [what for what, _ in seen[1:]] == ["prefill 256 tokens"] * 2 + ["decode c1 prose"]
    assert seen[0][0].startswith("warm-up done in ")
    assert json.loads(out.read_text(encoding="utf-8"))["complete"] is True


def test_the_warm_up_is_capped_so_a_model_that_never_stops_cannot_stall_it(tmp_path: Path) -> None:
    sent: list[dict[str, Any]] = []

    class Recording:
        def post(self, path: str, json: dict[str, Any]) -> Any:
            sent.append({"path": path, **json})
            return type("Answer", (), {"status_code": 200})()

    run = bench("http://127.0.0.1:9", tmp_path / "bench.json")
    run._warm_up(Recording(), MODEL)  # type: ignore[arg-type]
    assert sent == [
        {
            "path": "/v1/chat/completions",
            "model": MODEL,
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 32,
        }
    ]


def test_an_interrupted_run_keeps_what_it_measured(url: str, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    run = bench(url, out, conc=(1,), prefill=(256,), kinds=("prose",), reps=3)

    def stop_after_two(message: str) -> None:
        if message.startswith("prefill 256 tokens, rep 2/3"):
            raise KeyboardInterrupt

    run.progress = stop_after_two
    with pytest.raises(KeyboardInterrupt):
        run.run()
    run.interrupted()
    saved = json.loads(out.read_text(encoding="utf-8"))
    assert (saved["complete"], saved["error"]) == (False, "interrupted")
    assert [record["rep"] for record in saved["prefill"]] == [1, 2]
    assert saved["summary"]["prefill"][0]["runs"] == 2
    assert saved["decode"] == []


def test_a_failing_step_stops_the_bench_and_keeps_the_steps_before(url: str, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    run = bench(url, out, conc=(1,), prefill=(256, MAX_MODEL_LEN + 1), kinds=("prose",), reps=1)
    with pytest.raises(BenchError) as failed:
        run.run()
    assert failed.value.message.startswith(
        f"bench stopped: POST /v1/completions: HTTP 400: This model's maximum context length is {MAX_MODEL_LEN}"
    )
    assert failed.value.hint == f"{out} keeps what was measured before it (1 steps)"
    saved = json.loads(out.read_text(encoding="utf-8"))
    assert saved["complete"] is False
    assert saved["error"].startswith("POST /v1/completions: HTTP 400")
    assert len(saved["prefill"]) == 1


# --- the command line ---------------------------------------------------------------------------


def test_cli_bench_prints_the_table_writes_json_and_plot(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(KEY, encoding="utf-8")
    out = tmp_path / "run.json"
    argv = ["bench", url, "--out", str(out), "--key-file", str(key_file), "--label", "standin"]
    argv += ["--conc", "1", "--prefill", "256", "--kinds", "code", "--reps", "1", "--ctx", "1000", "--depth", "0.1"]
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out.startswith(f"bench standin model {MODEL} at {url}\n")
    assert "Prefill (prompt tokens / TTFT, unique prompts)" in captured.out
    assert "Decode (no output cap)" in captured.out
    assert "   1000    0.1" in captured.out
    assert captured.out.rstrip().endswith("PASS")
    assert "warm-up done" in captured.err
    assert KEY not in captured.out + captured.err
    assert json.loads(out.read_text(encoding="utf-8"))["settings"]["depth"] == 0.1
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert f"plot: {out.with_suffix('.png')}" in captured.err


def test_cli_bench_needs_out(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "http://127.0.0.1:9", "--key-file", "/nonexistent", "--json"]) == 1
    assert "bench needs --out FILE" in json.loads(capsys.readouterr().out)["message"]


# --- arithmetic on synthetic timings ------------------------------------------------------------


def sse(*chunks: object) -> list[str]:
    return [f"data: {json.dumps(chunk)}" for chunk in chunks] + ["", "data: [DONE]"]


def delta(**fields: object) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}


def clock(*times: float) -> Iterator[float]:
    return iter(times)


def test_a_stream_is_timed_at_its_output_chunks() -> None:
    lines = sse(
        delta(role="assistant", content=""),
        delta(reasoning_content="Hmm"),
        delta(content="4"),
        delta(content="2"),
        {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 5}},
    )
    times = clock(1.0, 1.5, 1.6, 1.8, 1.85, 1.9)
    stream = benchmark.read_stream(0.5, lines, lambda: next(times))
    # The role-only chunk is no output; the last chunk with a choice ends the latency (E2EL),
    # as in vLLM's bench: the usage chunk after it carries no token.
    assert stream.output_times == (1.5, 1.6, 1.8)
    assert (stream.first_choice, stream.last_choice, stream.end, stream.content) == (1.0, 1.8, 1.85, "42")
    assert (stream.completion_tokens, stream.prompt_tokens) == (5, 9)
    record = benchmark.decode_stream_record(stream, origin=0.5)
    assert record["ttft_s"] == 1.0
    assert record["latency_s"] == 1.3
    assert record["tpot_s"] == pytest.approx((1.3 - 1.0) / 4)
    assert record["tok_s"] == pytest.approx(4 / 0.3)  # speculative decoding: 5 tokens in 3 chunks
    assert record["itl_s"] == pytest.approx([0.1, 0.2])
    assert (record["t_first_s"], record["t_last_s"]) == (1.0, 1.3)


def test_without_a_usage_chunk_output_chunks_are_counted() -> None:
    times = clock(1.0, 2.0, 3.0)
    stream = benchmark.read_stream(0.0, sse(delta(content="a"), delta(content="b")), lambda: next(times))
    record = benchmark.decode_stream_record(stream, 0.0)
    assert (record["completion_tokens"], record["tokens_from_usage"], record["tok_s"]) == (2, False, 1.0)


def test_an_error_chunk_or_an_empty_stream_cannot_be_measured() -> None:
    with pytest.raises(StreamError, match="the stream carried an error"):
        benchmark.read_stream(0.0, sse({"error": {"message": "EngineCore died"}}), lambda: 1.0)
    empty = benchmark.read_stream(0.0, sse(delta(role="assistant")), lambda: 1.0)
    with pytest.raises(StreamError, match="no output"):
        benchmark.decode_stream_record(empty, 0.0)


def evenly(first: float, count: int, gap: float) -> dict[str, Any]:
    """A decode stream record of `count` one-token chunks, `gap` apart from `first`."""
    return {
        "completion_tokens": count,
        "t_first_s": first,
        "t_last_s": first + gap * (count - 1),
        "itl_s": [gap] * (count - 1),
    }


def test_aggregate_counts_tokens_after_the_first_over_the_shared_span() -> None:
    streams = [evenly(1.0, 11, 0.1), evenly(1.5, 11, 0.15)]
    assert benchmark.aggregate_tok_s(streams) == 10.5
    assert benchmark.aggregate_tok_s(streams[:1]) == 10.0  # one stream: its own rate


def test_the_aggregate_counts_the_last_chunk_whatever_the_rounding_of_the_gaps() -> None:
    """Each stored gap is rounded to a microsecond, the same way for a steady engine: 47 gaps of
    21.4165 ms stored as 21.417 ms add up to 23.5 us past the stored last chunk, and that chunk
    still counts (it did not: a c1 aggregate read 15 tokens of 16)."""
    last = round(1.0 + 47 * 0.0214165, 6)
    rounded = {"completion_tokens": 48, "t_first_s": 1.0, "t_last_s": last, "itl_s": [0.021417] * 47}
    own_rate = 47 / (last - 1.0)
    assert benchmark.aggregate_tok_s([rounded]) == pytest.approx(own_rate, rel=1e-6)


def test_the_aggregate_of_drifted_slots_is_what_the_engine_delivered_meanwhile() -> None:
    """Two slots at 50 tok/s each, one answering 100 tokens, the other 1000: the k-th requests
    hardly overlap, but the engine delivered 100 tok/s all along while both slots ran."""
    short = [evenly(2.0 * k, 100, 0.02) for k in range(10)]  # back to back, 2 s each
    long = [evenly(0.0, 1000, 0.02)]
    records = [{"rep": 1, "streams": [short[0], long[0]]}] + [
        {"rep": k + 1, "streams": [short[k]]} for k in range(1, 10)
    ]
    aggregates = [record["aggregate_tok_s"] for record in benchmark.with_step_aggregates(records)]
    # Counted by request index alone, the first pair would read (1100 - 1) / 19.98 s = 55 tok/s.
    assert all(value == pytest.approx(100, rel=0.03) for value in aggregates), aggregates
    # Each stream counted on its own would make it look like half the engine's rate.
    assert benchmark.aggregate_tok_s(short[3:4]) == pytest.approx(50, rel=0.01)


def test_prefill_rate_is_prompt_tokens_over_ttft() -> None:
    lines = sse(
        {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": 8000}},
    )
    times = clock(2.5, 2.6, 2.7)
    record = benchmark.prefill_record(8192, 1, benchmark.read_stream(0.5, lines, lambda: next(times)), 8192)
    assert record == {"target": 8192, "rep": 1, "prompt_tokens": 8000, "ttft_s": 2.0, "tok_s": 4000.0}


def test_percentiles_follow_numpy() -> None:
    assert benchmark.percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)
    assert benchmark.percentile([5.0], 99) == 5.0
    assert benchmark.stats([3.0, None, 1.0, 2.0]) == {
        "mean": 2.0,
        "median": 2.0,
        "p90": pytest.approx(2.8),
        "p99": pytest.approx(2.98),
        "n": 3,
    }
    assert benchmark.stats([None]) is None


def test_prompts_are_unique_and_the_needle_sits_at_its_depth() -> None:
    assert benchmark.decode_prompt("code", "abc") != benchmark.decode_prompt("code", "abd")
    prompt = benchmark.recall_prompt(4000, 0.25, "48213", "n1")
    assert len(prompt) == pytest.approx(4000 * benchmark.CHARS_PER_TOKEN, rel=0.02)
    assert prompt.index("The pass key is 48213") / len(prompt) == pytest.approx(0.25, abs=0.02)
    assert prompt.endswith(benchmark.RECALL_QUESTION)


def test_a_recall_answer_without_the_key_fails() -> None:
    stream = benchmark.Stream(0.0, (1.0,), 1.0, 2.0, 3, 4000, "The pass key is 12345.")
    assert benchmark.recall_record(4000, 0.5, "48213", stream)["pass"] is False
    assert benchmark.recall_record(4000, 0.5, "12345", stream)["pass"] is True


# --- reports: table, compare --------------------------------------------------------------------


def synthetic(label: str, scale: float) -> benchmark.Report:
    """A report built from fixed numbers: decode `scale` times faster than the base."""
    report = benchmark.new_report(label, MODEL, "http://x", "2026-11-29T00:00:00Z", {"max_tokens": None})
    report["prefill"] = [{"target": 8192, "rep": 1, "prompt_tokens": 8192, "ttft_s": 4.0, "tok_s": 2048.0}]
    stream = {
        "ttft_s": 0.2,
        "latency_s": 0.2 + 399 * 0.025 / scale,
        "tpot_s": 0.025 / scale,
        "tok_s": 40.0 * scale,
        "itl_s": [0.025 / scale] * 3,
        "completion_tokens": 400,
    }
    report["decode"] = [{"conc": 1, "kind": "code", "rep": 1, "aggregate_tok_s": 40.0 * scale, "streams": [stream]}]
    report["recall"] = [{"length": 32768, "depth": 0.5, "prompt_tokens": 32000, "ttft_s": 16.0, "pass": scale > 1}]
    report["complete"] = True
    report["summary"] = benchmark.summarize(report)
    return report


def test_compare_shows_the_change_and_whether_it_is_better(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = {row["metric"]: row for row in benchmark.compare(synthetic("base", 1.0), synthetic("new", 1.5))}
    assert rows["decode c1 code: tok/s per stream median"]["change_pct"] == 50.0
    assert rows["decode c1 code: TPOT ms mean"]["change_pct"] == pytest.approx(-33.33)
    assert rows["prefill 8192: tok/s median"]["change_pct"] == 0.0
    assert (rows["recall 32768 at depth 0.5"]["a"], rows["recall 32768 at depth 0.5"]["b"]) == ("FAIL", "PASS")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(synthetic("base", 1.0)), encoding="utf-8")
    b.write_text(json.dumps(synthetic("new", 1.5)), encoding="utf-8")
    assert main(["bench", "compare", str(a), str(b)]) == 0
    text = capsys.readouterr().out
    assert "A base" in text.splitlines()[0]
    assert "B new" in text.splitlines()[0]
    tok_s = next(line for line in text.splitlines() if "tok/s per stream median" in line)
    assert tok_s.split()[-2:] == ["+50.0%", "(better)"]
    tpot = next(line for line in text.splitlines() if "TPOT ms mean" in line)
    assert tpot.split()[-2:] == ["-33.3%", "(better)"]
    assert main(["bench", "compare", str(a), str(b), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["rows"]) == len(rows)


def test_compare_refuses_what_is_not_a_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other.json"
    other.write_text("{}", encoding="utf-8")
    assert main(["bench", "compare", str(other), str(other), "--json"]) == 1
    assert "is not a bench report" in json.loads(capsys.readouterr().out)["message"]


def _each_number(value: object, change: Callable[[float], object]) -> object:
    if isinstance(value, dict):
        return {key: _each_number(item, change) for key, item in value.items()}
    if isinstance(value, list):
        return [_each_number(item, change) for item in value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return change(value)
    return value


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda _v: float("nan"), "is nan"),
        (lambda v: -v - 1, "is -"),
        (lambda _v: 10**30, "is 1000000000000000000000000000000"),
        (lambda _v: "x", "has no target"),
        (lambda _v: None, "has no target"),
    ],
)
def test_compare_refuses_a_report_with_impossible_numbers_and_says_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: Callable[[float], object], said: str
) -> None:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    report = synthetic("base", 1.0)
    report["summary"] = benchmark.summarize(report)
    good.write_text(json.dumps(report), encoding="utf-8")
    edited = _each_number(report, change)
    assert isinstance(edited, dict)
    bad.write_text(json.dumps({**edited, "format": benchmark.FORMAT}), encoding="utf-8")
    assert main(["bench", "compare", str(good), str(bad), "--json"]) == 1
    message = json.loads(capsys.readouterr().out)["message"]
    assert f"{bad} is not a bench report this version can read: " in message
    assert said in message


def test_the_table_lists_every_section_and_flags_an_incomplete_run() -> None:
    report = synthetic("base", 1.0)
    table = benchmark.render_table(report)
    assert "tok/s/stream med" in table
    assert "  8192        8192        2048.0          4.000     1" in table
    assert "25.0/25.0/25.0" in table  # TPOT and ITL in ms
    assert "FAIL" in table
    report["complete"], report["error"] = False, "interrupted"
    assert benchmark.render_table(report).rstrip().endswith("INCOMPLETE: interrupted")
