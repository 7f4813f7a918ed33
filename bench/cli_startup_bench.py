"""Benchmark: what the command line costs to start, as ratios to baselines measured in the same run.

Baselines, with the same interpreter (the venv's python, so site-packages and its path hooks
count on both sides):
  - `python -c pass`: the interpreter's own start-up;
  - `python -c 'import pydantic, yaml'`: the two libraries any spec command needs.
Measured: `reconciler --version`, `reconciler --help` (ratio to the first), `reconciler validate`
and `reconciler plan --facts` on the shipped spec and an empty-facts fixture (ratio to the second).
Goals: --version and --help within 3x, validate and plan --facts within 2.5x.

Each command runs RUNS times interleaved with the others (so a busy machine slows all alike);
the figure is the minimum of the child's CPU time (user + system), the least noisy reading on a
shared machine, and the median wall time is reported beside it. Bytecode is written first (one
warm-up run without PYTHONDONTWRITEBYTECODE), as an installed package has it.

    python bench/cli_startup_bench.py [--json] [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
RECONCILER = str(Path(PYTHON).with_name("reconciler"))
SPEC = str(ROOT / "specs/deployment.yaml")
FACTS = str(ROOT / "tests/fixtures/facts/empty.json")

BASELINES = {
    "python_pass": [PYTHON, "-c", "pass"],
    "import_pydantic_yaml": [PYTHON, "-c", "import pydantic, yaml"],
}
COMMANDS = {
    "version": ([RECONCILER, "--version"], "python_pass", 3.0),
    "help": ([RECONCILER, "--help"], "python_pass", 3.0),
    "validate": ([RECONCILER, "validate", "--spec", SPEC], "import_pydantic_yaml", 2.5),
    "plan_facts": ([RECONCILER, "plan", "--spec", SPEC, "--facts", FACTS], "import_pydantic_yaml", 2.5),
}


def environment() -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    env.pop("RECONCILER_SPEC", None)
    return env


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(cpu seconds, wall seconds) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=ROOT, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


def measure(runs: int) -> dict[str, dict[str, float]]:
    env = environment()
    every = {**BASELINES, **{name: argv for name, (argv, _, _) in COMMANDS.items()}}
    for argv in every.values():
        run_once(argv, env)  # writes bytecode; loads the page cache
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in every}
    for _ in range(runs):
        for name, argv in every.items():
            samples[name].append(run_once(argv, env))
    return {
        name: {"cpu_s": min(cpu for cpu, _ in values), "wall_median_s": statistics.median(w for _, w in values)}
        for name, values in samples.items()
    }


def report(figures: dict[str, dict[str, float]]) -> dict[str, object]:
    ratios = {}
    for name, (_, baseline, goal) in COMMANDS.items():
        ratio = figures[name]["cpu_s"] / figures[baseline]["cpu_s"]
        wall = figures[name]["wall_median_s"] / figures[baseline]["wall_median_s"]
        ratios[name] = {
            "baseline": baseline,
            "ratio": round(ratio, 2),
            "wall_ratio": round(wall, 2),
            "goal": goal,
            "met": ratio <= goal,
        }
    return {
        "bench": "cli_startup",
        "python": sys.version.split()[0],
        "seconds": {name: {k: round(v, 4) for k, v in values.items()} for name, values in figures.items()},
        "ratios": ratios,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    result = report(measure(args.runs))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    seconds = result["seconds"]
    assert isinstance(seconds, dict)
    for name, values in seconds.items():
        print(f"{name:22s} cpu {values['cpu_s'] * 1000:7.1f} ms   wall {values['wall_median_s'] * 1000:7.1f} ms")
    ratios = result["ratios"]
    assert isinstance(ratios, dict)
    for name, figure in ratios.items():
        verdict = "met" if figure["met"] else "NOT met"
        print(
            f"{name:22s} {figure['ratio']:.2f}x {figure['baseline']} (wall {figure['wall_ratio']:.2f}x),"
            f" goal <= {figure['goal']}x: {verdict}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
