"""Fixtures shared by the unit tests: a HOME and a redaction registry of each test's own, and the
engine stand-in."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler import redact
from tests.unit.test_engine_standin import Group, Launcher, start_group


@pytest.fixture(autouse=True)
def _own_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`~` is the test's: the developer's ~/.pi, ~/.ssh or ~/.cache must not change what a test sees
    (a directory apart from tmp_path, which tests list)."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.fixture(autouse=True)
def _no_secrets_from_other_tests() -> Iterator[None]:
    """The redaction registry is the process's: a test sees only the secrets it registers itself,
    whatever ran before it."""
    redact.clear()
    yield
    redact.clear()


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    launched = Launcher(tmp_path)
    yield launched
    launched.close()


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    """One healthy two-rank group, started from the rendered argv (the reference flags, the key
    required), shared by a module's read-only API tests."""
    launched = Launcher(tmp_path_factory.mktemp("group"))
    try:
        yield start_group(launched)
    finally:
        launched.close()
