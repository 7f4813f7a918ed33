"""Handlers that ask the API: smoke, bench and bench compare (no SSH, Docker or Hub client)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler.cli.common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, emit, emit_json, load
from reconciler.errors import PlotUnavailableError, ReconcilerError

if TYPE_CHECKING:
    from reconciler.verify.apiclient import ApiTarget


def _api_target(args: argparse.Namespace) -> ApiTarget:
    from reconciler.verify.apiclient import resolve_target

    return resolve_target(args.url, args.key_file, args.model, os.environ, lambda: load(args).deployment)


def smoke(args: argparse.Namespace) -> int:
    from reconciler.verify import smoke as checks

    report = checks.run_smoke(_api_target(args), args.checks, args.max_tokens)
    emit(args.json, report.to_dict(), lambda: checks.render(report))
    return EXIT_OK if report.ok else EXIT_ERROR


def bench(args: argparse.Namespace) -> int:
    if args.url == "compare":
        return _bench_compare(args)
    if args.files or args.out is None:
        raise ReconcilerError(
            "bench needs --out FILE (and at most one URL)",
            "reconciler bench [URL] --out bench.json, or reconciler bench compare A.json B.json",
        )
    from reconciler.execution import Progress
    from reconciler.verify import benchmark, plot
    from reconciler.verify.benchrun import MAX_STEP_STREAMS, BenchRun, BenchSettings

    if args.conc and max(args.conc) * args.reps > MAX_STEP_STREAMS:
        raise ReconcilerError(
            f"bench: --conc {max(args.conc)} x --reps {args.reps} streams in one decode step is more than "
            f"{MAX_STEP_STREAMS}: a step keeps every stream's bytes until it ends",
            "fewer --reps at that concurrency (or run it as several benches)",
        )

    settings = BenchSettings(
        tuple(args.conc),
        tuple(args.prefill),
        tuple(args.kinds),
        tuple(args.ctx),
        args.depth,
        args.reps,
        args.max_tokens,
        args.label,
        args.input_len,
    )
    run = BenchRun(_api_target(args), settings, Path(args.out), Progress().line)
    try:
        report = run.run()
    except KeyboardInterrupt:
        run.interrupted()
        sys.stderr.write(f"interrupted: {args.out} keeps every step measured so far\n")
        return EXIT_INTERRUPTED
    finally:
        if run.report.get("summary"):
            path = Path(args.plot or Path(args.out).with_suffix(".png"))
            _draw(lambda: plot.write_report_plot(run.report, path), path)
    emit(args.json, report, lambda: benchmark.render_table(report))
    return EXIT_OK if all(check["pass"] for check in report["recall"]) else EXIT_ERROR


def _bench_compare(args: argparse.Namespace) -> int:
    from reconciler.verify import benchmark, plot
    from reconciler.verify.benchrun import load_report

    if len(args.files) != 2:
        raise ReconcilerError("bench compare needs two reports", "reconciler bench compare A.json B.json")
    first, second = (load_report(path) for path in args.files)
    rows = benchmark.compare(first, second)
    labels = (first.get("label") or args.files[0], second.get("label") or args.files[1])
    if args.json:
        emit_json({"a": args.files[0], "b": args.files[1], "rows": rows})
    else:
        sys.stdout.write(benchmark.render_compare(rows, *labels))
    if benchmark.is_vllm_result(first) or benchmark.is_vllm_result(second):
        return EXIT_OK  # a vLLM result holds one concurrency's figures: the table is the picture
    a, b = (Path(name) for name in args.files)
    path = Path(args.plot) if args.plot else b.with_name(f"{b.stem}-vs-{a.stem}.png")  # says which run is which
    _draw(lambda: plot.write_compare_plot(first, second, path, labels), path)
    return EXIT_OK


def _draw(write: Callable[[], None], path: Path) -> None:
    """A plot is a picture of the JSON: without matplotlib, say how to add it and carry on."""
    from reconciler.verify import plot

    try:
        write()
    except PlotUnavailableError:
        sys.stderr.write(f"{plot.NOT_INSTALLED}\n")
        return
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        # A report is read from a file: an edited one may be well-formed where the table looks
        # and not where the plot does.
        raise ReconcilerError(
            f"cannot draw {path}: the report's data is not as bench writes it ({type(exc).__name__}: {exc})",
            "pass files written by `reconciler bench --out`, unedited",
        ) from None
    sys.stderr.write(f"plot: {path}\n")
