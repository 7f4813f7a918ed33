"""Fixtures shared by the unit tests that run the engine stand-in."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.test_engine_standin import Group, Launcher, start_group


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
