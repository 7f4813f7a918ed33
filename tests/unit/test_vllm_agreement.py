"""bench/vllm_agreement.py's arithmetic (bench/agreement.py): both tools' requests pooled as
vLLM's calculate_metrics counts them, each slot's first request left out, flagged streams of
ours counted, and the median of the rounds' differences."""

from __future__ import annotations

import pytest

from bench import agreement
from tests.unit.test_bench_reading import in_bursts, report_of, spaced


def test_a_vllm_result_is_pooled_without_each_slots_first_request() -> None:
    saved = {
        "ttfts": [0.5, 0.010, 0.012],  # the first: at an idle engine, its prompt cached
        "itls": [[0.002] * 3, [0.002] * 3, [0.004] * 3],
        "output_lens": [4, 4, 4],
        "duration": 0.1,
    }
    pooled = agreement.from_vllm_result(saved, conc=1)
    assert len(pooled.requests) == 2
    assert (pooled.tokens, pooled.duration) == (12, 0.1)  # the throughput counts every request
    figures = agreement.vllm_figures(pooled)
    assert figures["median_ttft_ms"] == pytest.approx(11.0)
    assert figures["mean_ttft_ms"] == pytest.approx(11.0)
    assert figures["median_tpot_ms"] == pytest.approx(3.0)  # (E2EL - TTFT) / 3: 2 and 4 ms
    assert figures["median_itl_ms"] == pytest.approx(3.0)
    assert figures["output_throughput"] == pytest.approx(120.0)


def test_our_report_is_pooled_from_repetition_2_on_flagged_streams_included() -> None:
    first = spaced(0.0, 0.100, 0.002, 11)  # slow: the idle engine's first request
    bursty = in_bursts(0.120, 0.130, 0.002, 12, 4)
    last = spaced(0.160, 0.170, 0.002, 11)
    report = report_of([first], [bursty], [last])
    assert report["summary"]["decode"][0]["flagged"][0]["rep"] == 2
    pooled = agreement.from_our_report(report)
    assert [round(r["ttft"], 6) for r in pooled.requests] == [0.010, 0.010]
    figures = report["summary"]["decode"][0]["vllm"]
    assert (pooled.tokens, pooled.duration) == (figures["total_output_tokens"], figures["duration"])
    ours = agreement.vllm_figures(pooled)
    assert ours["output_throughput"] == pytest.approx(figures["output_throughput"], rel=1e-4)
    tpots = [stream["tpot_s"] * 1000 for rep in report["decode"][1:] for stream in rep["streams"]]
    assert ours["median_tpot_ms"] == pytest.approx(sum(tpots) / 2, rel=1e-3)  # the records hold µs


def test_the_rounds_differences_and_their_median() -> None:
    def figures(value: float, itl: float) -> agreement.Figures:
        return {key: itl if key == "median_itl_ms" else value for key in agreement.FIGURES}

    rounds = [
        (figures(10, 0.0), figures(11, 0.0)),
        (figures(10, 1.0), figures(9, 1.5)),
        (figures(10, 1.0), figures(30, 1.0)),
    ]
    changes = agreement.differences(rounds)
    assert changes["median_tpot_ms"] == pytest.approx([0.1, -0.1, 2.0])
    assert agreement.median_difference(changes["median_tpot_ms"]) == pytest.approx(0.1)  # one odd round cannot move it
    assert changes["median_itl_ms"][0] is None  # vLLM's 0: no ratio
    assert agreement.median_difference(changes["median_itl_ms"]) == pytest.approx(0.25)
    assert agreement.median_difference([None]) is None
    line = agreement.figure_line(2, "median_itl_ms", 1.0, 1.25, changes["median_itl_ms"])
    assert line.endswith("by round - +50.0% +0.0% -> +25.0%")


def test_a_vllm_result_with_failed_requests_is_refused_not_averaged() -> None:
    """vLLM's bench exits 0 with a failed request in its file (TTFT 0, no tokens): pooled, it would
    pull the TTFT figures down."""
    saved = {
        "ttfts": [0.010, 0.0],
        "itls": [[0.002] * 3, []],
        "output_lens": [4, 0],
        "duration": 0.1,
        "failed": 1,
        "errors": ["", "Traceback ... ClientConnectorError"],
    }
    with pytest.raises(ValueError, match="1 of its requests failed"):
        agreement.from_vllm_result(saved, conc=1)


def metrics_page(ttft_sum: float, ttft_count: int, itl_sum: float, itl_count: int) -> str:
    """A /metrics page as vLLM serves it: help and type lines, labels, buckets, other series."""
    labels = '{engine="0",model_name="deepseek-v4.1-flash"}'
    return "\n".join(
        [
            "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.",
            "# TYPE vllm:time_to_first_token_seconds histogram",
            f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.001"}} {ttft_count}',
            f"vllm:time_to_first_token_seconds_sum{labels} {ttft_sum}",
            f"vllm:time_to_first_token_seconds_count{labels} {ttft_count}",
            f"vllm:inter_token_latency_seconds_sum{labels} {itl_sum}",
            f"vllm:inter_token_latency_seconds_count{labels} {itl_count}.0",
            f"vllm:request_prefill_time_seconds_sum{labels} 99.0",
            f"vllm:num_requests_running{labels} 1.0",
        ]
    )


def test_the_engines_figures_are_its_histograms_over_the_requests_served_in_between() -> None:
    before = agreement.histogram_totals(metrics_page(1.0, 10, 2.0, 100))
    after = agreement.histogram_totals(metrics_page(1.3, 16, 2.9, 160))
    figures = agreement.server_figures(before, after)
    assert figures["server_mean_ttft_ms"] == pytest.approx(50.0)  # 0.3 s over 6 first tokens
    assert figures["server_mean_itl_ms"] == pytest.approx(15.0)  # 0.9 s over 60 gaps
    assert agreement.server_figures(after, after) == {"server_mean_ttft_ms": None, "server_mean_itl_ms": None}


def test_the_engines_differences_are_taken_round_by_round_and_skip_a_run_it_did_not_see() -> None:
    rounds: list[tuple[dict[str, float | None], dict[str, float | None]]] = [
        (
            {"server_mean_ttft_ms": 40.0, "server_mean_itl_ms": 15.0},
            {"server_mean_ttft_ms": 44.0, "server_mean_itl_ms": 15.0},
        ),
        (
            {"server_mean_ttft_ms": 40.0, "server_mean_itl_ms": None},
            {"server_mean_ttft_ms": 36.0, "server_mean_itl_ms": 12.0},
        ),
    ]
    changes = agreement.engine_differences(rounds)
    assert changes["server_mean_ttft_ms"] == [pytest.approx(0.1), pytest.approx(-0.1)]
    assert changes["server_mean_itl_ms"] == [pytest.approx(0.0), None]
