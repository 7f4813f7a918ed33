"""The dependency pins CI installs: the lock (constraints.txt) and the lowest declared versions.

    python3 tools/deps.py lock      rewrite constraints.txt: every package `pip install -e '.[dev]'`
                                    resolves to now (transitive ones and pip itself included), exact
    python3 tools/deps.py lowest    print `name==X` for every direct dependency in pyproject.toml
                                    (runtime and dev), X being its declared lower bound
    python3 tools/deps.py python X.Y
                                    print an interpreter of Python X.Y (on PATH, else pyenv's);
                                    without one, this python3, with a warning

`make setup` installs with `-c constraints.txt`, so every lane but one runs the locked set;
`make unit-lowest` installs with the `lowest` pins instead, so the bounds pyproject.toml
declares are the ones that are tested. Standard library only: `lowest` runs before any venv.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
CONSTRAINTS = ROOT / "constraints.txt"
EXTRAS = ("dev",)
# The installer is locked too: a newer pip may resolve (or build) differently.
TOOLS = ("pip",)

# PEP 508 as pyproject.toml uses it here: a name, optional extras, a comma-separated
# specifier list; environment markers and URLs would need more than this, so they are refused.
_REQUIREMENT = re.compile(r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(?P<specs>[^;@]*)$")
_SPECIFIER = re.compile(r"^\s*(?P<op>===|==|~=|>=|<=|!=|>|<)\s*(?P<version>[A-Za-z0-9.*+!_-]+)\s*$")


class DepsError(Exception):
    """A dependency this tool cannot pin; the message says which and what to change."""


def direct_requirements(pyproject: Path = PYPROJECT) -> list[str]:
    """The runtime dependencies and the EXTRAS, as pyproject.toml declares them."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    requirements = list(project.get("dependencies", []))
    for extra in EXTRAS:
        requirements += project.get("optional-dependencies", {}).get(extra, [])
    return requirements


def lower_bound(requirement: str) -> tuple[str, str]:
    """(name, version) of the requirement's lower bound: its `>=`, `~=` or `==` version."""
    match = _REQUIREMENT.match(requirement)
    if match is None:
        raise DepsError(f"pyproject.toml: cannot read the requirement {requirement!r} (markers and URLs are refused)")
    lows: list[str] = []
    for part in filter(None, (piece.strip() for piece in match["specs"].split(","))):
        specifier = _SPECIFIER.match(part)
        if specifier is None:
            raise DepsError(f"pyproject.toml: {requirement!r}: cannot read the version specifier {part!r}")
        if specifier["op"] in (">=", "~=", "==", "==="):
            lows.append(specifier["version"])
    if len(lows) != 1 or "*" in lows[0]:
        raise DepsError(
            f"pyproject.toml: {requirement!r} needs exactly one lower bound (>=X): "
            "the lowest lane installs every direct dependency at its lower bound"
        )
    return match["name"], lows[0]


def lowest_pins(pyproject: Path = PYPROJECT) -> list[str]:
    return [f"{name}=={version}" for name, version in map(lower_bound, direct_requirements(pyproject))]


def resolved_pins(report: dict[str, Any]) -> list[str]:
    """`name==version` for every package in a `pip install --report` answer, the project
    itself (installed from its directory, not from an index) left out; sorted by name."""
    found = {}
    for item in report.get("install", []):
        if "dir_info" in item.get("download_info", {}):
            continue
        metadata = item["metadata"]
        found[metadata["name"].lower()] = f"{metadata['name']}=={metadata['version']}"
    return [found[name] for name in sorted(found)]


def resolve(python: str = sys.executable) -> list[str]:
    """What pip, run by `python`, resolves the project (with EXTRAS) and TOOLS to now; installs nothing."""
    target = f"{ROOT}[{','.join(EXTRAS)}]"
    argv = [python, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed", "--report", "-"]
    answer = subprocess.run([*argv, *TOOLS, target], check=True, capture_output=True, text=True)
    return resolved_pins(json.loads(answer.stdout))


def interpreter(version: str) -> str:
    """A working `pythonX.Y`: on PATH first (a pyenv shim there may not run), then pyenv's builds."""
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    candidates = [f"python{version}", *sorted(glob.glob(f"{pyenv}/versions/{version}.*/bin/python{version}"))]
    for candidate in candidates:
        if _runs_as(candidate, version):
            return candidate
    print(f"tools/deps.py: no Python {version} found: using {sys.executable}", file=sys.stderr)
    return sys.executable


def _runs_as(python: str, version: str) -> bool:
    check = "import sys; print('%d.%d' % sys.version_info[:2])"
    try:
        answer = subprocess.run([python, "-c", check], capture_output=True, text=True, timeout=30, check=False)
    except OSError:
        return False
    return answer.returncode == 0 and answer.stdout.strip() == version


def constraints_text(pins: list[str], python_version: str) -> str:
    header = (
        "# Every package CI installs, exact (transitive ones and pip included): `make setup` installs\n"
        "# with -c constraints.txt. Generated by `make lock` (tools/deps.py lock) on Python\n"
        f"# {python_version}; regenerate after changing a dependency in pyproject.toml, never edit by hand.\n"
    )
    return header + "".join(f"{pin}\n" for pin in pins)


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) in (2, 3) else ""
    try:
        if command == "python" and len(argv) == 3:
            print(interpreter(argv[2]))
        elif command == "lowest" and len(argv) == 2:
            print("\n".join(lowest_pins()))
        elif command == "lock" and len(argv) == 2:
            version = ".".join(map(str, sys.version_info[:3]))
            CONSTRAINTS.write_text(constraints_text(resolve(), version), encoding="utf-8")
            print(f"wrote {CONSTRAINTS.relative_to(ROOT)}")
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except DepsError as exc:
        print(f"tools/deps.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
