"""Benchmark: a `plan` pass on the converged two-node testbed, against SSH's own floor.

Run as root: `make bench` (brings the testbed up, converges it, measures, tears it down).
Baselines measured in the same run, on the same nodes:
  - ssh_floor: one `true` over the already-open paramiko connection to the worker, and
  - cli_floor: `reconciler --version` (Python start-up and imports of the CLI).
Reported: median of 10 in-process plan passes (gather over SSH + pure plan), median of 10
full `reconciler plan` processes, SSH round trips per pass, and ratios to the baselines.
Target: a plan under 0.5 s.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.conftest import RECONCILER, TB_ROOT, write_spec  # noqa: E402
from tests.testbed.testbed import Testbed  # noqa: E402

RUNS = 10
IN_NODE = """
import json, statistics, sys, time
from reconciler.commands import live_plan
from reconciler.spec import load_spec
from reconciler.transport.connect import close_all, connect_all
deployment = load_spec(sys.argv[1]).deployment
transports = connect_all(deployment)
worker = transports["spark-worker"]
worker.run(["true"])
floor = []
for _ in range(10):
    t = time.perf_counter(); worker.run(["true"]); floor.append(time.perf_counter() - t)
before = {name: t.round_trips for name, t in transports.items()}
passes = []
for _ in range(10):
    t = time.perf_counter(); facts, plan = live_plan(deployment, transports); passes.append(time.perf_counter() - t)
    assert not plan.has_changes, plan.actions
trips = {name: (t.round_trips - before[name]) / 10 for name, t in transports.items()}
close_all(transports)
print(json.dumps({"ssh_floor_s": statistics.median(floor), "pass_s": statistics.median(passes), "round_trips": trips}))
"""


def timed(testbed: Testbed, argv: list[str]) -> float:
    started = time.perf_counter()
    testbed.exec("spark-head", argv, check=True)
    return time.perf_counter() - started


def main() -> None:
    testbed = Testbed(TB_ROOT)
    testbed.up(nodes=2)
    try:
        engine = testbed.images()["engine"]
        spec = write_spec(ROOT / "specs/testbed.yaml", testbed.layout.specs / "bench-plan.yaml", engine)
        testbed.exec("spark-head", [RECONCILER, "apply", "--yes", "--spec", str(spec)], check=True, timeout=600)
        python = str(ROOT / ".venv/bin/python")
        inner = json.loads(testbed.exec("spark-head", [python, "-c", IN_NODE, str(spec)], check=True).stdout)
        cli = statistics.median(timed(testbed, [RECONCILER, "plan", "--spec", str(spec)]) for _ in range(RUNS))
        cli_floor = statistics.median(timed(testbed, [RECONCILER, "--version"]) for _ in range(RUNS))
    finally:
        testbed.down()
    report = {
        **inner,
        "cli_plan_s": cli,
        "cli_floor_s": cli_floor,
        "pass_over_ssh_floor": inner["pass_s"] / inner["ssh_floor_s"],
        "cli_over_cli_floor": cli / cli_floor,
        "target_s": 0.5,
    }
    print(json.dumps(report, indent=2))
    print(
        f"plan pass {report['pass_s'] * 1000:.0f} ms (= {report['pass_over_ssh_floor']:.1f}x one SSH round trip), "
        f"CLI plan {cli * 1000:.0f} ms (= {report['cli_over_cli_floor']:.1f}x `reconciler --version`), "
        f"round trips per pass: {report['round_trips']}"
    )


if __name__ == "__main__":
    main()
