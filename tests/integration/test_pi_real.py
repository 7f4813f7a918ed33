"""The real Pi coding agent (0.73.1 and 1.6.0 from npm) against the vLLM stand-in on 127.0.0.1.

What the Pi integration must do, end to end: after `reconciler pi install`, `pi --model
dsv41-sparks/deepseek-v4.1-flash -p ...` answers; the engine's request log (ENGINE_REQUEST_LOG) shows
the bearer key from the environment and no max_tokens / max_completion_tokens; the key is nowhere
under the Pi dir; a config with comments, another provider and enabledModels survives and comes back
byte for byte after uninstall; the other provider's requests keep their cap; an unset key fails with a
clear message and sends nothing. Every Pi run is bounded and reads /dev/null (print mode otherwise
reads a non-TTY stdin to EOF, even with -p), with
PI_OFFLINE=1 so Pi itself contacts nothing but the engine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from reconciler.cli import main
from reconciler.pi import agent as pi_agent
from tests.integration.realpi import PiRuntime, ensure_runtimes, missing_tools
from tests.ports import free_port
from tests.scenarios import ROOT, SPEC_PATH

KEY = "pi-real-test-key-4f1c9a0e7d"
MODEL = "deepseek-v4.1-flash"
REF = f"dsv41-sparks/{MODEL}"
OTHER = "other-model"
PI_TIMEOUT_S = 120
ENGINE_DIR = ROOT / "tests/testbed/engine"
BOOT = (
    f"import sys; sys.path.insert(0, {str(ENGINE_DIR)!r}); "
    "from engine import main; raise SystemExit(main(sys.argv[1:]))"
)
CAPS = ("max_tokens", "max_completion_tokens")
EXISTING_MODELS = """{
  // Providers I use; see https://example.com//pi-docs (a URL in a comment)
  "providers": {
    "other-local": {
      "baseUrl": "__URL__/v1", // same box, another model
      "api": "openai-completions",
      "apiKey": "__KEY__",
      "models": [{"id": "other-model", "name": "Other"},],
    },
  },
}
"""
EXISTING_SETTINGS = (
    '{\n  "defaultProvider": "other-local",\n  "defaultModel": "other-model",\n'
    '  "enabledModels": ["other-local/other-model"]\n}\n'
)


@dataclass
class Engine:
    """A one-rank stand-in serving both model names, logging each request."""

    url: str
    log: Path

    def requests(self) -> list[dict[str, Any]]:
        text = self.log.read_text(encoding="utf-8") if self.log.exists() else ""
        return [json.loads(line) for line in text.splitlines()]

    def chats_after(self, mark: int) -> list[dict[str, Any]]:
        return [r for r in self.requests()[mark:] if r["path"] == "/v1/chat/completions"]


@dataclass
class PiHome:
    runtime: PiRuntime
    home: Path
    agent: Path

    def run(self, *args: str, key: str | None = KEY) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": self.runtime.path(),
            "HOME": str(self.home),
            "PI_CODING_AGENT_DIR": str(self.agent),
            "PI_OFFLINE": "1",
            "TERM": "dumb",
            **({"DSV41_API_KEY": key} if key is not None else {}),
        }
        return subprocess.run(
            [str(self.runtime.pi), *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=PI_TIMEOUT_S,
            env=env,
            cwd=self.home,
            check=False,
        )


@pytest.fixture(scope="session")
def runtimes() -> dict[str, PiRuntime]:
    reason = missing_tools()
    if reason is not None:
        pytest.skip(reason)
    return ensure_runtimes()


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    directory = tmp_path_factory.mktemp("engine")
    (directory / "model").mkdir()
    port = free_port()
    argv = [
        *("serve", str(directory / "model"), "--served-model-name", MODEL, OTHER),
        *("--host", "127.0.0.1", "--port", str(port), "--master-port", str(free_port())),
        *("--max-model-len", "262144", "--enable-auto-tool-choice", "--tool-call-parser", "deepseek_v41"),
        *("--reasoning-parser", "deepseek_v41"),
    ]
    env = {
        **{name: value for name, value in os.environ.items() if not name.startswith(("ENGINE_", "VLLM_"))},
        "VLLM_API_KEY": KEY,
        "ENGINE_REQUEST_LOG": str(directory / "requests.jsonl"),
        **{"ENGINE_STARTUP_DELAY_S": "0", "ENGINE_TOKEN_DELAY_S": "0", "ENGINE_SHUTDOWN_S": "0"},
    }
    with (directory / "engine.log").open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", BOOT, *argv], stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(proc, url, directory / "engine.log")
        yield Engine(url, directory / "requests.jsonl")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, f"engine exited:\n{log.read_text()}"
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"engine not healthy:\n{log.read_text()}"
        time.sleep(0.05)


@pytest.fixture(params=["0.73.1", "1.6.0"])
def pi(
    request: pytest.FixtureRequest, runtimes: dict[str, PiRuntime], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> PiHome:
    """A fresh HOME and Pi dir for one Pi version; the in-process CLI sees the same environment."""
    runtime = runtimes[request.param]
    home = tmp_path / "home"
    home.mkdir()
    agent = home / ".pi" / "agent"
    monkeypatch.setenv("PATH", runtime.path())
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(agent))
    monkeypatch.delenv("DSV41_API_KEY", raising=False)
    return PiHome(runtime, home, agent)


def reconciler(*argv: str) -> None:
    assert main([*argv, "--spec", str(SPEC_PATH)]) == 0


def files_containing(root: Path, needle: str) -> list[str]:
    return [str(path) for path in root.rglob("*") if path.is_file() and needle.encode() in path.read_bytes()]


def test_pi_answers_with_the_key_from_the_environment_and_no_output_cap(pi: PiHome, engine: Engine) -> None:
    reconciler("pi", "install", engine.url)
    mark = len(engine.requests())
    result = pi.run("--model", REF, "-p", "say hi")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    chats = engine.chats_after(mark)
    assert chats, "Pi sent no chat request"
    for chat in chats:
        assert chat["authorization"] == f"Bearer {KEY}"
        assert chat["body"]["model"] == MODEL
        assert not set(CAPS) & set(chat["body"]), chat["body"].keys()
    assert files_containing(pi.agent, KEY) == []
    assert files_containing(pi.home, KEY) == []


def test_an_existing_config_survives_and_other_providers_keep_their_cap(pi: PiHome, engine: Engine) -> None:
    pi.agent.mkdir(parents=True)
    models = EXISTING_MODELS.replace("__URL__", engine.url).replace("__KEY__", KEY)
    (pi.agent / "models.json").write_text(models, encoding="utf-8")
    (pi.agent / "settings.json").write_text(EXISTING_SETTINGS, encoding="utf-8")
    reconciler("pi", "install", engine.url, "--set-default")
    installed = (pi.agent / "models.json").read_text(encoding="utf-8")
    assert installed.startswith(models[: models.index("  },\n}")])  # comments, other provider: same bytes
    settings = json.loads((pi.agent / "settings.json").read_text(encoding="utf-8"))
    assert settings["enabledModels"] == ["other-local/other-model", REF]

    mark = len(engine.requests())
    assert pi.run("-p", "say hi").returncode == 0  # no --model: set-default wins over enabledModels' first
    ours = engine.chats_after(mark)
    assert {chat["body"]["model"] for chat in ours} == {MODEL}
    assert all(not set(CAPS) & set(chat["body"]) for chat in ours)

    mark = len(engine.requests())
    result = pi.run("--model", f"other-local/{OTHER}", "-p", "say hi")
    assert result.returncode == 0, result.stderr
    others = engine.chats_after(mark)
    assert others
    assert all(chat["body"]["model"] == OTHER and set(CAPS) & set(chat["body"]) for chat in others)

    reconciler("pi", "uninstall")
    assert (pi.agent / "models.json").read_text(encoding="utf-8") == models
    assert (pi.agent / "settings.json").read_text(encoding="utf-8") == EXISTING_SETTINGS
    assert not (pi.agent / "extensions/dsv41-sparks.ts").exists()


def test_an_unset_key_fails_clearly_and_sends_nothing(pi: PiHome, engine: Engine) -> None:
    reconciler("pi", "install", engine.url)
    mark = len(engine.requests())
    result = pi.run("--model", REF, "-p", "say hi", key=None)
    assert result.returncode == 1
    output = result.stdout + result.stderr
    assert "dsv41-sparks: DSV41_API_KEY is not set; export DSV41_API_KEY=" in output
    assert "printenv DSV41_API_KEY" in output  # Pi's own refusal: no request without a key
    assert engine.requests()[mark:] == []


def test_install_fetches_pi_with_npm_when_it_is_missing(
    runtimes: dict[str, PiRuntime],
    engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`npm install -g` into a temp prefix (NPM_CONFIG_PREFIX): the package follows the node version."""
    del runtimes  # installed first, so npm's cache (offline-first here) makes this install quicker
    prefix, home = tmp_path / "prefix", tmp_path / "home"
    home.mkdir()
    tools = {str(Path(shutil.which(tool) or tool).parent) for tool in ("node", "npm")}
    path = ":".join([str(prefix / "bin"), *sorted(tools), "/usr/bin", "/bin"])
    if shutil.which("pi", path=path):
        pytest.skip(f"a pi is installed system-wide ({shutil.which('pi', path=path)}): nothing to install")
    cache = str(Path(os.environ.get("NPM_CONFIG_CACHE", "~/.npm")).expanduser())  # before HOME moves
    environment = {"PATH": path, "HOME": str(home), "NPM_CONFIG_PREFIX": str(prefix), "NPM_CONFIG_CACHE": cache}
    for name, value in {
        **environment,
        "NPM_CONFIG_PREFER_OFFLINE": "true",
        "PI_CODING_AGENT_DIR": str(home / "agent"),
    }.items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    reconciler("pi", "install", engine.url, "--json")
    report = json.loads(capsys.readouterr().out)
    node = pi_agent.node_version()
    expected = pi_agent.PI_CURRENT if node and node >= pi_agent.PI_CURRENT.min_node else pi_agent.PI_NODE20
    assert report["pi"] == {"path": str(prefix / "bin/pi"), "package": expected.spec, "installed_now": True}
    assert bool(report["notes"]) == (expected is pi_agent.PI_NODE20)
    pi_path = prefix / "bin/pi"
    runtime = PiRuntime("installed", "", pi_path)
    result = PiHome(runtime, home, home / "agent").run("--model", REF, "-p", "say hi")
    assert result.returncode == 0, result.stderr
