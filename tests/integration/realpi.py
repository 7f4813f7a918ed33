"""The real Pi coding agent from npm, installed once into .pi-test/ for tests/integration/test_pi_real.py.

Both packages `reconciler pi install` may choose are tested: Pi 0.73.1
(`@mariozechner/pi-coding-agent`, node >= 20.6) and Pi 1.6.0 (`@earendil-works/pi-coding-agent`,
node >= 22.19). When the system node is older than 22.19, node 22 comes from the npm registry as well
(the `node` package) into .pi-test/node-22, and only Pi 1.6.0's runs put it first on PATH. Nothing but
the npm registry is contacted, nothing is installed outside .pi-test/, and a finished install is
stamped and not repeated. `make pi-test-install` runs this module; the tests' session fixture calls
it too, so a plain `pytest` works.

    .venv/bin/python -m tests.integration.realpi
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from reconciler.pi.agent import PI_CURRENT, PI_NODE20, NpmPackage, node_version

ROOT = Path(__file__).resolve().parents[2]
PREFIX = ROOT / ".pi-test"
NODE22 = "node@22.23.3"
NPM_TIMEOUT_S = 900


@dataclass(frozen=True)
class PiRuntime:
    """One installed Pi: its executable and what goes first on PATH to run it (node 22 for Pi 1.6)."""

    version: str
    package: str
    pi: Path
    path_first: tuple[Path, ...] = ()

    def path(self, rest: str | None = None) -> str:
        tail = os.environ.get("PATH", "/usr/bin:/bin") if rest is None else rest
        return ":".join([*map(str, self.path_first), str(self.pi.parent), tail])


def missing_tools() -> str | None:
    """Why the real-Pi tests cannot run here (they need node and npm), or None."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    return f"{' and '.join(missing)} not on PATH: the real Pi cannot be installed" if missing else None


def _npm_install(prefix: Path, spec: str, path: str) -> None:
    stamp = prefix / ".installed"
    if stamp.exists() and stamp.read_text(encoding="utf-8") == spec:
        return
    shutil.rmtree(prefix, ignore_errors=True)
    prefix.mkdir(parents=True)
    sys.stderr.write(f"npm: installing {spec} into {prefix.relative_to(ROOT)} ...\n")
    started = time.monotonic()
    argv = ["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error", spec]
    result = subprocess.run(
        argv, env={**os.environ, "PATH": path}, capture_output=True, text=True, timeout=NPM_TIMEOUT_S, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed (exit {result.returncode}):\n{result.stdout}{result.stderr}")
    stamp.write_text(spec, encoding="utf-8")
    sys.stderr.write(f"npm: {spec} installed in {time.monotonic() - started:.0f} s\n")


def _install_pi(package: NpmPackage, path_first: tuple[Path, ...]) -> PiRuntime:
    prefix = PREFIX / f"pi-{package.version}"
    path = ":".join([*map(str, path_first), os.environ.get("PATH", "/usr/bin:/bin")])
    _npm_install(prefix, package.spec, path)
    return PiRuntime(package.version, package.spec, prefix / "node_modules/.bin/pi", path_first)


def ensure_runtimes() -> dict[str, PiRuntime]:
    """Both Pi versions, keyed by version; installs what is missing (about 45 s the first time)."""
    runtimes = [_install_pi(PI_NODE20, ())]
    node = node_version()
    path_first: tuple[Path, ...] = ()
    if node is None or node < PI_CURRENT.min_node:
        _npm_install(PREFIX / "node-22", NODE22, os.environ.get("PATH", "/usr/bin:/bin"))
        path_first = (PREFIX / "node-22/node_modules/.bin",)
    runtimes.append(_install_pi(PI_CURRENT, path_first))
    return {runtime.version: runtime for runtime in runtimes}


def main() -> int:
    reason = missing_tools()
    if reason is not None:
        sys.stderr.write(f"{reason}; the real-Pi tests will be skipped\n")
        return 0
    for runtime in ensure_runtimes().values():
        sys.stderr.write(f"ready: Pi {runtime.version} at {runtime.pi.relative_to(ROOT)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
