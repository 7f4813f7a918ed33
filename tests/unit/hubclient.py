"""The real huggingface_hub client against the Hub stand-in, isolated from the host: shared by
the unit tests that download through it."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from huggingface_hub import close_session, constants

from tests.testbed.hub import StandinHub, build_checkpoint


def isolate_client(monkeypatch: pytest.MonkeyPatch, hf_home: Path) -> None:
    """Temp HF_HOME, no token, no Xet, no telemetry, not offline."""
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    # huggingface_hub reads these at import time, which may have happened before the test ran.
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)


def isolated_client(monkeypatch: pytest.MonkeyPatch, hf_home: Path) -> Iterator[None]:
    """`isolate_client`, then a fresh HTTP session for the next test (for a fixture to yield from)."""
    isolate_client(monkeypatch, hf_home)
    yield
    close_session()


def serving_checkpoint(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, *, shard_mib: float, part_mib: float
) -> Iterator[StandinHub]:
    """A stand-in Hub serving a reference-shaped checkpoint, the client isolated (for a fixture)."""
    data = tmp_path_factory.mktemp("hub")
    build_checkpoint(data, shard_mib=shard_mib, part_mib=part_mib)
    isolate_client(monkeypatch, tmp_path_factory.mktemp("hf-home"))
    server = StandinHub(data).start()
    try:
        yield server
    finally:
        server.stop()


def kill_when(process: subprocess.Popen[bytes], ready: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """SIGKILL a download in another process as soon as `ready()` says it got far enough."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=10)
            return
        time.sleep(0.02)
    process.kill()
    raise AssertionError(f"the download never got far enough to be killed {what}")
