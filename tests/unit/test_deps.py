"""The pins CI installs (tools/deps.py): the lock agrees with pyproject.toml, the lowest pins are its bounds."""

from __future__ import annotations

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tools import deps

# Checked with the locked releases only (the Makefile's unit-lowest runs no mypy).
TYPE_CHECK_ONLY = {"mypy", "types-pyyaml", "types-paramiko"}


def locked() -> dict[str, Version]:
    lines = deps.CONSTRAINTS.read_text(encoding="utf-8").splitlines()
    pins = [line.split("==") for line in lines if line and not line.startswith("#")]
    return {str(canonicalize_name(name)): Version(version) for name, version in pins}


@pytest.mark.parametrize(
    ("requirement", "bound"),
    [
        ("pydantic>=2.11,!=2.12.0,<3", ("pydantic", "2.11")),
        ("huggingface_hub >= 2.1.1, <2.5", ("huggingface_hub", "2.1.1")),
        ("types-PyYAML>=6.0.12.20261122", ("types-PyYAML", "6.0.12.20261122")),
        ("uvicorn[standard]~=0.30", ("uvicorn", "0.30")),
    ],
)
def test_the_lower_bound_is_the_one_version_that_starts_the_range(requirement: str, bound: tuple[str, str]) -> None:
    assert deps.lower_bound(requirement) == bound


@pytest.mark.parametrize(
    ("requirement", "says"),
    [
        ("types-requests", "needs exactly one lower bound"),
        ("requests<3", "needs exactly one lower bound"),
        ("a>=1,>=2", "needs exactly one lower bound"),
        ("a==1.*", "needs exactly one lower bound"),
        ("a>=1; python_version < '3.12'", "markers and URLs are refused"),
        ("a @ https://example.invalid/a.whl", "markers and URLs are refused"),
        ("a>=1,=>2", "cannot read the version specifier '=>2'"),
    ],
)
def test_a_requirement_the_lowest_lane_cannot_pin_is_refused_with_its_name(requirement: str, says: str) -> None:
    with pytest.raises(deps.DepsError, match=r"^pyproject\.toml: ") as refused:
        deps.lower_bound(requirement)
    assert says in str(refused.value)
    assert requirement.split(">")[0].split("<")[0].split(";")[0].split("@")[0].strip() in str(refused.value)


def test_every_direct_dependency_is_pinned_once_at_its_lower_bound() -> None:
    pins = deps.lowest_pins()
    requirements = [Requirement(text) for text in deps.direct_requirements()]
    assert len(pins) == len(requirements)
    for pin, requirement in zip(pins, requirements, strict=True):
        name, version = pin.split("==")
        assert name == requirement.name
        assert requirement.specifier.contains(version), f"{pin} is outside {requirement}"


def test_the_lock_pins_every_direct_dependency_inside_its_declared_range_and_pip() -> None:
    pins = locked()
    assert "pip" in pins
    for text in deps.direct_requirements():
        requirement = Requirement(text)
        name = str(canonicalize_name(requirement.name))
        assert name in pins, f"constraints.txt lacks {name}: run `make lock`"
        assert requirement.specifier.contains(pins[name]), f"constraints.txt: {name}=={pins[name]} outside {text}"


def test_type_checking_tools_are_bounded_below_by_the_locked_release() -> None:
    pins = locked()
    bounds = {
        str(canonicalize_name(name)): Version(low) for name, low in map(deps.lower_bound, deps.direct_requirements())
    }
    assert set(bounds) >= TYPE_CHECK_ONLY
    for name in TYPE_CHECK_ONLY:
        assert bounds[name] == pins[name], f"pyproject.toml: {name}>={pins[name]} (only the locked one is run)"


def test_a_resolution_report_becomes_sorted_exact_pins_without_the_project_itself() -> None:
    report = {
        "install": [
            {"metadata": {"name": "PyYAML", "version": "6.0.4"}, "download_info": {"url": "https://x/y.whl"}},
            {"metadata": {"name": "spark-reconciler", "version": "0.1.0"}, "download_info": {"dir_info": {}}},
            {"metadata": {"name": "httpcore2", "version": "2.16.2"}, "download_info": {}},
            {"metadata": {"name": "httpcore", "version": "1.0.9"}, "download_info": {}},
        ]
    }
    assert deps.resolved_pins(report) == ["httpcore==1.0.9", "httpcore2==2.16.2", "PyYAML==6.0.4"]
    text = deps.constraints_text(deps.resolved_pins(report), "3.12.1")
    assert "Python\n# 3.12.1" in text
    assert text.endswith("PyYAML==6.0.4\n")
