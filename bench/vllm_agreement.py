"""Our bench against vLLM's own on the same real vLLM server (root; `make bench-vllm`).

Brings the real-engine lane's testbed up (tests/testbed/realengine/: two nodes, real vLLM
ranks, tensor parallel 2, the tiny random-weights model), converges specs/testbed-vllm.yaml
with `reconciler apply` in spark-head, then runs rounds of `reconciler bench --kinds random`
and `vllm bench serve` (the lane's vLLM venv, the image's own vLLM), both inside spark-head
(the same network path, the same CPUs to share with the engine), on the same workload: random
256-token prompts, exactly 64 tokens out, at concurrency 1 and 2.

The tools take turns and swap which goes first every round: the engine's speed drifts (load
elsewhere, the engine warming up), and a fixed order would hand the drift to one tool. Per
round and pooled over the rounds, both tools' median and mean TTFT, median TPOT, median ITL
and output throughput are printed, with the median of the rounds' differences (ours relative
to vLLM's): a burst of load during one run cannot decide it alone. Around every run the
engine's own TTFT and ITL histograms are read from its /metrics, so each round also says how
fast the engine itself was during our run and during vLLM's: a difference the engine shows too
is the engine's, not the clients'. The arithmetic is in bench/agreement.py. Nothing is
asserted against a limit: the program exits 0 when both tools ran every round.

Mind the prefix cache (the deployment serves with --enable-prefix-caching): vLLM's bench draws
its random prompts from --seed, so each round gets its own seed, and its first prompt is sent
before the measured run (a test request and the warm-ups); one extra prompt per slot keeps its
slots full to the end, as ours are.

Run (root): `.venv/bin/python bench/vllm_agreement.py [--rounds 9] [--reps 6] [--reuse] [--json]`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import agreement  # noqa: E402
from bench.agreement import Figures, Pooled  # noqa: E402
from reconciler.spec import load_spec  # noqa: E402
from tests.e2e.conftest import TB_ROOT, Bed, write_spec  # noqa: E402
from tests.testbed.realengine import lane as lane_setup  # noqa: E402
from tests.testbed.realengine import vllmcpu  # noqa: E402
from tests.testbed.testbed import Testbed  # noqa: E402

HEAD = "spark-head"
MODEL = "deepseek-v4.1-flash"
MODEL_DIR = "/srv/spark/models/tiny-qwen2-spark"  # the tokenizer vLLM's bench counts with
KEY_FILE = "/srv/spark/state/api_key"
INPUT_LEN, OUTPUT_LEN = 256, 64
CONCURRENCIES = (1, 2)
RUN_TIMEOUT_S = 900


_Run = TypeVar("_Run")


class AgreementError(Exception):
    """A tool or the bring-up did not finish: the figures would be missing, not measured."""


@contextlib.contextmanager
def deployment(reuse: bool) -> Iterator[Bed]:
    """The real-engine testbed (brought up, or the one up now) with the deployment converged."""
    testbed = Testbed(TB_ROOT)
    image = reused_image(testbed) if reuse else lane_setup.up(testbed)
    try:
        spec = write_spec(ROOT / "specs/testbed-vllm.yaml", testbed.layout.specs / "bench-vllm.yaml", image)
        bed = Bed(testbed, spec)
        started = time.monotonic()
        reconciler(bed, "apply", "--yes", timeout=1500)
        print(f"converged in {time.monotonic() - started:.0f} s", flush=True)
        yield bed
    finally:
        if not reuse:
            testbed.down()


def reused_image(testbed: Testbed) -> str:
    """The tb/vllm image of the real-engine testbed that is up (`real-engine-up` wrote it)."""
    image = testbed.images().get("vllm") if testbed.node_names else None
    if image is None:
        raise AgreementError(
            "--reuse: no real-engine testbed is up; bring one up with `python3 -m tests.testbed real-engine-up`"
        )
    return image


def reconciler(bed: Bed, *args: str, timeout: float = RUN_TIMEOUT_S) -> str:
    result = bed.reconciler(*args, check=False, timeout=timeout)
    if result.returncode != 0:
        raise AgreementError(f"reconciler {' '.join(args)} exited {result.returncode}:\n{_tail(result)}")
    return result.stdout


def _tail(result: subprocess.CompletedProcess[str]) -> str:
    return (result.stdout + result.stderr)[-3000:]


def head_json(bed: Bed, path: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(bed.node(HEAD, "cat", path).stdout)
    return loaded


# Reads the engine's /metrics inside the head; the key comes from its file, never an argv.
_METRICS_SCRIPT = """
import sys, urllib.request
key = open(sys.argv[2], encoding="utf-8").read().strip()
request = urllib.request.Request(sys.argv[1] + "/metrics", headers={"Authorization": "Bearer " + key})
sys.stdout.write(urllib.request.urlopen(request, timeout=30).read().decode())
"""


def engine_totals(bed: Bed, url: str) -> dict[str, float]:
    page = bed.node(HEAD, "python3", "-c", _METRICS_SCRIPT, url, KEY_FILE).stdout
    return agreement.histogram_totals(page)


def vllm_round(bed: Bed, url: str, conc: int, round_: int, reps: int) -> tuple[str, Pooled]:
    """(its result file in the head, its requests): vLLM's own bench, a new --seed each round,
    one extra prompt per slot. The key goes from its file to the environment, never an argv."""
    name = f"/tmp/bench-vllm-theirs-c{conc}-{round_}.json"
    argv = [
        str(vllmcpu.venv_dir(bed.testbed.layout.cache) / "bin" / "vllm"), "bench", "serve",
        "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
        "--model", MODEL, "--tokenizer", MODEL_DIR,
        "--dataset-name", "random", "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
        "--ignore-eos", "--num-prompts", str(reps * conc + conc), "--max-concurrency", str(conc), "--num-warmups", "2",
        "--seed", str(1000 * conc + round_),
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "90,99",
        "--save-result", "--save-detailed", "--result-dir", str(Path(name).parent),
        "--result-filename", Path(name).name, "--disable-tqdm",
    ]  # fmt: skip
    script = f'OPENAI_API_KEY="$(cat {KEY_FILE})" HF_HUB_OFFLINE=1 exec "$@"'
    result = bed.testbed.exec(HEAD, ["sh", "-c", script, "sh", *argv], check=False, timeout=RUN_TIMEOUT_S)
    if result.returncode != 0:
        raise AgreementError(f"vllm bench serve (c{conc}, round {round_}) exited {result.returncode}:\n{_tail(result)}")
    return name, agreement.from_vllm_result(head_json(bed, name), conc)


def our_round(bed: Bed, conc: int, round_: int, reps: int) -> tuple[str, Pooled, dict[str, int]]:
    """(its report in the head, its requests, its flagged and all streams): `reconciler bench`."""
    out = f"/tmp/bench-vllm-ours-c{conc}-{round_}.json"
    argv = ["bench", "--out", out, "--conc", str(conc), "--prefill", "--kinds", "random", "--reps", str(reps)]
    reconciler(bed, *argv, "--input-len", str(INPUT_LEN), "--max-tokens", str(OUTPUT_LEN))
    report = head_json(bed, out)
    (level,) = report["summary"]["decode"]
    streams = {"ours_flagged": len(level["flagged"]), "ours_streams": level["streams"]}
    return out, agreement.from_our_report(report), streams


def both_tools(bed: Bed, url: str, conc: int, round_: int, reps: int) -> dict[str, Any]:
    """One round: our run and vLLM's, ours first in odd rounds and vLLM's in even ones, each
    with the engine's own figures over the requests it served during that run."""
    engine: dict[str, dict[str, float | None]] = {}

    def watched(tool: str, run: Callable[[], _Run]) -> _Run:
        before = engine_totals(bed, url)
        ran = run()
        engine[tool] = agreement.server_figures(before, engine_totals(bed, url))
        return ran

    def run_ours() -> tuple[str, Pooled, dict[str, int]]:
        return watched("ours", lambda: our_round(bed, conc, round_, reps))

    def run_vllm() -> tuple[str, Pooled]:
        return watched("vllm", lambda: vllm_round(bed, url, conc, round_, reps))

    if round_ % 2:
        ours, theirs = run_ours(), run_vllm()
    else:
        theirs, ours = run_vllm(), run_ours()
    if round_ == 1:  # `bench compare` reads vLLM's file as it is
        print(reconciler(bed, "bench", "compare", theirs[0], ours[0]))
    first = "ours" if round_ % 2 else "vllm"
    return {"first": first, "vllm": theirs[1], "ours": ours[1], "streams": ours[2], "engine": engine}


def concurrency(bed: Bed, url: str, conc: int, rounds: int, reps: int) -> dict[str, Any]:
    """ROUNDS rounds at one concurrency: each round's figures, the pooled ones, the differences."""
    per_round: list[dict[str, Any]] = []
    figures: list[tuple[Figures, Figures]] = []
    engine: list[tuple[dict[str, float | None], dict[str, float | None]]] = []
    pooled = {"vllm": Pooled(), "ours": Pooled()}
    started = time.monotonic()
    for round_ in range(1, rounds + 1):
        ran = both_tools(bed, url, conc, round_, reps)
        figures.append((agreement.vllm_figures(ran["vllm"]), agreement.vllm_figures(ran["ours"])))
        theirs, ours = figures[-1]
        engine.append((ran["engine"]["vllm"], ran["engine"]["ours"]))
        per_round.append(
            {
                "round": round_,
                "first": ran["first"],
                "vllm": theirs,
                "ours": ours,
                "engine": ran["engine"],
                **ran["streams"],
            }
        )
        print(agreement.round_line(conc, round_, theirs, ours), flush=True)
        print(agreement.server_line(conc, round_, *engine[-1]), flush=True)
        pooled["vllm"].add(ran["vllm"])
        pooled["ours"].add(ran["ours"])
    changes = agreement.differences(figures)
    engine_changes = agreement.engine_differences(engine)
    return {
        "rounds": per_round,
        "pooled": {tool: agreement.vllm_figures(requests) for tool, requests in pooled.items()},
        "differences_by_round": changes,
        "median_difference": {key: agreement.median_difference(values) for key, values in changes.items()},
        "engine_differences_by_round": engine_changes,
        "engine_median_difference": {
            key: agreement.median_difference(values) for key, values in engine_changes.items()
        },
        "seconds": time.monotonic() - started,
    }


def measure(rounds: int, reps: int, reuse: bool) -> dict[str, Any]:
    started = time.monotonic()
    with deployment(reuse) as bed:
        url = f"http://127.0.0.1:{load_spec(bed.spec).deployment.serving.port}"
        levels = {f"c{conc}": concurrency(bed, url, conc, rounds, reps) for conc in CONCURRENCIES}
    return {
        "workload": {"input_len": INPUT_LEN, "output_len": OUTPUT_LEN, "rounds": rounds, "reps_per_slot": reps},
        "figures": list(agreement.FIGURES),
        "difference": "ours / vllm - 1, per round; the median of the rounds'",
        "concurrency": levels,
        "seconds": time.monotonic() - started,
    }


def summary_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    for name, level in report["concurrency"].items():
        conc = int(name[1:])
        theirs, ours = level["pooled"]["vllm"], level["pooled"]["ours"]
        for key in agreement.FIGURES:
            lines.append(agreement.figure_line(conc, key, theirs[key], ours[key], level["differences_by_round"][key]))
        for key, changes in level["engine_differences_by_round"].items():
            by_round = " ".join(agreement.percent(change) for change in changes)
            median = agreement.percent(agreement.median_difference(changes))
            lines.append(
                f"c{conc} {key:18} the engine during ours against during vLLM's: by round {by_round} -> {median}"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="rounds of both tools per concurrency (default 9)")
    parser.add_argument("--reps", type=int, default=6, help="requests per slot and tool in a round (default 6)")
    parser.add_argument(
        "--reuse", action="store_true", help="use the real-engine testbed that is up (no bring-up, no teardown)"
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON report")
    args = parser.parse_args()
    if args.rounds < 1 or args.reps < 2:
        parser.error("--rounds must be at least 1 and --reps at least 2 (repetition 1 is left out)")
    # The testbed says what it brings up and down on stdout; with --json only the report goes there.
    try:
        with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
            report = measure(args.rounds, args.reps, args.reuse)
    except (AgreementError, ValueError) as exc:  # ValueError: a result file with failed requests
        print(f"bench-vllm: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"\n{args.rounds} rounds of {args.reps} requests per slot, pooled (the first of each slot left out):")
    print("\n".join(summary_lines(report)))


if __name__ == "__main__":
    main()
