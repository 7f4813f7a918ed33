"""The bench's pictures: what they show (title, units, 8K/32K ticks, the repetitions' spread,
A against B), that they are real PNG files, and that without matplotlib the command says how
to add it instead of failing with an ImportError."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.image import imread
from matplotlib.text import Text

from reconciler.cli import main
from reconciler.errors import PlotUnavailableError
from reconciler.verify import benchmark, plot

MODEL = "deepseek-v4.1-flash"
STARTED = "2026-11-29T14:05:00Z"


def stream(tok_s: float) -> dict[str, Any]:
    return {
        "ttft_s": 0.3,
        "tpot_s": 1 / tok_s,
        "tok_s": tok_s,
        "itl_s": [1 / tok_s],
        "completion_tokens": 900,
        "t_first_s": 0.0,
        "t_last_s": 900 / tok_s,
    }


def bench_report(label: str, scale: float = 1.0, started: str = STARTED) -> benchmark.Report:
    """Prefill at 8192 and 32768, decode at 1 and 2 streams (prose, code), 3 repetitions, a recall
    check; every rate `scale` times the base, repetitions spread around it."""
    report = benchmark.new_report(label, MODEL, "http://10.10.10.10:8000", started, {"reps": 3, "max_tokens": None})
    for target, rate in ((8192, 5000.0), (32768, 4000.0)):
        for rep, jitter in enumerate((0.9, 1.0, 1.1), 1):
            tok_s = rate * scale * jitter
            report["prefill"].append(
                {"target": target, "rep": rep, "prompt_tokens": target, "ttft_s": target / tok_s, "tok_s": tok_s}
            )
    for conc in (1, 2):
        for kind, rate in (("prose", 40.0), ("code", 50.0)):
            for rep, jitter in enumerate((0.95, 1.0, 1.05), 1):
                streams = [stream(rate * scale * jitter * (1 + 0.1 * index)) for index in range(conc)]
                aggregate = sum(s["tok_s"] for s in streams)
                report["decode"].append(
                    {"conc": conc, "kind": kind, "rep": rep, "aggregate_tok_s": aggregate, "streams": streams}
                )
    report["recall"] = [
        {"length": 65536, "depth": 0.5, "prompt_tokens": 65000, "ttft_s": 14.0, "key": "1", "pass": True, "answer": ""}
    ]
    report["complete"] = True
    report["finished"] = STARTED
    report["summary"] = benchmark.summarize(report)
    return report


ROOT = Path(__file__).resolve().parents[2]


def texts(artist: Artist) -> list[str]:
    """Every text drawn in a figure or panel: titles, labels, ticks, notes, legends."""
    return [text.get_text() for text in artist.findobj(Text)]


def heading(figure: Figure) -> list[str]:
    """The title, the subtitle and the legend line above the panels, and a warning if any."""
    return [text.get_text() for text in figure.texts]


def panel(figure: Figure, title: str) -> Axes:
    return next(axes for axes in figure.axes if axes.get_title(loc="left") == title)


def ticks(axes: Axes) -> list[str]:
    return [label.get_text() for label in axes.get_xticklabels()]


def assert_png(path: Path, figure: Figure) -> None:
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(data) > 10_000  # a drawing, not a blank canvas
    width, height = figure.get_size_inches() * plot.DPI
    assert imread(path).shape[:2] == (round(height), round(width))


# --- one run ------------------------------------------------------------------------------------


def test_the_report_plot_is_a_png_of_the_figure(tmp_path: Path) -> None:
    report = bench_report("dspark-on")
    path = tmp_path / "bench.png"
    plot.write_report_plot(report, path)
    assert_png(path, plot.report_figure(report))


def test_the_title_names_the_run_the_model_and_the_date() -> None:
    figure = plot.report_figure(bench_report("dspark-on"))
    title, subtitle, legend = heading(figure)
    assert title == f"dspark-on · {MODEL}"
    assert subtitle == "2026-11-29 14:05 UTC · http://10.10.10.10:8000 · 3 repetitions · decode output uncapped"
    assert legend.startswith("points: medians; whiskers: lowest to highest repetition")


def test_axes_carry_units_and_token_counts_read_8k_and_32k() -> None:
    figure = plot.report_figure(bench_report("x"))
    prefill = panel(figure, "Prefill (unique prompts)")
    assert ticks(prefill) == ["8K", "32K"]
    assert (prefill.get_xlabel(), prefill.get_ylabel()) == ("prompt length (tokens)", "prefill rate (tok/s)")
    decode = panel(figure, "Decode")
    assert ticks(decode) == ["1", "2"]
    assert (decode.get_xlabel(), decode.get_ylabel()) == ("concurrent streams", "decode rate (tok/s)")
    legend = decode.get_legend()
    assert legend is not None
    assert [text.get_text() for text in legend.get_texts()] == [
        "prose, aggregate",
        "prose, per stream",
        "code, aggregate",
        "code, per stream",
    ]
    recall = panel(figure, "Long-context recall (pass key)")
    assert ticks(recall) == ["64K"]
    assert recall.get_ylabel() == "time to first token (s)"
    assert "PASS at depth 0.5" in texts(figure)


def test_the_spread_is_the_lowest_and_highest_repetition() -> None:
    report = bench_report("x")
    assert plot.prefill_points(report)[8192] == plot.Point(5000.0, 4500.0, 5500.0, "TTFT 1.64 s")
    aggregate = plot.decode_points(report, "aggregate_tok_s")[2, "code"]
    assert (aggregate.low, aggregate.median, aggregate.high) == pytest.approx((99.75, 105.0, 110.25))
    # Per stream: every stream of every repetition, so both of the two concurrent streams.
    per_stream = plot.decode_points(report, "per_stream_tok_s")[2, "code"]
    assert (per_stream.low, per_stream.high) == pytest.approx((47.5, 57.75))


def test_token_counts_are_named_as_context_sizes() -> None:
    names = [plot.token_label(n) for n in (512, 1500, 8192, 32768, 131072, 250000, 1 << 20)]
    assert names == ["512", "1.5K", "8K", "32K", "128K", "250K", "1M"]


def test_an_incomplete_or_empty_run_still_plots_and_says_so(tmp_path: Path) -> None:
    report = bench_report("x")
    report["complete"], report["error"] = False, "bench stopped: POST /v1/completions: HTTP 400"
    assert heading(plot.report_figure(report))[-1] == "INCOMPLETE: bench stopped: POST /v1/completions: HTTP 400"
    empty = benchmark.new_report("", MODEL, "http://x", "now", {})
    figure = plot.report_figure(empty)
    assert {"nothing measured", "INCOMPLETE: interrupted", MODEL} <= set(texts(figure))
    plot.write_report_plot(empty, tmp_path / "empty.png")
    assert_png(tmp_path / "empty.png", figure)


def test_a_run_with_only_some_parts_has_only_their_panels() -> None:
    report = bench_report("x")
    report["prefill"], report["recall"] = [], []
    report["summary"] = benchmark.summarize(report)
    assert [axes.get_title(loc="left") for axes in plot.report_figure(report).axes] == ["Decode"]


# --- A against B --------------------------------------------------------------------------------


def test_the_compare_plot_is_a_png_of_a_against_b(tmp_path: Path) -> None:
    a, b = bench_report("before"), bench_report("after", 1.25, "2026-11-30T09:12:00Z")
    path = tmp_path / "compare.png"
    plot.write_compare_plot(a, b, path, ("before", "after"))
    assert_png(path, plot.compare_figure(a, b, ("before", "after")))


def test_the_comparison_names_both_runs_and_shows_bs_change() -> None:
    a, b = bench_report("before"), bench_report("after", 1.25, "2026-11-30T09:12:00Z")
    figure = plot.compare_figure(a, b, ("before", "after"))
    title, subtitle, _ = heading(figure)
    assert title == "A before  vs  B after"
    assert subtitle == f"A: {MODEL}, 2026-11-29 14:05 UTC  ·  B: {MODEL}, 2026-11-30 09:12 UTC"
    assert [axes.get_title(loc="left") for axes in figure.axes] == [
        "Prefill",
        "Decode, per stream",
        "Decode, aggregate",
        "Long-context recall",
    ]
    prefill = panel(figure, "Prefill")
    assert ticks(prefill) == ["8K", "32K"]
    assert prefill.get_ylabel() == "prefill rate (tok/s)"
    assert ticks(panel(figure, "Decode, aggregate")) == [
        "prose\n1 stream",
        "prose\n2 streams",
        "code\n1 stream",
        "code\n2 streams",
    ]
    assert texts(figure).count("+25.0%") == 2 + 4 + 4  # every rate of B is 25 % higher
    assert {"A before", "B after"} <= set(texts(figure))


def test_a_key_only_one_run_measured_gets_one_bar_and_no_change() -> None:
    a = bench_report("before")
    b = bench_report("after", 0.8)
    b["decode"] = [record for record in b["decode"] if record["conc"] == 1]
    b["prefill"] = [record for record in b["prefill"] if record["target"] == 8192]
    b["summary"] = benchmark.summarize(b)
    prefill = next(panel for panel in plot.comparisons(a, b) if panel.title == "Prefill")
    assert [(pair.name, pair.a is not None, pair.b is not None) for pair in prefill.pairs] == [
        ("8K", True, True),
        ("32K", True, False),
    ]
    figure = plot.compare_figure(a, b, ("before", "after"))
    assert texts(panel(figure, "Prefill")).count("-20.0%") == 1


# --- without matplotlib -------------------------------------------------------------------------


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if matplotlib were not installed: None in sys.modules makes every import of it fail
    (each submodule too, or an import of one already loaded would still succeed)."""
    for name in [name for name in sys.modules if name == "matplotlib" or name.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.usefixtures("no_matplotlib")
def test_without_matplotlib_the_plot_says_how_to_add_it(tmp_path: Path) -> None:
    with pytest.raises(PlotUnavailableError) as missing:
        plot.write_report_plot(bench_report("x"), tmp_path / "bench.png")
    assert (missing.value.message, missing.value.hint) == (plot.MISSING, plot.HOW_TO_ADD)
    assert plot.NOT_INSTALLED == (
        "no plot: matplotlib is not installed; "
        "`pipx inject spark-reconciler matplotlib` or `pip install 'spark-reconciler[plot]'` adds it"
    )
    with pytest.raises(PlotUnavailableError):
        plot.write_compare_plot(bench_report("a"), bench_report("b"), tmp_path / "c.png", ("a", "b"))
    assert not list(tmp_path.iterdir())


def test_the_command_line_starts_without_importing_matplotlib() -> None:
    code = "import sys, reconciler.cli; print(sorted(m for m in sys.modules if m.startswith('matplotlib')))"
    started = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert started.stdout == "[]\n"


# --- the command line ---------------------------------------------------------------------------


def saved(tmp_path: Path, name: str, report: benchmark.Report) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(report), encoding="utf-8")
    return str(path)


def test_bench_compare_draws_a_against_b_beside_b(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = saved(tmp_path, "before.json", bench_report("before"))
    b = saved(tmp_path, "after.json", bench_report("after", 1.25))
    assert main(["bench", "compare", a, b]) == 0
    assert f"plot: {tmp_path / 'after-vs-before.png'}" in capsys.readouterr().err
    assert (tmp_path / "after-vs-before.png").read_bytes().startswith(b"\x89PNG")
    assert main(["bench", "compare", a, b, "--json", "--plot", str(tmp_path / "ab.png")]) == 0
    assert json.loads(capsys.readouterr().out)["rows"]
    assert (tmp_path / "ab.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.usefixtures("no_matplotlib")
def test_bench_compare_without_matplotlib_prints_the_table_and_how_to_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = saved(tmp_path, "before.json", bench_report("before"))
    b = saved(tmp_path, "after.json", bench_report("after", 1.25))
    assert main(["bench", "compare", a, b]) == 0
    out, err = capsys.readouterr()
    assert "tok/s per stream median" in out
    assert err == plot.NOT_INSTALLED + "\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["after.json", "before.json"]
