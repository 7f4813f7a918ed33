"""Benchmarks of the checkpoint pipeline, each against a baseline measured in the same run.

1. First-time hashing: the node-side `hash_files` (parallel, shipped through `python3 -`)
   vs parallel `sha256sum` (one process per core) on the same files. Goal: >= 0.9x.
2. No-op re-verify of a full-size checkpoint (462 GB of sparse files, hash cache warm):
   `hash_files` vs the floor of stat-ing every file (`find -printf`). Goal: <= 0.2 s.

The copy to a worker is measured by bench/distribution_bench.py (against one plain rsync).

Run: `make bench` (with the others) or `.venv/bin/python bench/checkpoint_bench.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reconciler.nodeops import NodeOps  # noqa: E402
from reconciler.transport.local import LocalTransport  # noqa: E402

NODE = LocalTransport("bench")


def timed(action: object) -> float:
    started = time.perf_counter()
    action()  # type: ignore[operator]
    return time.perf_counter() - started


def hashing(directory: Path, files: int = 8, mib: int = 96) -> dict[str, float]:
    names = []
    for index in range(files):
        path = directory / f"shard-{index}.bin"
        path.write_bytes(os.urandom(mib * 1024 * 1024))
        names.append(path.name)
    cores = str(os.cpu_count() or 2)
    baseline = statistics.median(
        timed(
            lambda: subprocess.run(
                ["xargs", "-P", cores, "-n", "1", "sha256sum"],
                input="\n".join(names).encode(),
                cwd=directory,
                check=True,
                capture_output=True,
            )
        )
        for _ in range(3)
    )

    def ours() -> None:
        cache = directory / "cache.json"
        cache.unlink(missing_ok=True)
        NodeOps(NODE, None).hash_files(str(directory), names, str(cache))

    measured = statistics.median(timed(ours) for _ in range(3))
    total = files * mib * 1024 * 1024
    return {
        "bytes": total,
        "sha256sum_parallel_s": baseline,
        "hash_files_s": measured,
        "ratio_vs_sha256sum": baseline / measured,
        "goal_ratio": 0.9,
    }


def noop_reverify(directory: Path) -> dict[str, float]:
    """462 GB as 41 sparse files, with a warm hash cache: verification must read nothing."""
    sizes = [45_000_000_000] * 4 + [70_000_000_000] * 2 + [5_000_000_000] * 28 + [4096] * 7
    cache: dict[str, list[object]] = {}
    names = []
    for index, size in enumerate(sizes):
        path = directory / f"file-{index:02d}.safetensors"
        with open(path, "wb") as handle:
            handle.truncate(size)
        info = path.stat()
        cache[str(path)] = [info.st_size, info.st_mtime_ns, info.st_ino, "0" * 64]
        names.append(path.name)
    cache_path = directory / "cache.json"
    cache_path.write_text(json.dumps(cache), encoding="utf-8")
    node = NodeOps(NODE, None)
    measured = statistics.median(
        timed(lambda: node.hash_files(str(directory), names, str(cache_path))) for _ in range(10)
    )
    floor = statistics.median(
        timed(
            lambda: subprocess.run(
                ["find", str(directory), "-type", "f", "-printf", "%s %T@ %i\n"], check=True, capture_output=True
            )
        )
        for _ in range(10)
    )
    python = statistics.median(timed(lambda: subprocess.run(["python3", "-c", "pass"], check=True)) for _ in range(10))
    return {
        "checkpoint_bytes": sum(sizes),
        "files": len(sizes),
        "reverify_s": measured,
        "stat_floor_s": floor,
        "python_startup_s": python,
        "ratio_vs_stat_floor": measured / floor,
        "goal_s": 0.2,
    }


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    report: dict[str, object] = {}
    with tempfile.TemporaryDirectory(dir="/var/tmp") as scratch:
        report["hashing"] = hashing(Path(scratch))
    with tempfile.TemporaryDirectory(dir="/var/tmp") as scratch:
        report["noop_reverify"] = noop_reverify(Path(scratch))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
