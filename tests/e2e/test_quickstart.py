"""The README's quickstart, followed on the testbed's nodes as if they were Sparks.

Step 1 installs the reconciler the way the quickstart says, with pipx from the checkout, into
a pipx home of the test's own (nothing of the development venv is used from then on); steps 3
to 7 run that installed `reconciler` on the head: `init` against the worker, `doctor`, `plan`,
`apply`, `status`, `install-service --dry-run` (a namespace has no systemd; the unit under a
real systemd is tests/system's). Between init and doctor the testbed user edits the spec as
tests/e2e/userspec.py says. Install and init happen once for the module (`installed`,
`initialized`); the step that shows the bring-up starts from nothing deployed, so the tests run
in any order.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import ROOT, Bed
from tests.e2e.test_init import FABRIC_IP, HONEST_FAILURES, MODEL_DIR, WORKER_LOGIN
from tests.e2e.userspec import edited_like_a_user

pytestmark = pytest.mark.testbed

DEV_TOOLS = ("pytest", "ruff", "mypy", "hypothesis")


class Installed:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin" / "reconciler"
        self.workdir = root / "spark"
        self.workdir.mkdir()

    @property
    def spec(self) -> Path:
        return self.workdir / "specs" / "deployment.yaml"

    def run(self, bed: Bed, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        """`reconciler ARGS` as typed in ~/spark on the head: the installed one, no --spec."""
        started = time.monotonic()
        result = bed.testbed.exec(
            "spark-head", [str(self.bin), *args], cwd=str(self.workdir), check=False, timeout=timeout
        )
        print(f"$ reconciler {' '.join(args)}  ({time.monotonic() - started:.1f} s, exit {result.returncode})")
        print(result.stdout[-3000:] + result.stderr[-3000:])
        return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """Step 1: `pipx install <checkout>` (the testbed installs Debian's pipx)."""
    pipx = shutil.which("pipx")
    assert pipx is not None, "pipx is missing: `python3 -m tests.testbed install` installs it"
    place = Installed(tmp_path_factory.mktemp("quickstart"))
    env = {
        **os.environ,
        "PIPX_HOME": str(place.root / "pipx"),
        "PIPX_BIN_DIR": str(place.root / "bin"),
        "PIPX_MAN_DIR": str(place.root / "man"),
    }
    env.pop("VIRTUAL_ENV", None)
    started = time.monotonic()
    # The checkout's tracked files only, as a clone has them (no .venv, no caches).
    source = place.root / "checkout"
    archive = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
    for name in filter(None, archive.decode().split("\0")):
        target = source / name
        if (ROOT / name).is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target)
    result = subprocess.run([pipx, "install", str(source)], env=env, capture_output=True, text=True, check=False)
    print(f"pipx install: {time.monotonic() - started:.1f} s\n{result.stdout}{result.stderr}")
    assert result.returncode == 0, result.stderr
    assert place.bin.is_file()
    return place


def test_the_install_has_the_command_and_none_of_the_development_tools(installed: Installed) -> None:
    version = subprocess.run([str(installed.bin), "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith("reconciler ")
    venv_python = installed.bin.resolve().parent / "python"
    listed = subprocess.run(
        [str(venv_python), "-m", "pip", "list", "--format", "json"], capture_output=True, text=True, check=False
    )
    names = {entry["name"].lower() for entry in json.loads(listed.stdout)} if listed.returncode == 0 else set()
    if not names:  # a pipx venv may have no pip of its own: ask the interpreter what it can import
        probe = "import importlib.util, json; print(json.dumps([n for n in %r if importlib.util.find_spec(n)]))"
        found = subprocess.run(
            [str(venv_python), "-c", probe % (DEV_TOOLS,)], capture_output=True, text=True, check=True
        )
        assert json.loads(found.stdout) == []
    else:
        assert "spark-reconciler" in names
        assert names.isdisjoint(DEV_TOOLS)
    assert Path(sys.executable).resolve() != venv_python.resolve()


@pytest.fixture(scope="module")
def initialized(bed: Bed, installed: Installed) -> tuple[Installed, str]:
    """Step 3, `reconciler init`, once for the module: the install, and the draft as init wrote it
    (the spec itself is then edited as tests/e2e/userspec.py says, for steps 4 to 7)."""
    result = installed.run(bed, "init", "--worker", WORKER_LOGIN, "--model-dir", MODEL_DIR)
    assert result.returncode == 0, result.stderr
    text = installed.spec.read_text(encoding="utf-8")
    installed.spec.write_text(edited_like_a_user(text, bed.spec.read_text(encoding="utf-8")), encoding="utf-8")
    return installed, text


def test_step_3_init_writes_the_spec(bed: Bed, initialized: tuple[Installed, str]) -> None:
    installed, draft = initialized
    assert FABRIC_IP["spark-worker"] in draft
    assert installed.run(bed, "validate").returncode == 0


def test_step_4_doctor_fails_only_on_what_the_testbed_lacks(bed: Bed, initialized: tuple[Installed, str]) -> None:
    installed, _ = initialized
    result = installed.run(bed, "doctor", "--json")
    report: Any = json.loads(result.stdout)
    failed = {check["check"] for check in report["checks"] if check["status"] == "FAIL"}
    assert failed <= HONEST_FAILURES, failed - HONEST_FAILURES


def test_step_5_plan_shows_the_bring_up(bed: Bed, initialized: tuple[Installed, str]) -> None:
    installed, _ = initialized
    bed.fresh()  # a bring-up to show: nothing deployed
    result = installed.run(bed, "plan", "--detailed-exitcode", "--json")
    assert result.returncode == 2, result.stderr
    steps = {(action["step"], action["node"]) for action in json.loads(result.stdout)["actions"]}
    # (The testbed's nodes already hold the engine image: no pull.)
    for node in ("spark-head", "spark-worker"):
        for step in ("memguard.start", "ranks.start"):
            assert (step, node) in steps, (step, node)
    for step, node in (("checkpoint.download", "spark-head"), ("apikey.create", "spark-head")):
        assert (step, node) in steps, (step, node)
    assert ("checkpoint.copy", "spark-worker") in steps


def test_step_6_apply_converges_and_status_says_so(bed: Bed, initialized: tuple[Installed, str]) -> None:
    installed, _ = initialized
    assert installed.run(bed, "apply").returncode == 0
    assert installed.run(bed, "plan", "--detailed-exitcode").returncode == 0
    status = installed.run(bed, "status")
    assert status.returncode == 0
    assert status.stdout.startswith("deployment dsv41: converged")


def test_step_7_install_service_renders_the_unit_for_the_installed_command(
    bed: Bed, initialized: tuple[Installed, str]
) -> None:
    installed, _ = initialized
    result = installed.run(bed, "install-service", "--spec", str(installed.spec), "--dry-run")
    assert result.returncode == 0, result.stderr
    assert f"ExecStart={installed.bin.resolve()} run --spec {installed.spec}" in result.stdout
