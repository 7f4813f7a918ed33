"""Smoke and bench on the testbed, from the head as a user runs them: `apply` ends with the
smoke step, `reconciler smoke` passes every check with the URL and key from the spec, and a
small `reconciler bench` completes with a report whose numbers respect the engine
stand-in's token delay (5 ms per token: no stream can be faster than 200 tok/s).

The first test starts from nothing deployed (`Bed.fresh`); the others from a converged group,
and the bench tests share one small run (`benched`), so they run in any order.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Bed

pytestmark = pytest.mark.testbed

HEAD = "spark-head"
CHECKS = ["models", "unauthorized", "stream", "text", "reasoning", "tools", "vision"]
TOKEN_DELAY_S = 0.005  # ENGINE_TOKEN_DELAY_S default; specs/testbed.yaml does not set it


def test_apply_ends_with_the_smoke_step(bed: Bed) -> None:
    bed.fresh()  # the group's start, which the smoke step follows
    planned = bed.reconciler("plan").stdout
    assert "ranks on spark-head: smoke-test the API: models, unauthorized, stream, text" in planned
    result = bed.reconciler("apply", "--yes")
    assert "Apply complete" in result.stdout
    progress = result.stderr
    assert progress.index("wait until GET /v1/models") < progress.index("smoke-test the API")
    assert "7/7 checks passed against http://127.0.0.1:8000 (model deepseek-v4.1-flash)" in progress
    assert bed.plan_exit() == 0


def test_smoke_passes_every_check_with_the_specs_url_and_key(converged: Bed) -> None:
    bed = converged
    result = bed.reconciler("smoke", "--json")
    report: Any = json.loads(result.stdout)
    assert report["ok"] is True, report
    assert report["url"] == "http://127.0.0.1:8000"
    assert report["model"] == "deepseek-v4.1-flash"
    assert [check["name"] for check in report["checks"]] == CHECKS
    assert all(check["ok"] for check in report["checks"])
    text = bed.reconciler("smoke").stdout
    assert text.rstrip().endswith("smoke: 7/7 checks passed against http://127.0.0.1:8000 (model deepseek-v4.1-flash)")
    assert bed.api_key() not in result.stdout + result.stderr + text


def test_smoke_with_a_wrong_key_fails_and_says_why(converged: Bed) -> None:
    bed = converged
    wrong = bed.spec.parent / "wrong-key"
    wrong.write_text("not-the-key", encoding="utf-8")
    result = bed.reconciler("smoke", "--key-file", str(wrong), check=False)
    assert result.returncode == 1
    assert "models        FAIL  GET /v1/models answered HTTP 401 (wrong key?)" in result.stdout
    assert "unauthorized  PASS" in result.stdout
    assert "not-the-key" not in result.stdout


def report_path(bed: Bed) -> str:
    """The module's bench report (the head node sees the host's files, the tests read it there)."""
    return str(bed.spec.parent / "bench.json")


@pytest.fixture(scope="module")
def benched(bed: Bed) -> tuple[Bed, subprocess.CompletedProcess[str]]:
    """One small bench run for the module, on the converged group; its report beside the spec."""
    bed.converged()
    argv = [
        "bench",
        "--out",
        report_path(bed),
        "--conc",
        "1",
        "2",
        "--prefill",
        "256",
        "--kinds",
        "prose",
        "--reps",
        "1",
    ]
    return bed, bed.reconciler(*argv, "--ctx", "1000", "--label", "testbed")


def test_a_small_bench_completes_with_a_sane_report(benched: tuple[Bed, subprocess.CompletedProcess[str]]) -> None:
    bed, result = benched
    assert "Decode (no output cap)" in result.stdout
    assert result.stdout.rstrip().endswith("PASS")
    assert bed.api_key() not in result.stdout + result.stderr
    report: Any = json.loads(Path(report_path(bed)).read_text(encoding="utf-8"))
    assert (report["complete"], report["error"], report["model"]) == (True, None, "deepseek-v4.1-flash")
    summary = report["summary"]
    prefill = summary["prefill"][0]
    assert prefill["prompt_tokens"] == 256
    assert prefill["tok_s"]["median"] > 0
    assert [(level["conc"], level["kind"]) for level in summary["decode"]] == [(1, "prose"), (2, "prose")]
    for level in summary["decode"]:
        # The stand-in sleeps TOKEN_DELAY_S per token: no gap, TPOT or stream rate can beat it.
        assert 0 < level["per_stream_tok_s"]["median"] <= 1.1 / TOKEN_DELAY_S
        assert level["tpot_s"]["mean"] >= 0.9 * TOKEN_DELAY_S
        assert level["itl_s"]["mean"] >= 0.9 * TOKEN_DELAY_S
        assert level["ttft_s"]["mean"] > 0
        assert level["completion_tokens"]["mean"] > 1
    for rep in report["decode"]:
        assert all(stream["tokens_from_usage"] for stream in rep["streams"])
    assert summary["recall"][0]["pass"] is True
    assert Path(report_path(bed).replace(".json", ".png")).stat().st_size > 0


def test_bench_compare_of_a_run_with_itself_shows_no_change(
    benched: tuple[Bed, subprocess.CompletedProcess[str]],
) -> None:
    bed, _ = benched
    result = bed.reconciler("bench", "compare", report_path(bed), report_path(bed))
    assert "A testbed" in result.stdout.splitlines()[0]
    assert "decode c2 prose: aggregate tok/s median" in result.stdout
    assert "%" in result.stdout
    rows = json.loads(bed.reconciler("bench", "compare", report_path(bed), report_path(bed), "--json").stdout)["rows"]
    assert all(row["change_pct"] in (0.0, None) for row in rows)
