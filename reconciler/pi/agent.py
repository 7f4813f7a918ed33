"""The Pi coding agent on this machine: finding it, and the flows behind `reconciler pi install|uninstall`.

When `pi` is not on PATH, install runs `npm install -g`. Which package depends on node: Pi 1.6.0
(`@earendil-works/pi-coding-agent`) needs node >= 22.19, and under node 20 npm installs it with a mere
warning, after which every `pi` call crashes. So with node 20.6 to 22.18 the 0.73.1 package
(`@mariozechner/pi-coding-agent`, the same agent before it moved) is installed instead, and the
report says so. Node itself is never installed: that is the system's business, and a private node
would need a wrapper on PATH. Versions are pinned to the ones the real-Pi tests run
(tests/integration/test_pi_real.py). An existing `pi` of either package is used as it is.

Every flow returns data; cli.py renders it.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.actions import PiTarget
from reconciler.errors import PiInstallError, ReconcilerError
from reconciler.pi import config
from reconciler.pi import files as pi_files
from reconciler.serving import api_base
from reconciler.spec import Deployment, Pi, Serving

NPM_TIMEOUT_S = 900.0
_NODE_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")

NodeVersion = tuple[int, int, int]


@dataclass(frozen=True)
class NpmPackage:
    name: str
    version: str
    min_node: NodeVersion

    @property
    def spec(self) -> str:
        return f"{self.name}@{self.version}"


PI_CURRENT = NpmPackage("@earendil-works/pi-coding-agent", "1.6.0", (22, 19, 0))
PI_NODE20 = NpmPackage("@mariozechner/pi-coding-agent", "0.73.1", (20, 6, 0))


def parse_node_version(text: str) -> NodeVersion | None:
    match = _NODE_VERSION.match(text.strip())
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def node_version() -> NodeVersion | None:
    """`node --version` of the node on PATH; None when there is none."""
    node = shutil.which("node")
    if node is None:
        return None
    try:
        result = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_node_version(result.stdout) if result.returncode == 0 else None


def _show(version: NodeVersion) -> str:
    return "v" + ".".join(map(str, version))


def choose_package(version: NodeVersion | None) -> tuple[NpmPackage, list[str]]:
    """The Pi package that runs on this node, and a note when it is not the newest one."""
    if version is None:
        raise PiInstallError(
            "node is not on PATH, and Pi runs on node",
            "install Node.js 22.19 or newer (or at least 20.6 for Pi 0.73.1), then run this again",
        )
    if version >= PI_CURRENT.min_node:
        return PI_CURRENT, []
    if version >= PI_NODE20.min_node:
        note = (
            f"node {_show(version)} is older than {_show(PI_CURRENT.min_node)}, which Pi {PI_CURRENT.version} needs: "
            f"installed {PI_NODE20.spec}, the version that runs on it; upgrade node and reinstall for Pi 1.6"
        )
        return PI_NODE20, [note]
    raise PiInstallError(
        f"node {_show(version)} is too old for Pi (0.73.1 needs {_show(PI_NODE20.min_node)}, 1.6 needs "
        f"{_show(PI_CURRENT.min_node)})",
        "install Node.js 22.19 or newer, then run this again",
    )


def npm_install(package: NpmPackage) -> None:
    """`npm install -g`, where npm's own prefix says (set NPM_CONFIG_PREFIX for a user install)."""
    npm = shutil.which("npm")
    if npm is None:
        raise PiInstallError("npm is not on PATH", "install npm (it comes with Node.js), then run this again")
    argv = [npm, "install", "-g", "--no-audit", "--no-fund", package.spec]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=NPM_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise PiInstallError(
            f"`npm install -g {package.spec}` took over {NPM_TIMEOUT_S:.0f} s", "check npm's registry access"
        ) from None
    if result.returncode != 0:
        tail = " / ".join((result.stderr or result.stdout).strip().splitlines()[-4:])
        raise PiInstallError(
            f"`npm install -g {package.spec}` failed (exit {result.returncode}): {tail}",
            "without root, point npm at a prefix you own: NPM_CONFIG_PREFIX=~/.local (and ~/.local/bin on PATH)",
        )


def _npm_bin_hint() -> str:
    npm = shutil.which("npm")
    prefix = ""
    if npm is not None:
        result = subprocess.run([npm, "prefix", "-g"], capture_output=True, text=True, timeout=60, check=False)
        prefix = result.stdout.strip()
    return f"add {prefix or '$(npm prefix -g)'}/bin to PATH, then run this again"


@dataclass(frozen=True)
class PiAgent:
    path: str
    package: str | None
    installed_now: bool
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "package": self.package, "installed_now": self.installed_now}


def ensure_pi() -> PiAgent:
    """The `pi` on PATH, installed with npm first when there is none."""
    path, package = locate_pi()
    if path is not None:
        return PiAgent(path, package, installed_now=False, notes=tuple(_runs_here(package)))
    chosen, notes = choose_package(node_version())
    npm_install(chosen)
    path, package = locate_pi()
    if path is None:
        raise PiInstallError(f"npm installed {chosen.spec}, but `pi` is not on PATH", _npm_bin_hint())
    return PiAgent(path, package, installed_now=True, notes=tuple(notes))


def _runs_here(package: str | None) -> list[str]:
    """A Pi 1.6 already installed under an old node crashes on every call: say so, do not hide it."""
    if package is None or not package.startswith(PI_CURRENT.name + "@"):
        return []
    version = node_version()
    if version is None or version >= PI_CURRENT.min_node:
        return []
    return [
        f"{package} needs node {_show(PI_CURRENT.min_node)} but node is {_show(version)}: every `pi` call will "
        f"crash; upgrade node, or `npm install -g {PI_NODE20.spec}`"
    ]


def install_target(
    deployment: Deployment | None, base_url: str | None, key_env: str | None, set_default: bool | None
) -> PiTarget:
    """The command line over the spec: BASE_URL, --key-env and --set-default win when given.

    Without a spec (Pi on a laptop, say) the model entry takes the defaults of a two-node spec.
    """
    if deployment is not None:
        serving, pi, nodes = deployment.serving, deployment.pi, len(deployment.nodes)
        url = base_url if base_url is not None else api_base(deployment)
    elif base_url is not None:
        serving, pi, nodes, url = Serving(), Pi(), 2, base_url
    else:
        raise ReconcilerError(
            "no BASE_URL and no spec to take the API address from",
            "give the API's address: reconciler pi install http://<head>:8000 (or --spec PATH)",
        )
    return config.target_for(
        serving,
        pi.provider,
        nodes,
        base_url=url,
        key_env=key_env or config.DEFAULT_KEY_ENV,
        set_default=pi.set_default if set_default is None else set_default,
    )


# What `install` and `uninstall` hold while they read and write Pi's config: the deployment's lock
# when there is a deployment, so a converge configuring Pi never writes the same files meanwhile.
Holding = Callable[[], AbstractContextManager[object]]


def install(target: PiTarget, holding: Holding = contextlib.nullcontext) -> dict[str, Any]:
    """Check the config can be edited, make sure Pi is there, then write what differs."""
    directory = pi_files.agent_dir()
    changes = config.install_changes(pi_files.read_files(directory, target.provider), target)
    pi_files.check_writable(directory, changes)  # before npm: a refusal then leaves the machine as it was
    agent = ensure_pi()
    with holding():  # read again under the lock: a converge may have written meanwhile
        changes = config.install_changes(pi_files.read_files(directory, target.provider), target)
        backups = pi_files.write_changes(directory, changes, target.provider)
    return {
        "ok": True,
        "dir": str(directory),
        "pi": agent.to_dict(),
        "notes": list(agent.notes),
        "provider": target.provider,
        "model": target.model_ref,
        "base_url": target.base_url,
        "key_env": target.key_env,
        "changed": not changes.unchanged,
        "changes": changes.messages,
        "backups": backups,
    }


def uninstall(provider: str, holding: Holding = contextlib.nullcontext) -> dict[str, Any]:
    directory = pi_files.agent_dir()
    with holding():
        changes = config.uninstall_changes(pi_files.read_files(directory, provider), provider)
        backups = pi_files.write_changes(directory, changes, provider)
    return {
        "ok": True,
        "dir": str(directory),
        "provider": provider,
        "changed": not changes.unchanged,
        "changes": changes.messages,
        "backups": backups,
    }


PI_PACKAGES = (PI_CURRENT.name, PI_NODE20.name)


def locate_pi(search_path: str | None = None) -> tuple[str | None, str | None]:
    """`pi` on PATH and the package behind it ("name@version"), without running it (node starts slowly)."""
    found = shutil.which("pi", path=search_path)
    return (found, package_of(Path(found))) if found else (None, None)


def package_of(executable: Path) -> str | None:
    """npm links bin/pi to <package>/dist/cli.js; the nearest package.json above it names the package."""
    try:
        candidates = (parent / "package.json" for parent in list(executable.resolve().parents)[:4])
        manifest = next((candidate for candidate in candidates if candidate.is_file()), None)
        data = json.loads(manifest.read_text(encoding="utf-8")) if manifest else None
    except (OSError, RuntimeError, ValueError, RecursionError):  # unreadable, a symlink loop, not JSON
        return None
    name = data.get("name") if isinstance(data, dict) else None
    return f"{name}@{data.get('version')}" if isinstance(data, dict) and name in PI_PACKAGES else None
