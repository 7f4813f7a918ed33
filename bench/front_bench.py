"""What the front costs: TTFT and ITL through the front against rank 0 directly, in one run.

The engine stand-in's two ranks from the rendered argv (rank 0 on loopback without a key, as the
reconciler runs it) and a real HAProxy (Debian's, the testbed's front) with the config the
reconciler renders. Single streams take turns, direct then through the front, so both see the
same machine; each is timed on the client as the bench times them (first content token; the gaps
between tokens). The goal: under 1 ms added at the median, for TTFT and for ITL.

    .venv/bin/python bench/front_bench.py [--rounds N] [--tokens N]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.unit.frontproc import fronted_group  # noqa: E402
from tests.unit.test_engine_standin import KEY, MODEL  # noqa: E402

GOAL_MS = 1.0
# The stand-in's pause per token: streams with a real rhythm, so a front that held chunks back
# would show in ITL.
TOKEN_DELAY_S = 0.005


def one_stream(client: httpx.Client, url: str, tokens: int) -> tuple[float, list[float]]:
    """(TTFT, the gaps between content chunks), seconds, of one streamed chat completion."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}],
        "max_tokens": tokens,
        "stream": True,
    }
    times: list[float] = []
    started = time.perf_counter()
    with client.stream("POST", url + "/v1/chat/completions", json=body) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            if line.startswith("data: ") and '"content":"' in line.replace(" ", "") and line != "data: [DONE]":
                times.append(time.perf_counter())
    if len(times) < 2:
        raise SystemExit(f"{url}: a stream of {len(times)} content chunks cannot be timed")
    return times[0] - started, [later - earlier for earlier, later in itertools.pairwise(times)]


def measure(direct: str, front: str, rounds: int, tokens: int) -> dict[str, dict[str, float]]:
    ttft: dict[str, list[float]] = {"direct": [], "front": []}
    itl: dict[str, list[float]] = {"direct": [], "front": []}
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(headers=headers, timeout=60) as client:
        for url in (direct, front):
            one_stream(client, url, tokens)  # warm-up: connections, the stand-in's first answer
        for _ in range(rounds):
            for name, url in (("direct", direct), ("front", front)):
                first, gaps = one_stream(client, url, tokens)
                ttft[name].append(first)
                itl[name] += gaps
    return {
        metric: {
            "direct_ms": statistics.median(values["direct"]) * 1000,
            "front_ms": statistics.median(values["front"]) * 1000,
            "added_ms": (statistics.median(values["front"]) - statistics.median(values["direct"])) * 1000,
        }
        for metric, values in (("ttft", ttft), ("itl", itl))
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    env = {"ENGINE_TOKEN_DELAY_S": str(TOKEN_DELAY_S)}
    with (
        tempfile.TemporaryDirectory(prefix="front-bench-") as scratch,
        fronted_group(Path(scratch), env) as found_group,
    ):
        group, port = found_group
        found = measure(group.url, f"http://127.0.0.1:{port}", args.rounds, args.tokens)
    print(json.dumps({"rounds": args.rounds, "tokens": args.tokens, **found}, indent=1))
    for metric, figures in found.items():
        verdict = "within" if figures["added_ms"] < GOAL_MS else "OVER"
        print(
            f"{metric.upper():4} median: direct {figures['direct_ms']:.3f} ms, through the front "
            f"{figures['front_ms']:.3f} ms, added {figures['added_ms']:+.3f} ms ({verdict} the {GOAL_MS:g} ms goal)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
