"""The engine stand-in's test-only request log (ENGINE_REQUEST_LOG): one JSON line per request,
before auth, with the Authorization header and the JSON body, so clients' keys and fields can be checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.ports import free_port
from tests.scenarios import ROOT

BOOT = (
    f"import sys; sys.path.insert(0, {str(ROOT / 'tests/testbed/engine')!r}); "
    "from engine import main; raise SystemExit(main(sys.argv[1:]))"
)


def test_every_request_is_logged_with_its_key_and_body(tmp_path: Path) -> None:
    log, port = tmp_path / "requests.jsonl", free_port()
    argv = ["serve", str(tmp_path), "--served-model-name", "m", "--host", "127.0.0.1", "--port", str(port)]
    env = {
        **{name: value for name, value in os.environ.items() if not name.startswith(("ENGINE_", "VLLM_"))},
        **{"VLLM_API_KEY": "k1", "ENGINE_REQUEST_LOG": str(log), "ENGINE_STARTUP_DELAY_S": "0"},
        **{"ENGINE_TOKEN_DELAY_S": "0", "ENGINE_SHUTDOWN_S": "0"},
    }
    argv += ["--master-port", str(free_port())]
    proc = subprocess.Popen([sys.executable, "-c", BOOT, *argv], env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/health", timeout=1.0)
                break
            except httpx.TransportError:
                assert proc.poll() is None, "engine exited"
                assert time.monotonic() < deadline, "engine did not start"
                time.sleep(0.05)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
        assert httpx.post(f"{url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer k1"}).is_success
        assert httpx.post(f"{url}/v1/chat/completions", content=b"not json").status_code == 401
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    lines = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert lines[0] == {"method": "GET", "path": "/health", "authorization": None, "body": None}
    assert lines[1] == {"method": "POST", "path": "/v1/chat/completions", "authorization": "Bearer k1", "body": body}
    assert lines[2] == {"method": "POST", "path": "/v1/chat/completions", "authorization": None, "body": None}
