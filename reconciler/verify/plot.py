"""The bench's pictures: one run's plot, and run A against run B.

matplotlib is an optional extra (`spark-reconciler[plot]`): its wheels (numpy, Pillow,
fonttools) are a lot to put on a DGX Spark head that only serves, and importing it takes a
good part of a second, so it is imported only when a plot is drawn and the CLI starts without
it. The figures use the object-oriented API on the Agg canvas rather than pyplot: no global
figure registry to leak into, no GUI backend picked from the environment, safe in any thread.

Medians come from the report's summary, so the plot shows the numbers the table prints; the
spread (min to max of the repetitions) from the raw measurements saved beside it.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.clock import ISO_FORMAT
from reconciler.errors import PlotUnavailableError
from reconciler.verify.benchmark import Report

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

MISSING = "no plot: matplotlib is not installed"
HOW_TO_ADD = "`pipx inject spark-reconciler matplotlib` or `pip install 'spark-reconciler[plot]'` adds it"
NOT_INSTALLED = f"{MISSING}; {HOW_TO_ADD}"

DPI = 110
HEIGHT_IN = 5.4
MIN_WIDTH_IN = 8.0  # room for the heading's lines when there is a single panel
HEADING_IN = 0.95  # the band above the panels that holds the heading and its two lines
PREFILL_COLOUR = "#2ca02c"
KIND_COLOURS = ("#1f77b4", "#ff7f0e", "#9467bd", "#8c564b")
RUN_COLOURS = ("#a0a0a0", "#1f77b4")  # A, the baseline, in grey; B, the candidate, in colour
PASS_COLOUR, FAIL_COLOUR = "#2ca02c", "#d62728"
MUTED = "#555555"


def write_report_plot(report: Report, path: Path) -> None:
    """One run: prefill rate by prompt length, decode rates by concurrency, recall if measured."""
    path.write_bytes(_png(report_figure(report)))


def write_compare_plot(a: Report, b: Report, path: Path, labels: tuple[str, str]) -> None:
    """Run A against run B, metric by metric, with B's change on each pair of bars."""
    path.write_bytes(_png(compare_figure(a, b, labels)))


def _agg() -> tuple[type[Figure], type[FigureCanvasAgg]]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotUnavailableError(MISSING, HOW_TO_ADD) from None
    return Figure, FigureCanvasAgg


def _png(figure: Figure) -> bytes:
    # Rendered in memory first: a drawing that fails leaves the previous plot on disk intact.
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, facecolor="white")
    return buffer.getvalue()


# --- what is drawn, read from a report ----------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """A median and the spread of the repetitions around it."""

    median: float
    low: float
    high: float
    note: str = ""


def spread(median: float, values: Sequence[float | None], note: str = "") -> Point:
    present = [value for value in values if value is not None]
    return Point(median, min(present, default=median), max(present, default=median), note)


def prefill_points(report: Report) -> dict[int, Point]:
    """Prefill tok/s by requested prompt length (8192, 32768, ...)."""
    points = {}
    for s in report["summary"]["prefill"]:
        if s["tok_s"] is not None:
            runs = [run["tok_s"] for run in report["prefill"] if run["target"] == s["target"]]
            ttft = f"TTFT {s['ttft_s']['median']:.2f} s" if s["ttft_s"] else ""
            points[s["target"]] = spread(s["tok_s"]["median"], runs, ttft)
    return points


def decode_points(report: Report, metric: str) -> dict[tuple[int, str], Point]:
    """`aggregate_tok_s` (spread over repetitions) or `per_stream_tok_s` (over every stream of
    every repetition) by (concurrency, kind)."""
    points = {}
    for s in report["summary"]["decode"]:
        if s[metric] is not None:
            # Every stream, flagged ones too, as in the median (see benchmark/report.py, _decode_summary).
            reps = [rep for rep in report["decode"] if (rep["conc"], rep["kind"]) == (s["conc"], s["kind"])]
            if metric == "aggregate_tok_s":
                values = [rep["aggregate_tok_s"] for rep in reps]
            else:
                values = [stream["tok_s"] for rep in reps for stream in rep["streams"]]
            points[s["conc"], s["kind"]] = spread(s[metric]["median"], values)
    return points


def recall_points(report: Report) -> dict[tuple[int, float], Point]:
    """TTFT of each recall check by (context length, depth), noted PASS or FAIL."""
    return {
        (r["length"], r["depth"]): spread(r["ttft_s"] or 0.0, [], "PASS" if r["pass"] else "FAIL")
        for r in report["summary"]["recall"]
    }


def token_label(count: float) -> str:
    """8K, 32K, 128K, 1M as context sizes are named (binary); other counts in thousands: 250K."""
    value = int(count)
    for size, unit in ((1 << 20, "M"), (1 << 10, "K")):
        if value >= size and value % size == 0:
            return f"{value // size}{unit}"
    return f"{value / 1000:g}K" if value >= 1000 else str(value)


def rate(value: float) -> str:
    """5,313 and 133, but 52.3 and 2.41: a slow rate keeps three significant digits."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _date(started: Any) -> str:
    try:
        return datetime.strptime(started, ISO_FORMAT).strftime("%Y-%m-%d %H:%M UTC")
    except (TypeError, ValueError):
        return str(started or "date unknown")


# --- one run ------------------------------------------------------------------------------------

Panel = Callable[["Axes", Report], None]


def report_figure(report: Report) -> Figure:
    panels = [draw for part, draw in PANELS.items() if report["summary"][part]]
    figure, axes = _figure([5.0] * max(1, len(panels)))
    label, model = report.get("label") or "", report.get("model") or "?"
    reps, cap = report["settings"].get("reps"), report["settings"].get("max_tokens")
    about = (
        _date(report.get("started")),
        report.get("url"),
        f"{reps} repetitions" if reps else "",
        f"decode output capped at {cap} tokens" if cap else "decode output uncapped",
    )
    _heading(
        figure,
        f"{label} · {model}" if label else model,
        " · ".join(part for part in about if part),
        "points: medians; whiskers: lowest to highest repetition (per stream: every stream of every repetition)",
        None if report.get("complete") else f"INCOMPLETE: {report.get('error') or 'interrupted'}",
    )
    if not panels:
        _nothing(axes[0], "nothing measured")
    for draw, ax in zip(panels, axes, strict=False):  # no panels: one empty axes says so
        draw(ax, report)
    return figure


def _prefill_panel(axes: Axes, report: Report) -> None:
    points = prefill_points(report)
    lengths = sorted(points)
    _whiskered(axes, lengths, [points[n] for n in lengths], PREFILL_COLOUR, "-", "o", None)
    for n in lengths:
        text = f"{rate(points[n].median)} tok/s\n{points[n].note}".rstrip()
        _note_above(axes, n, points[n].high, text, PREFILL_COLOUR)
    axes.set_title("Prefill (unique prompts)", loc="left", fontweight="bold")
    _log2_axis(axes, lengths, [token_label(n) for n in lengths], "prompt length (tokens)")
    _zero_based(axes, [p.high for p in points.values()], "prefill rate (tok/s)", headroom=1.3)


def _decode_panel(axes: Axes, report: Report) -> None:
    aggregate, per_stream = decode_points(report, "aggregate_tok_s"), decode_points(report, "per_stream_tok_s")
    kinds = list(dict.fromkeys(kind for _, kind in [*aggregate, *per_stream]))
    for index, kind in enumerate(kinds):
        colour = KIND_COLOURS[index % len(KIND_COLOURS)]
        for points, style, marker, what in ((aggregate, "-", "o", "aggregate"), (per_stream, "--", "s", "per stream")):
            concs = sorted(conc for conc, k in points if k == kind)
            _whiskered(axes, concs, [points[c, kind] for c in concs], colour, style, marker, f"{kind}, {what}")
        # Only the line's end is labelled (the peak, usually): more numbers would cover the lines.
        last = max((conc for conc, k in aggregate if k == kind), default=None)
        if last is not None:
            peak = aggregate[last, kind].median
            _note_beside(axes, last, peak, rate(peak), colour)
    axes.set_title("Decode", loc="left", fontweight="bold")
    concs = sorted({conc for conc, _ in [*aggregate, *per_stream]})
    _log2_axis(axes, concs, [str(conc) for conc in concs], "concurrent streams")
    _zero_based(axes, [p.high for p in [*aggregate.values(), *per_stream.values()]], "decode rate (tok/s)")
    axes.legend(loc="best", fontsize=8, framealpha=0.9)


def _recall_panel(axes: Axes, report: Report) -> None:
    points = recall_points(report)
    lengths = sorted({length for length, _ in points})
    for (length, depth), point in sorted(points.items()):
        passed = point.note == "PASS"
        colour = PASS_COLOUR if passed else FAIL_COLOUR
        axes.plot([length], [point.median], marker="o" if passed else "X", markersize=10, color=colour)
        _note_above(axes, length, point.median, f"{point.note} at depth {depth:g}", colour)
    axes.set_title("Long-context recall (pass key)", loc="left", fontweight="bold")
    _log2_axis(axes, lengths, [token_label(n) for n in lengths], "context length (tokens)")
    _zero_based(axes, [p.median for p in points.values()], "time to first token (s)", headroom=1.3, thousands=False)


# The panels of one run, each drawn when its part of the summary has entries.
PANELS: dict[str, Panel] = {"prefill": _prefill_panel, "decode": _decode_panel, "recall": _recall_panel}


# --- A against B --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pair:
    """One group of bars: what run A and run B measured for one key (None: that run did not)."""

    name: str
    a: Point | None
    b: Point | None


@dataclass(frozen=True)
class Comparison:
    """One panel of the comparison: a pair of bars per key either run measured."""

    title: str
    unit: str
    pairs: list[Pair]
    higher_is_better: bool | None  # None: no change is shown (recall: PASS or FAIL decides)


def comparisons(a: Report, b: Report) -> list[Comparison]:
    kinds = list(dict.fromkeys(s["kind"] for report in (a, b) for s in report["summary"]["decode"]))

    def by_kind(key: tuple[int, str]) -> tuple[int, int]:
        # Each kind's concurrencies side by side, kinds in the order the runs measured them.
        return kinds.index(key[1]), key[0]

    def decode(metric: str) -> list[Pair]:
        return _pairs(decode_points(a, metric), decode_points(b, metric), _decode_key, by_kind)

    prefill = _pairs(prefill_points(a), prefill_points(b), token_label)
    recall = _pairs(recall_points(a), recall_points(b), _recall_key)
    panels = [
        Comparison("Prefill", "prefill rate (tok/s)", prefill, True),
        Comparison("Decode, per stream", "decode rate per stream (tok/s)", decode("per_stream_tok_s"), True),
        Comparison("Decode, aggregate", "aggregate decode rate (tok/s)", decode("aggregate_tok_s"), True),
        Comparison("Long-context recall", "time to first token (s)", recall, None),
    ]
    return [panel for panel in panels if panel.pairs]


def _pairs(
    a: dict[Any, Point],
    b: dict[Any, Point],
    name: Callable[[Any], str],
    order: Callable[[Any], Any] | None = None,
) -> list[Pair]:
    return [Pair(name(key), a.get(key), b.get(key)) for key in sorted({*a, *b}, key=order)]


def _decode_key(key: tuple[int, str]) -> str:
    conc, kind = key
    return f"{kind}\n{conc} stream{'s' if conc != 1 else ''}"


def _recall_key(key: tuple[int, float]) -> str:
    length, depth = key
    return f"{token_label(length)}\ndepth {depth:g}"


def compare_figure(a: Report, b: Report, labels: tuple[str, str]) -> Figure:
    panels = comparisons(a, b)
    widths = [max(3.2, 0.9 + 0.85 * len(panel.pairs)) for panel in panels] or [5.0]
    figure, axes = _figure(widths)
    names = (f"A {labels[0]}", f"B {labels[1]}")
    _heading(
        figure,
        f"{names[0]}  vs  {names[1]}",
        f"A: {_provenance(a)}  ·  B: {_provenance(b)}",
        "bars: medians; whiskers: lowest to highest repetition; above each pair: B's change from A",
        _incomplete(a, b),
    )
    if not panels:
        _nothing(axes[0], "neither run measured anything")
    for panel, ax in zip(panels, axes, strict=False):  # no panels: one empty axes says so
        _bars(ax, panel)
    _run_legend(figure, names)
    return figure


def _provenance(report: Report) -> str:
    return f"{report.get('model') or '?'}, {_date(report.get('started'))}"


def _incomplete(a: Report, b: Report) -> str | None:
    runs = [name for name, report in (("A", a), ("B", b)) if not report.get("complete")]
    return f"INCOMPLETE: run {' and '.join(runs)}" if runs else None


BAR_WIDTH = 0.38


def _bars(axes: Axes, panel: Comparison) -> None:
    sides = (
        (-BAR_WIDTH / 2, RUN_COLOURS[0], [pair.a for pair in panel.pairs]),
        (BAR_WIDTH / 2, RUN_COLOURS[1], [pair.b for pair in panel.pairs]),
    )
    for offset, colour, points in sides:
        placed = [(index + offset, point) for index, point in enumerate(points) if point]
        _bar_series(axes, placed, colour)
        if panel.higher_is_better is None:
            for x, point in placed:
                _note_above(axes, x, point.high, point.note, PASS_COLOUR if point.note == "PASS" else FAIL_COLOUR)
    if panel.higher_is_better is not None:
        for index, pair in enumerate(panel.pairs):
            if pair.a and pair.b:
                _change_note(axes, index, pair.a, pair.b, panel.higher_is_better)
    axes.set_title(panel.title, loc="left", fontweight="bold")
    axes.set_xticks(range(len(panel.pairs)), [pair.name for pair in panel.pairs])
    axes.set_xlim(-0.6, len(panel.pairs) - 0.4)
    highs = [point.high for pair in panel.pairs for point in (pair.a, pair.b) if point]
    _zero_based(axes, highs, panel.unit, headroom=1.25, thousands=panel.higher_is_better is not None)


def _bar_series(axes: Axes, placed: list[tuple[float, Point]], colour: str) -> None:
    points = [point for _, point in placed]
    axes.bar(
        [x for x, _ in placed],
        [p.median for p in points],
        BAR_WIDTH,
        yerr=[[p.median - p.low for p in points], [p.high - p.median for p in points]],
        capsize=3,
        color=colour,
        error_kw={"elinewidth": 1, "ecolor": "#333333"},
    )


def _run_legend(figure: Figure, names: tuple[str, str]) -> None:
    """One legend for every panel (A and B keep their colours throughout), in the heading band."""
    from matplotlib.patches import Patch

    handles = [Patch(color=colour, label=name) for colour, name in zip(RUN_COLOURS, names, strict=True)]
    anchor = (0.99, 1 - 0.55 / HEIGHT_IN)
    figure.legend(handles=handles, loc="upper right", bbox_to_anchor=anchor, ncols=2, frameon=False, fontsize=10)


def _change_note(axes: Axes, x: float, a: Point, b: Point, higher_is_better: bool) -> None:
    if a.median == 0:
        return
    change = 100 * (b.median - a.median) / a.median
    better = change > 0 if higher_is_better else change < 0
    colour = MUTED if abs(change) < 0.05 else PASS_COLOUR if better else FAIL_COLOUR
    _note_above(axes, x, max(a.high, b.high), f"{change:+.1f}%", colour)  # over the pair, clear of both


# --- drawing ------------------------------------------------------------------------------------


def _figure(widths: list[float]) -> tuple[Figure, list[Axes]]:
    """Panels side by side, `widths` inches each, below the heading band."""
    figure_type, canvas_type = _agg()
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    size = (max(MIN_WIDTH_IN, sum(widths) + 0.4), HEIGHT_IN)
    layout = ConstrainedLayoutEngine(rect=(0, 0, 1, 1 - HEADING_IN / HEIGHT_IN), w_pad=0.08, wspace=0.04)
    figure = figure_type(figsize=size, dpi=DPI, layout=layout, facecolor="white")
    canvas_type(figure)
    axes = figure.subplots(1, len(widths), squeeze=False, width_ratios=widths)[0]
    for ax in axes:
        ax.grid(axis="y", color="#e5e5e5", linewidth=0.8)
        ax.set_axisbelow(True)
        ax.spines[["top", "right"]].set_visible(False)
    return figure, list(axes)


def _heading(figure: Figure, title: str, subtitle: str, legend: str, warning: str | None) -> None:
    top = 1 - 0.18 / HEIGHT_IN
    line = 0.24 / HEIGHT_IN
    figure.text(0.01, top, title, fontsize=15, fontweight="bold", va="top")
    figure.text(0.01, top - 1.45 * line, subtitle, fontsize=9.5, color=MUTED, va="top")
    figure.text(0.01, top - 2.35 * line, legend, fontsize=8.5, color=MUTED, va="top", style="italic")
    if warning:
        figure.text(0.99, top, warning, fontsize=11, color=FAIL_COLOUR, fontweight="bold", va="top", ha="right")


def _whiskered(
    axes: Axes, xs: list[int], points: list[Point], colour: str, style: str, marker: str, label: str | None
) -> None:
    axes.errorbar(
        xs,
        [p.median for p in points],
        yerr=[[p.median - p.low for p in points], [p.high - p.median for p in points]],
        color=colour,
        linestyle=style,
        marker=marker,
        markersize=6,
        linewidth=2,
        capsize=4,
        label=label,
    )


def _note_above(axes: Axes, x: float, y: float, text: str, colour: str) -> None:
    axes.annotate(
        text,
        (x, y),
        xytext=(0, 8),  # clear of the marker (5 points across) or whisker cap below
        textcoords="offset points",
        ha="center",
        va="bottom",
        fontsize=8,
        color=colour,
        # Over the grid, under the data: a note never hides a marker of another series.
        bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.8},
        zorder=1.5,
    )


def _note_beside(axes: Axes, x: float, y: float, text: str, colour: str) -> None:
    axes.annotate(text, (x, y), xytext=(9, 0), textcoords="offset points", va="center", fontsize=9, color=colour)


def _log2_axis(axes: Axes, ticks: list[int], names: list[str], label: str) -> None:
    """Token counts and concurrencies double from step to step: on a log2 axis they sit evenly.
    Only the measured values are ticked, so the labels read 8K, 32K rather than 2^13, 2^15."""
    axes.set_xscale("log", base=2)
    axes.set_xticks(ticks, names)
    axes.set_xticks([], minor=True)
    if ticks:  # empty when no rate could be measured (single-token answers)
        axes.set_xlim(min(ticks) / 1.6, max(ticks) * 1.6)
    axes.set_xlabel(label)


def _zero_based(axes: Axes, highs: list[float], label: str, headroom: float = 1.15, thousands: bool = True) -> None:
    """Rates from zero, so bar heights and slopes compare honestly; room above for the notes."""
    axes.set_ylim(0, (max(highs, default=0.0) or 1.0) * headroom)
    if thousands:
        axes.yaxis.set_major_formatter("{x:,g}")
    axes.set_ylabel(label)


def _nothing(axes: Axes, text: str) -> None:
    axes.text(0.5, 0.5, text, ha="center", va="center", fontsize=12, color=MUTED, transform=axes.transAxes)
    axes.set_axis_off()
