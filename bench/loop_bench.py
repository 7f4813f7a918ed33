"""Benchmark of `reconciler run` on the converged two-node testbed (root; `make bench`).

Measured in one run, each with a baseline from the same run:
  - no-op pass: the loop's full pass on a converged deployment (gather + plan), vs one SSH
    round trip on the open connection;
  - kill -> repair start: from `docker kill dsv41-r1` on the worker to the loop starting the
    pass that repairs it (Docker events, not polling; goal <= 2 s), vs the resync interval a
    polling design would wait;
  - the loop's RSS and idle CPU over 30 s, vs an idle Python interpreter (`time.sleep`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.plan_bench import IN_NODE  # noqa: E402
from tests.e2e.conftest import RECONCILER, TB_ROOT, write_spec  # noqa: E402
from tests.testbed.testbed import Testbed  # noqa: E402

RESYNC_S = 300
IDLE_S = 30


def proc_usage(testbed: Testbed, pattern: str) -> tuple[int, float]:
    """(RSS KiB, CPU seconds) of the newest process in spark-head matching `pattern`."""
    script = (
        f"pid=$(pgrep -o -f '{pattern}'); "
        "awk '/VmRSS/ {print $2}' /proc/$pid/status; "
        "awk '{print $14 + $15}' /proc/$pid/stat"
    )
    rss, ticks = testbed.exec("spark-head", ["sh", "-c", script]).stdout.split()
    return int(rss), int(ticks) / 100.0


def wait_line(log: Path, text: str, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if text in log.read_text(encoding="utf-8", errors="replace"):
            return time.monotonic() - started
        time.sleep(0.02)
    raise AssertionError(f"no '{text}' in the loop log within {timeout} s")


def main() -> None:
    testbed = Testbed(TB_ROOT)
    testbed.up(nodes=2)
    loop_log = testbed.layout.root / "bench-loop.log"
    spec = write_spec(ROOT / "specs/testbed.yaml", testbed.layout.specs / "bench-loop.yaml", testbed.images()["engine"])
    spec.write_text(spec.read_text(encoding="utf-8") + f"loop:\n  resync_s: {RESYNC_S}\n  liveness_s: 60\n")
    process = None
    try:
        testbed.exec("spark-head", [RECONCILER, "apply", "--yes", "--spec", str(spec)], timeout=600)
        python = str(ROOT / ".venv/bin/python")
        inner = json.loads(testbed.exec("spark-head", [python, "-c", IN_NODE, str(spec)]).stdout)
        with loop_log.open("w", encoding="utf-8") as log:
            argv = testbed.exec_argv("spark-head", [RECONCILER, "run", "--spec", str(spec)])
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        wait_line(loop_log, "[loop] status: converged", 120)
        time.sleep(5)
        rss_before, cpu_before = proc_usage(testbed, "bin/reconciler run")
        time.sleep(IDLE_S)
        rss, cpu_after = proc_usage(testbed, "bin/reconciler run")
        idle_python = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({IDLE_S + 5})"])
        time.sleep(1)
        python_rss = int(Path(f"/proc/{idle_python.pid}/status").read_text().split("VmRSS:")[1].split()[0])
        idle_python.kill()
        testbed.exec("spark-worker", ["docker", "kill", "dsv41-r1"])
        repair_start = wait_line(loop_log, "[loop] pass: spark-worker: dsv41-r1 die", 60)
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=60)
        testbed.down()
    report = {
        "noop_pass_s": inner["pass_s"],
        "ssh_floor_s": inner["ssh_floor_s"],
        "noop_pass_over_ssh_floor": inner["pass_s"] / inner["ssh_floor_s"],
        "kill_to_repair_start_s": repair_start,
        "polling_wait_s": RESYNC_S / 2,
        "repair_start_over_polling": repair_start / (RESYNC_S / 2),
        "goal_repair_start_s": 2.0,
        "loop_rss_kib": rss,
        "idle_python_rss_kib": python_rss,
        "rss_over_idle_python": rss / python_rss,
        "idle_cpu_percent": (cpu_after - cpu_before) / IDLE_S * 100,
        "rss_growth_kib_over_idle": rss - rss_before,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
