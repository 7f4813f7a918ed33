"""What every test run starts from: none of the host's settings for the reconciler or the Hub client.

A developer's shell may carry a Hub token, an offline switch, a debug flag or systemd's notify
socket; a test that sees them tests the host, not the code. They are dropped in pytest_configure,
before any test module imports huggingface_hub (which reads some of them at import time); a test
that needs one sets it with monkeypatch. HF_HOME points at an empty directory of the run's own,
so the client finds no stored token and no cache of the developer's. (tests/unit/conftest.py
also gives every unit test a HOME of its own.)
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

HOST_PREFIXES = ("HF_", "HUGGING_FACE_", "RECONCILER_")
HOST_VARIABLES = frozenset(
    {
        "TRANSFORMERS_OFFLINE",  # the Hub client's other offline switch
        "NOTIFY_SOCKET",  # systemd's: the loop would notify the host's service manager
        "WATCHDOG_USEC",
        "WATCHDOG_PID",
        "PI_CODING_AGENT_DIR",  # the Pi configurator's target
        "DSV41_API_KEY",  # the key variable Pi's provider is told to read
        "SUDO_USER",  # install-service renders the unit for this user
        "DOCKER_HOST",  # the Docker client would talk to the host's daemon
        "SSH_AUTH_SOCK",  # paramiko would offer the host's agent keys
    }
)


def host_variables(environ: dict[str, str] | os._Environ[str]) -> list[str]:
    return sorted(name for name in environ if name in HOST_VARIABLES or name.startswith(HOST_PREFIXES))


_HF_HOME: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    del config
    for name in host_variables(os.environ):
        del os.environ[name]
    _HF_HOME.append(tempfile.mkdtemp(prefix="reconciler-tests-hf-home-"))
    os.environ["HF_HOME"] = _HF_HOME[-1]


def pytest_unconfigure(config: pytest.Config) -> None:
    del config
    for directory in _HF_HOME:
        shutil.rmtree(directory, ignore_errors=True)
