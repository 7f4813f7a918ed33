"""The vLLM stand-in (tests/testbed/engine) as real processes on loopback: argv, rank coupling,
the failure semantics measured on real vLLM and the API's observable behaviour."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from reconciler.serving import vllm_argv
from tests.ports import free_port
from tests.scenarios import ROOT, reference_deployment, with_serving

ENGINE_DIR = ROOT / "tests/testbed/engine"
BOOT = (
    f"import sys; sys.path.insert(0, {str(ENGINE_DIR)!r}); "
    "from engine import main; raise SystemExit(main(sys.argv[1:]))"
)
KEY = "standin-test-key-0123456789abcdef"
MODEL = "deepseek-v4.1-flash"
MAX_MODEL_LEN = 262144  # the default spec's
FAST = {"ENGINE_STARTUP_DELAY_S": "0.2", "ENGINE_SHUTDOWN_S": "1", "ENGINE_TOKEN_DELAY_S": "0"}
FAST |= {"ENGINE_JOIN_NOTICE_S": "1"}
UNAUTHORIZED = b'{"error":"Unauthorized"}'
# How long a test waits for what the stand-in will do: only a broken one takes this long, a
# loaded machine at most seconds.
WAIT_S = 60.0
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
Pixel = Callable[[int, int], tuple[int, int, int]]


def refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
    except ConnectionRefusedError:
        return True
    return False


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    inherited = {name: value for name, value in os.environ.items() if not name.startswith(("ENGINE_", "VLLM_"))}
    return {**inherited, **FAST, **extra}


@dataclass
class Engine:
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_log(self, text: str, timeout: float = WAIT_S, times: int = 1) -> None:
        """Until `text` has been logged `times` times."""
        deadline = time.monotonic() + timeout
        while self.log.count(text) < times:
            assert time.monotonic() < deadline, f"{text!r} not logged {times}x in {timeout} s:\n{self.log}"
            time.sleep(0.02)


class Launcher:
    """Starts stand-in processes and kills whatever is left at teardown."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.model_dir = directory / "model"
        self.model_dir.mkdir(exist_ok=True)
        self.engines: list[Engine] = []

    def start(self, argv: list[str], env: dict[str, str] | None = None) -> Engine:
        log_path = self.directory / f"engine-{len(self.engines)}.log"
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", BOOT, *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=clean_env(env or {}),
                cwd=self.directory,
            )
        engine = Engine(proc, log_path)
        self.engines.append(engine)
        return engine

    def close(self) -> None:
        for engine in self.engines:
            if engine.alive():
                engine.proc.kill()
            engine.proc.wait(timeout=10)


def run_engine(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BOOT, *argv], capture_output=True, text=True, timeout=30, env=clean_env({})
    )


def rendered_argv(rank: int, model_dir: Path, port: int, master_port: int) -> list[str]:
    """What reconciler.serving renders for the default spec, pointed at loopback and a temp model dir."""
    deployment = with_serving(reference_deployment(), port=port, master_port=master_port)
    argv = vllm_argv(deployment, rank, "127.0.0.1")
    assert argv[:2] == ["vllm", "serve"]
    argv = argv[1:]
    argv[argv.index("/model")] = str(model_dir)
    if rank == 0:
        assert argv[argv.index("--host") + 1] == "127.0.0.1"
        argv[argv.index("--port") + 1] = str(port)
    return argv


def single_argv(model_dir: Path, port: int, *extra: str) -> list[str]:
    return [
        *("serve", str(model_dir), "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port)),
        *("--master-addr", "127.0.0.1", "--master-port", str(free_port()), *extra),
    ]


def wait_healthy(engine: Engine, url: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert engine.alive(), f"engine exited with {engine.proc.returncode}:\n{engine.log}"
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"no /health within {timeout} s:\n{engine.log}"
        time.sleep(0.05)


@dataclass
class Group:
    rank0: Engine
    rank1: Engine
    url: str
    port: int
    master_port: int

    def client(self, timeout: float = 30.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=timeout)


def start_group(launcher: Launcher, env: dict[str, str] | None = None, *, keyed: bool = True) -> Group:
    """Both ranks from the rendered argv; rank 0 requires the key on /v1 unless not `keyed` (as
    behind the front, which holds the key)."""
    port, master_port = free_port(), free_port()
    rank1 = launcher.start(rendered_argv(1, launcher.model_dir, port, master_port), env)
    key = {"VLLM_API_KEY": KEY} if keyed else {}
    rank0 = launcher.start(rendered_argv(0, launcher.model_dir, port, master_port), {**key, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    wait_healthy(rank0, url)
    return Group(rank0, rank1, url, port, master_port)


def chat(client: httpx.Client, content: object, **extra: object) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "temperature": 0, **extra}
    return client.post("/v1/chat/completions", json=body)


def sse_events(response: httpx.Response) -> list[str]:
    return [line.removeprefix("data: ") for line in response.text.split("\n\n") if line.startswith("data: ")]


# --- PNG writer (exercises every row filter the stand-in must undo) ------------------------------


def _paeth(left: int, above: int, upper_left: int) -> int:
    estimate = left + above - upper_left
    a, b, c = abs(estimate - left), abs(estimate - above), abs(estimate - upper_left)
    return left if a <= b and a <= c else above if b <= c else upper_left


def _filtered(kind: int, row: bytes, previous: bytes, bpp: int) -> bytes:
    out = bytearray([kind])
    for i, value in enumerate(row):
        left = row[i - bpp] if i >= bpp else 0
        above, upper_left = previous[i], previous[i - bpp] if i >= bpp else 0
        predicted = (0, left, above, (left + above) // 2, _paeth(left, above, upper_left))[kind]
        out.append((value - predicted) & 0xFF)
    return bytes(out)


def png(width: int, height: int, pixel: Pixel) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows, previous = [], bytes(width * 3)
    for y in range(height):
        row = bytes(channel for x in range(width) for channel in pixel(x, y))
        rows.append(_filtered(y % 5, row, previous, 3))
        previous = row
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"".join(rows)))
        + chunk(b"IEND", b"")
    )


def red_left_blue_right(x: int, y: int) -> tuple[int, int, int]:
    del y
    return (250, 10 + x % 7, 5) if x < 64 else (8, 3, 240 - x % 5)


def image_part(data: bytes) -> dict[str, object]:
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}}


# --- argv ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "code", "message"),
    [
        (["--bogus-flag"], 2, "unrecognized arguments: --bogus-flag"),
        (["--max-model", "5"], 2, "unrecognized arguments: --max-model"),
        (["--speculative-config", "{method: dspark}"], 2, "argument --speculative-config: invalid JSON"),
        (["--limit-mm-per-prompt", "[1]"], 2, "expected a JSON object"),
        (["--node-rank", "1", "--nnodes", "2"], 1, "requires --headless"),
    ],
)
def test_bad_argv_fails_before_serving(tmp_path: Path, extra: list[str], code: int, message: str) -> None:
    result = run_engine(["serve", str(tmp_path), *extra])
    assert result.returncode == code
    assert message in result.stderr + result.stdout


def test_a_missing_model_dir_exits_1_like_vllm(tmp_path: Path) -> None:
    result = run_engine(["serve", str(tmp_path / "absent"), "--port", str(free_port())])
    assert result.returncode == 1
    assert f"Invalid repository ID or local directory specified: '{tmp_path / 'absent'}'" in result.stdout


def test_both_ranks_accept_the_rendered_argv(group: Group) -> None:
    assert group.rank0.alive()
    assert group.rank1.alive()
    assert "world_size=2 rank=1 node_rank=1 joined from 127.0.0.1:" in group.rank0.log
    assert "all 2 ranks joined" in group.rank0.log
    assert "'engram_config': {'cpu_offload': False" in group.rank0.log
    assert "joined rank 0 at 127.0.0.1:" in group.rank1.log
    assert "INFO:     Application startup complete." in group.rank0.log
    assert f"Uvicorn running on http://127.0.0.1:{group.port}" in group.rank0.log


# --- rank coupling and failure semantics ----------------------------------------------------


def test_rank0_listens_only_after_every_rank_joined(launcher: Launcher) -> None:
    port, master_port = free_port(), free_port()
    rank0 = launcher.start(rendered_argv(0, launcher.model_dir, port, master_port), {"VLLM_API_KEY": KEY})
    # The notice comes every second while rank 0 waits (FAST): the second proves rank 0 has waited
    # far longer than its startup delay (0.2 s), and still nothing may listen.
    rank0.wait_log("Waiting for 1 more rank(s) to join at 127.0.0.1:", times=2)
    assert refuses(port)
    assert not refuses(master_port)
    launcher.start(rendered_argv(1, launcher.model_dir, port, master_port))
    wait_healthy(rank0, f"http://127.0.0.1:{port}")
    assert rank0.log.index("all 2 ranks joined") < rank0.log.index("Uvicorn running")


def test_a_killed_peer_is_noticed_at_the_next_request_then_rank0_exits_0(launcher: Launcher) -> None:
    group = start_group(launcher)
    group.rank1.proc.kill()
    group.rank1.proc.wait(timeout=5)
    # A moment in which a rank 0 that ended by itself on a lost peer would end. It records the loss
    # silently (as gloo does): there is no event to wait for instead. A loaded machine can only
    # make this check weaker, never make it fail.
    time.sleep(0.3)
    with group.client() as client:
        assert client.get("/health").status_code == 200
        response = chat(client, "Hello")
        answered = time.monotonic()
    assert response.status_code == 500
    assert response.json()["error"]["type"] == "InternalServerError"
    assert "EngineCore encountered an issue" in response.json()["error"]["message"]
    assert group.rank0.proc.wait(timeout=WAIT_S) == 0
    assert time.monotonic() - answered >= 0.5
    assert "vllm.v1.engine.exceptions.EngineDeadError" in group.rank0.log


def test_a_silent_peer_hangs_requests_until_the_execute_timeout(launcher: Launcher) -> None:
    group = start_group(launcher, {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3"})
    group.rank1.proc.send_signal(signal.SIGSTOP)  # the link is cut: no close, no acks, no heartbeats
    started = time.monotonic()
    with group.client(timeout=1.0) as client, pytest.raises(httpx.ReadTimeout):
        chat(client, "Hello")
    assert httpx.get(f"{group.url}/health", timeout=WAIT_S).status_code == 200
    assert group.rank0.proc.wait(timeout=WAIT_S) == 0
    assert time.monotonic() - started >= 3.0
    assert "RPC call to execute_model timed out" in group.rank0.log


def test_a_headless_rank_outlives_rank0_and_never_rejoins(launcher: Launcher) -> None:
    group = start_group(launcher)
    group.rank0.proc.kill()
    group.rank0.proc.wait(timeout=5)
    group.rank1.wait_log("lost the connection to rank 0 at 127.0.0.1:")
    new_rank0 = launcher.start(
        rendered_argv(0, launcher.model_dir, group.port, group.master_port), {"VLLM_API_KEY": KEY}
    )
    # The second notice, a second after the first (FAST): the old rank 1 (retrying every 0.2 s if
    # it tried at all) has had ample time to rejoin.
    new_rank0.wait_log("Waiting for 1 more rank(s)", times=2)
    assert group.rank1.alive()
    assert new_rank0.alive()
    assert refuses(group.port)
    assert "joined" not in new_rank0.log


@pytest.mark.parametrize("rank", [0, 1])
def test_sigterm_shutdown_is_slower_than_the_grace(launcher: Launcher, rank: int) -> None:
    port = free_port()
    if rank == 0:
        engine = launcher.start(single_argv(launcher.model_dir, port))
        wait_healthy(engine, f"http://127.0.0.1:{port}")
    else:  # a headless rank still looking for its rank 0
        engine = launcher.start(rendered_argv(1, launcher.model_dir, port, free_port()))
        engine.wait_log("connecting to rank 0")
    started = time.monotonic()
    engine.proc.send_signal(signal.SIGTERM)
    assert engine.proc.wait(timeout=WAIT_S) == 0
    assert time.monotonic() - started >= 1.0
    assert "Shutting down" in engine.log


# --- fault switches -----------------------------------------------------------------------------


def write_faults(path: Path, switches: dict[str, object]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(switches), encoding="utf-8")
    temporary.replace(path)  # the engine must never read half a file


def test_the_hang_fault_keeps_health_200_while_generation_hangs(launcher: Launcher) -> None:
    faults = launcher.directory / "faults.json"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    engine = launcher.start(single_argv(launcher.model_dir, port), {"ENGINE_FAULT_FILE": str(faults)})
    wait_healthy(engine, url)
    write_faults(faults, {"ENGINE_FAULT_HANG": 1})
    engine.wait_log("ENGINE_FAULT_HANG=1")
    with httpx.Client(base_url=url, timeout=2.0) as client, pytest.raises(httpx.ReadTimeout):
        chat(client, "What is 2 + 3?")  # hangs for as long as the switch is on: any timeout ends it
    with httpx.Client(base_url=url, timeout=WAIT_S) as client:
        assert client.get("/health").status_code == 200
        write_faults(faults, {})
        engine.wait_log("ENGINE_FAULT_HANG=0")
        assert chat(client, "What is 2 + 3?").json()["choices"][0]["message"]["content"] == "5"


def test_the_exit_fault_exits_1(launcher: Launcher) -> None:
    engine = launcher.start(single_argv(launcher.model_dir, free_port()), {"ENGINE_FAULT_EXIT_AFTER_S": "0.3"})
    assert engine.proc.wait(timeout=WAIT_S) == 1
    assert "ENGINE_FAULT_EXIT_AFTER_S elapsed" in engine.log


def test_the_hold_fault_makes_memory_resident(launcher: Launcher) -> None:
    engine = launcher.start(single_argv(launcher.model_dir, free_port()), {"ENGINE_FAULT_HOLD_MIB": "64"})
    engine.wait_log("holding 64 MiB")
    status = Path(f"/proc/{engine.proc.pid}/status").read_text(encoding="utf-8")
    resident_kib = int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])
    assert resident_kib >= 64 * 1024


# --- API -------------------------------------------------------------------------------------


def test_v1_needs_the_key_and_the_open_routes_do_not(group: Group) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        response = httpx.get(f"{group.url}/v1/models", headers=headers)
        assert (response.status_code, response.content) == (401, UNAUTHORIZED)
    assert httpx.post(f"{group.url}/v1/chat/completions", json={}).content == UNAUTHORIZED
    health = httpx.get(f"{group.url}/health")
    assert (health.status_code, health.content) == (200, b"")
    assert httpx.get(f"{group.url}/ping").status_code == 200
    assert httpx.get(f"{group.url}/version").json() == {"version": "0.32.0+standin"}
    assert httpx.get(f"{group.url}/load").json() == {"server_load": 0}
    assert "vllm:request_success_total" in httpx.get(f"{group.url}/metrics").text


def test_models_lists_the_served_name(group: Group) -> None:
    with group.client() as client:
        listing = client.get("/v1/models").json()
    assert listing["object"] == "list"
    card = listing["data"][0]
    assert (card["id"], card["object"], card["owned_by"]) == (MODEL, "model", "vllm")
    assert card["max_model_len"] == MAX_MODEL_LEN
    assert card["root"].endswith("model")


def test_chat_answers_the_smoke_arithmetic(group: Group) -> None:
    with group.client() as client:
        body = chat(client, "What is 17 * 23? Answer with the number.").json()
    choice = body["choices"][0]
    assert "391" in choice["message"]["content"]
    assert choice["message"]["reasoning_content"]
    assert choice["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"] is None


def test_stream_sends_role_tokens_finish_usage_and_done(group: Group) -> None:
    with group.client() as client:
        response = chat(client, "What is 40 - 2?", stream=True, stream_options={"include_usage": True})
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == len(chunks) - 2
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert all(chunk["choices"][0]["finish_reason"] is None for chunk in chunks[:-2])
    content = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks[:-1])
    assert content == "38"


@pytest.mark.parametrize(
    ("tool_choice", "finish_reason"),
    [(None, "tool_calls"), ("auto", "tool_calls"), ("required", "tool_calls"), ("named", "stop")],
)
def test_tools_call_get_weather_for_warsaw(group: Group, tool_choice: str | None, finish_reason: str) -> None:
    extra: dict[str, object] = {"tools": [WEATHER_TOOL]}
    if tool_choice == "named":
        extra["tool_choice"] = {"type": "function", "function": {"name": "get_weather"}}
    elif tool_choice is not None:
        extra["tool_choice"] = tool_choice
    with group.client() as client:
        choice = chat(client, "What's the weather in Warsaw right now?", **extra).json()["choices"][0]
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Warsaw"}
    assert choice["finish_reason"] == finish_reason


def test_concurrent_requests_each_get_their_own_answer(group: Group) -> None:
    def ask(number: int) -> str:
        with group.client() as client:
            content: str = chat(client, f"What is {number} + 1?").json()["choices"][0]["message"]["content"]
            return content

    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(ask, range(6)))
    assert answers == [str(number + 1) for number in range(6)]


def test_vision_names_the_left_then_the_right_colour(group: Group) -> None:
    image = png(128, 128, red_left_blue_right)
    content = [{"type": "text", "text": "What colour is the left half, and the right half?"}, image_part(image)]
    with group.client() as client:
        answer = chat(client, content).json()["choices"][0]["message"]["content"]
    assert answer == "The left half is red and the right half is blue."


def test_completions_take_text_or_token_ids(group: Group) -> None:
    with group.client() as client:
        text = client.post("/v1/completions", json={"model": MODEL, "prompt": "What is 6 * 7?"}).json()
        ids = client.post("/v1/completions", json={"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2}).json()
    assert text["choices"][0]["text"] == "42"
    assert text["object"] == "text_completion"
    assert ids["usage"]["prompt_tokens"] == 3
    assert (ids["usage"]["completion_tokens"], ids["choices"][0]["finish_reason"]) == (2, "length")


def test_prompt_plus_max_tokens_over_the_context_is_cut_not_refused(group: Group) -> None:
    prompt = [7] * (MAX_MODEL_LEN - 2)
    with group.client() as client:
        body = client.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 50}).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 2


def test_a_prompt_over_the_context_is_a_400_with_vllms_message(group: Group) -> None:
    with group.client() as client:
        response = chat(client, "a" * (4 * MAX_MODEL_LEN + 4))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"].startswith(
        f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, your prompt contains at least "
        f"{MAX_MODEL_LEN + 1} input tokens"
    )
    assert (error["type"], error["param"], error["code"]) == ("BadRequestError", "input_tokens", 400)


def test_request_errors_have_vllms_statuses(group: Group) -> None:
    image = image_part(png(2, 2, red_left_blue_right))
    with group.client() as client:
        unknown = client.post("/v1/chat/completions", json={"model": "gpt-4", "messages": [{"role": "user"}]})
        bad_json = client.post(
            "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
        )
        zero = chat(client, "Hi", max_tokens=0)
        two_images = chat(client, [image, image])
        bad_base64 = chat(client, [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}])
    assert (unknown.status_code, unknown.json()["error"]["type"]) == (404, "NotFoundError")
    assert (bad_json.status_code, zero.status_code, bad_base64.status_code) == (400, 400, 400)
    assert two_images.status_code == 400
    assert "At most 1 image(s)" in two_images.json()["error"]["message"]


def test_the_key_is_never_logged(group: Group) -> None:
    with group.client() as client:
        assert chat(client, "Hello").status_code == 200
    assert KEY not in group.rank0.log
    assert KEY not in group.rank1.log
    assert "API key required on /v1 (from VLLM_API_KEY)" in group.rank0.log


# --- which checkpoint was loaded (stand-in only) ------------------------------------------------


def test_loaded_reports_the_config_tag_on_an_open_route(launcher: Launcher) -> None:
    config = json.dumps({"model_type": "deepseek_v4", "checkpoint_tag": "B"}, indent=2).encode()
    (launcher.model_dir / "config.json").write_bytes(config)
    group = start_group(launcher)
    sha = hashlib.sha256(config).hexdigest()
    answer = httpx.get(f"{group.url}/_standin/loaded", timeout=WAIT_S)
    assert answer.status_code == 200, "open like /health: no key"
    assert answer.json() == {"model": str(launcher.model_dir), "config_sha256": sha, "checkpoint_tag": "B"}
    line = f"loaded {launcher.model_dir}: config.json sha256 {sha[:12]}, checkpoint_tag B"
    group.rank0.wait_log(line)
    group.rank1.wait_log(line)


def test_loaded_without_a_config_reports_nulls(group: Group) -> None:
    answer = httpx.get(f"{group.url}/_standin/loaded", timeout=WAIT_S).json()
    assert answer["config_sha256"] is None
    assert answer["checkpoint_tag"] is None
    assert "no config.json" in group.rank0.log
