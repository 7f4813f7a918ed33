"""TEST STAND-IN for vLLM on a GPU. Not part of the product; never ship it.

spark-reconciler runs DeepSeek-V4.1-Flash with `vllm serve`, tensor parallel across DGX Spark
nodes. CI has no GPU, so the testbed image (busybox + python) runs this module instead: it is
copied to /opt/engine/ and `/usr/local/bin/vllm` does
`from engine import main; raise SystemExit(main(sys.argv[1:]))`, so the container starts exactly
as reconciler/serving.py renders it (`vllm serve /model ...`). Python 3.11 standard library only.

What it imitates:
- The argv both ranks get, the custom image's flags included (`--engram-config`,
  `--swa-block-size`, `--linear-backend`, ...). Unknown flags exit 2 with an argparse error and
  JSON-valued flags must hold JSON, so a regression in the renderer fails tests. A missing model
  path exits 1 with vLLM's error.
- Multi-node serving: rank 0 (`--node-rank 0`) listens on exactly `--master-addr:--master-port`;
  headless ranks (`--headless --node-rank k`) connect there (retrying until rank 0 exists), say
  hello and send heartbeats. Rank 0 opens its HTTP port only once every rank joined and
  ENGINE_STARTUP_DELAY_S passed; before that nothing listens on `--host:--port`. Every generated
  token is a real round trip: rank 0 sends a step to each peer and waits for every ack.
- The failure modes measured on real vLLM 0.32, TP=2 over two hosts:
  * a peer's connection closes: /health stays 200 until the next completion request, which gets
    HTTP 500 (EngineDeadError); rank 0 logs EngineDeadError and exits with code 0 about 1 s later;
  * a peer goes silent (link cut, SIGSTOP): requests hang while /health stays 200; after
    VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS the step times out and rank 0 exits 0 the same way;
  * rank 0 gone: a headless rank logs it and stays up forever; it never rejoins, so a new rank 0
    waits for ranks that never come and never opens its HTTP port;
  * SIGTERM: "Shutting down", then ENGINE_SHUTDOWN_S (default 12, above Docker's 10 s grace)
    before exit 0.
- The OpenAI server's behaviour measured on vLLM 0.32: /v1 (and /v2, /inference)
  need `Authorization: Bearer <key>` when a key is set, else 401 `{"error":"Unauthorized"}`;
  /health /ping /version /metrics /load /tokenize are open. OpenAI shapes for /v1/models,
  /v1/chat/completions and /v1/completions, vLLM's 400/404/500 errors, truncation with
  finish_reason "length", SSE streams with the final usage chunk, tool-call finish reasons
  ("tool_calls" for auto/required, "stop" for a named tool_choice).
- Canned answers that pass the reference smoke test: "What is 17 * 23?" answers "391";
  with tools, a call of the first (or the named) tool whose arguments come from the parameter
  names (`city` = the capitalised word after " in " of the last user message, e.g. "Warsaw");
  a PNG data URL is decoded (8-bit grey/RGB/RGBA, non-interlaced) and the answer names the
  dominant colour of its left half, then its right half. A pass-key question ("What is the pass
  key?" after "The pass key is 12345" somewhere in the same message, the long-context recall test
  of `reconciler bench --ctx`) answers the number. Anything else gets a fixed sentence.
  Sampling parameters (temperature, stop, n, ...) are accepted and ignored; `ignore_eos` on
  /v1/completions is honoured (the answer goes on until max_tokens), as the random workload of
  `vllm bench serve` and `reconciler bench --kinds random` needs. Image URLs other
  than base64 data URLs are never fetched: they get the 500 vLLM gives for an unreachable URL.
  Once the engine died, /health answers 503 for the second before the process exits.

Which checkpoint it loaded (stand-in only: real vLLM has no such route): at startup every rank reads
`<model dir>/config.json` (the `vllm serve DIR` argument, `/model` in the container), remembers its
sha256 and its "checkpoint_tag" (None if absent, or if the file is missing or not a JSON object:
no weights are read, so an empty model dir still starts) and logs one line,
`loaded /model: config.json sha256 <first 12 hex>, checkpoint_tag B`. Rank 0 answers
`GET /_standin/loaded` on its API port, open like /health (no key):
`{"model": "/model", "config_sha256": "<64 hex>"|null, "checkpoint_tag": "B"|null}`. Tests use it to see
which model revision a group serves after a restart onto a new revision.

Tokens: one token is 4 UTF-8 bytes. A prompt counts ceil(bytes / 4) of its rendered text plus 64
per image; output is cut into pieces of at least 4 bytes that never split a character, one piece
per token. Chat answers start with a short fixed reasoning text (the reasoning parser is set),
which counts against max_tokens like real reasoning does. No prefix cache is simulated, so
`prompt_tokens_details` is always null (vLLM fills it only when tokens were cached).

Run it like vLLM: `vllm serve DIR --nnodes 2 -tp 2 --node-rank 0 --master-addr IP --master-port P
--host H --port Q ...` (rank 0) and `vllm serve DIR --nnodes 2 -tp 2 --node-rank 1 --headless
--master-addr IP --master-port P ...` (rank 1); without the image, `python -c "import sys;
sys.path.insert(0, '<repo>/tests/testbed/engine'); from engine import main;
raise SystemExit(main(sys.argv[1:]))" serve ...`. Exit codes: 2 bad argv (argparse), 1 bad
configuration, a port it cannot bind or the exit fault, 0 after SIGTERM or an engine death.

Environment:
  VLLM_API_KEY                        API key when --api-key is absent (never logged)
  ENGINE_STARTUP_DELAY_S (2)          rank 0: pause between "all ranks joined" and the HTTP port
  ENGINE_SHUTDOWN_S (12)              pause between SIGTERM/SIGINT and exit 0
  VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (300)  how long a step waits for the peers' acks
  ENGINE_TOKEN_DELAY_S (0.005)        pause per generated token, so streams have a measurable rate
  ENGINE_JOIN_NOTICE_S (10)           rank 0: how often it says it is still waiting for ranks to join
  ENGINE_PREFILL_TOKEN_DELAY_S (0)    pause per prompt token before the first token, so TTFT and prefill
                                      tok/s have a known ground truth (requests prefill in parallel)
  ENGINE_REQUEST_LOG (unset)          a file: one JSON line per HTTP request, appended before auth and
                                      routing: {"method", "path", "authorization" (the header's value,
                                      key included: test-only, so tests can assert which bearer key a
                                      client sent), "body" (the parsed JSON object, else null)}

Fault switches (env; or a JSON object in the file named by ENGINE_FAULT_FILE, re-read once per
second, whose keys override the environment's; a missing file means "environment only"):
  ENGINE_FAULT_EXIT_AFTER_S=N  exit with code 1 N seconds after the switch is seen (process start
                               for the environment)
  ENGINE_FAULT_HANG=1          rank 0: generation hangs (no answer) while /health stays 200, the
                               "API alive, engine dead" case; requests resume when it is cleared.
                               Headless rank: stops acking steps and sending heartbeats (a silent
                               peer, as with a cut link)
  ENGINE_FAULT_HOLD_MIB=N      allocate and touch N MiB and hold it (0 releases it)
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import functools
import hashlib
import hmac
import json
import math
import os
import re
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
import traceback
import uuid
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any, cast
from urllib.parse import urlsplit

VERSION = "0.32.0+standin"
DEFAULT_MAX_MODEL_LEN = 4096
DEFAULT_IMAGE_LIMIT = 999  # vLLM's per-modality default when --limit-mm-per-prompt is absent
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's (and vLLM's) default for /v1/completions
IMAGE_TOKENS = 64
VOCAB_SIZE = 129280  # DeepSeek-V3/V4 vocabulary, only to make token ids look plausible
HEARTBEAT_S = 1.0
HEARTBEAT_STALE_S = 5.0
STUCK_NOTICE_S = 60.0
HELLO_TIMEOUT_S = 10.0
ENGINE_DEAD_EXIT_DELAY_S = 1.0
MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_PNG_PIXELS = 4_000_000
REASONING = "Let me think."
FALLBACK_ANSWER = "Hello! I am the vLLM test stand-in; no model ran."
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
KEYED_PREFIXES = ("/v1", "/v2", "/inference")  # what --api-key protects
FAULT_KEYS = ("ENGINE_FAULT_EXIT_AFTER_S", "ENGINE_FAULT_HANG", "ENGINE_FAULT_HOLD_MIB")
MIB = 1024 * 1024
PAGE = 4096

JsonObject = dict[str, Any]


# --- logging ------------------------------------------------------------------------------------


class Log:
    """vLLM-looking lines on stdout, e.g. `(APIServer pid=7) INFO 05-20 20:35:26 [api_server.py] text`."""

    def __init__(self) -> None:
        self.role = "APIServer"
        self._lock = threading.Lock()

    def line(self, text: str) -> None:
        with self._lock, contextlib.suppress(OSError, ValueError):
            # A closed stdout must not take the engine down with it.
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    def info(self, where: str, text: str, role: str | None = None) -> None:
        self._vllm("INFO", where, text, role)

    def warning(self, where: str, text: str, role: str | None = None) -> None:
        self._vllm("WARNING", where, text, role)

    def error(self, where: str, text: str, role: str | None = None) -> None:
        self._vllm("ERROR", where, text, role)

    def uvicorn(self, text: str) -> None:
        self.line(f"INFO:     {text}")

    def _vllm(self, level: str, where: str, text: str, role: str | None) -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        self.line(f"({role or self.role} pid={os.getpid()}) {level} {stamp} [{where}] {text}")


LOG = Log()


# --- command line and configuration -----------------------------------------------------------


class ConfigError(Exception):
    """An argv combination or environment value vLLM would refuse at start (exit code 1)."""


def json_object(text: str) -> JsonObject:
    """argparse type for JSON-valued flags: a bad value is an argparse error (exit 2)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON {text!r}: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def human_int(text: str) -> int:
    """vLLM accepts 32768, 32k (x1000) or 32K (x1024) for sizes and lengths."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgKMG]?)", text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}")
    number, suffix = match.groups()
    scale = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}[suffix]
    return int(float(number) * scale)


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: a misspelt flag must not pass as a prefix of a real one.
    parser = argparse.ArgumentParser(prog="vllm", allow_abbrev=False, description="vLLM test stand-in")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", allow_abbrev=False, help="serve the OpenAI-compatible API")
    serve.add_argument("model", help="model directory (read-only /model in the container)")
    _model_flags(serve)
    _parallel_flags(serve)
    _cache_and_scheduler_flags(serve)
    _frontend_flags(serve)
    return parser


def _model_flags(serve: argparse.ArgumentParser) -> None:
    dtypes = ("auto", "half", "float16", "bfloat16", "float", "float32")
    serve.add_argument("--served-model-name", nargs="+")
    serve.add_argument("--dtype", choices=dtypes, default="auto")
    serve.add_argument("--max-model-len", type=human_int)
    serve.add_argument("--generation-config", default="auto")
    serve.add_argument("--tokenizer-mode", default="auto")
    serve.add_argument("--trust-remote-code", action="store_true")
    serve.add_argument("--safetensors-load-strategy")
    serve.add_argument("--limit-mm-per-prompt", type=json_object)
    serve.add_argument("--engram-config", type=json_object)
    serve.add_argument("--speculative-config", type=json_object)
    serve.add_argument("-cc", "--compilation-config", type=json_object)
    serve.add_argument("--enforce-eager", action="store_true")
    serve.add_argument("--attention-backend")
    serve.add_argument("--linear-backend")
    serve.add_argument("--moe-backend")


def _parallel_flags(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("-tp", "--tensor-parallel-size", type=int, default=1)
    serve.add_argument("-n", "--nnodes", type=int, default=1)
    serve.add_argument("-r", "--node-rank", type=int, default=0)
    serve.add_argument("--master-addr", default="127.0.0.1")
    serve.add_argument("--master-port", type=int, default=29501)
    serve.add_argument("--headless", action="store_true")


def _cache_and_scheduler_flags(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--kv-cache-dtype", default="auto")
    serve.add_argument("--block-size", type=int)
    serve.add_argument("--swa-block-size", type=int)
    serve.add_argument("--kv-cache-memory-bytes", type=human_int)
    serve.add_argument("--gpu-memory-utilization", type=float, default=0.92)
    serve.add_argument("--max-num-seqs", type=int)
    serve.add_argument("--max-num-batched-tokens", type=human_int)
    serve.add_argument("--max-cudagraph-capture-size", type=int)
    serve.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction)
    serve.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction)
    serve.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction)


def _frontend_flags(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--host")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key")
    serve.add_argument("--reasoning-parser")
    serve.add_argument("--tool-call-parser")
    serve.add_argument("--enable-auto-tool-choice", action="store_true")
    serve.add_argument("--enable-prompt-tokens-details", action="store_true")
    serve.add_argument("--enable-force-include-usage", action="store_true")
    serve.add_argument("--max-log-len", type=int)


@dataclass(frozen=True)
class Settings:
    """Timings from the environment (see the module docstring)."""

    startup_delay_s: float = 2.0
    shutdown_s: float = 12.0
    execute_timeout_s: float = 300.0
    token_delay_s: float = 0.005
    prefill_token_delay_s: float = 0.0
    request_log: str | None = None
    join_notice_s: float = 10.0


@dataclass(frozen=True)
class Loaded:
    """What this rank read of the checkpoint at startup: `config.json` only (stand-in: no weights)."""

    model: str
    config_sha256: str | None
    checkpoint_tag: str | None

    def to_json(self) -> JsonObject:
        return {"model": self.model, "config_sha256": self.config_sha256, "checkpoint_tag": self.checkpoint_tag}

    def describe(self) -> str:
        if self.config_sha256 is None:
            return f"loaded {self.model}: no config.json"
        return (
            f"loaded {self.model}: config.json sha256 {self.config_sha256[:12]}, checkpoint_tag {self.checkpoint_tag}"
        )


def read_loaded(model: str) -> Loaded:
    try:
        data = (Path(model) / "config.json").read_bytes()
    except OSError:
        return Loaded(model, None, None)
    try:
        document = json.loads(data)
    except ValueError:
        document = None
    tag = document.get("checkpoint_tag") if isinstance(document, dict) else None
    return Loaded(model, hashlib.sha256(data).hexdigest(), tag if isinstance(tag, str) else None)


@dataclass(frozen=True)
class Config:
    model: str
    served_names: tuple[str, ...]
    max_model_len: int
    image_limit: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    host: str
    port: int
    api_key: str | None
    auto_tool_choice: bool
    tool_parser: str | None
    force_include_usage: bool
    settings: Settings
    loaded: Loaded

    @property
    def headless(self) -> bool:
        return self.node_rank > 0


def env_seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name} must be a non-negative number of seconds, got {raw!r}")
    return value


def load_settings(env: Mapping[str, str]) -> Settings:
    return Settings(
        startup_delay_s=env_seconds(env, "ENGINE_STARTUP_DELAY_S", 2.0),
        shutdown_s=env_seconds(env, "ENGINE_SHUTDOWN_S", 12.0),
        execute_timeout_s=env_seconds(env, "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", 300.0),
        token_delay_s=env_seconds(env, "ENGINE_TOKEN_DELAY_S", 0.005),
        prefill_token_delay_s=env_seconds(env, "ENGINE_PREFILL_TOKEN_DELAY_S", 0.0),
        request_log=env.get("ENGINE_REQUEST_LOG") or None,
        join_notice_s=env_seconds(env, "ENGINE_JOIN_NOTICE_S", 10.0),
    )


def image_limit(limits: JsonObject | None) -> int:
    """`{"image": 1}` or the newer `{"image": {"count": 1}}`."""
    value = (limits or {}).get("image", DEFAULT_IMAGE_LIMIT)
    if isinstance(value, dict):
        value = value.get("count", DEFAULT_IMAGE_LIMIT)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"--limit-mm-per-prompt: the image limit must be a non-negative integer, got {value!r}")
    return value


def check_topology(args: argparse.Namespace) -> None:
    nnodes, rank = args.nnodes, args.node_rank
    if nnodes < 1 or not 0 <= rank < nnodes:
        raise ConfigError(f"--node-rank {rank} must lie in [0, --nnodes {nnodes})")
    if rank > 0 and not args.headless:
        raise ConfigError(f"--node-rank {rank} > 0 requires --headless (only rank 0 serves the API)")
    if rank == 0 and args.headless:
        raise ConfigError("--headless needs --node-rank > 0: rank 0 serves the API")
    if args.tensor_parallel_size < 1 or args.tensor_parallel_size % nnodes:
        raise ConfigError(f"--tensor-parallel-size {args.tensor_parallel_size} is not a multiple of --nnodes {nnodes}")
    for flag, port in (("--port", args.port), ("--master-port", args.master_port)):
        if not 0 < port < 65536:
            raise ConfigError(f"{flag} {port} is not a TCP port")


def make_config(args: argparse.Namespace, env: Mapping[str, str]) -> Config:
    if not Path(args.model).is_dir():
        # What vLLM says when the path is neither a local directory nor reachable on the Hub.
        raise ConfigError(f"Invalid repository ID or local directory specified: '{args.model}'.")
    check_topology(args)
    max_model_len = args.max_model_len or DEFAULT_MAX_MODEL_LEN
    if max_model_len < 1:
        raise ConfigError(f"--max-model-len must be positive, got {max_model_len}")
    return Config(
        model=args.model,
        served_names=tuple(args.served_model_name or [args.model]),
        max_model_len=max_model_len,
        image_limit=image_limit(args.limit_mm_per_prompt),
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
        host=args.host or "0.0.0.0",
        port=args.port,
        api_key=args.api_key or env.get("VLLM_API_KEY") or None,
        auto_tool_choice=args.enable_auto_tool_choice,
        tool_parser=args.tool_call_parser,
        force_include_usage=args.enable_force_include_usage,
        settings=load_settings(env),
        loaded=read_loaded(args.model),
    )


def non_default_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, object]:
    """What vLLM logs at start, minus the API key: the key is never logged."""
    defaults = vars(parser.parse_args(["serve", args.model]))
    hidden = {"command", "api_key"}
    return {name: value for name, value in vars(args).items() if name not in hidden and value != defaults[name]}


# --- lifecycle ----------------------------------------------------------------------------------


class Lifecycle:
    """How the process ends: SIGTERM/SIGINT (slow shutdown, exit 0), engine death (0), a fault (1)."""

    def __init__(self) -> None:
        self.ended = threading.Event()
        self.code = 0
        self.reason = ""
        self.terminated = False
        self._signalled = False
        self._lock = threading.Lock()

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # Runs in the main thread between bytecodes, maybe while it holds a lock: only set a flag,
        # `sleep` (the main thread's only way to wait) turns it into an ending.
        del signum
        self._signalled = True

    def end(self, code: int, reason: str) -> None:
        with self._lock:
            if self.ended.is_set():
                return
            self.code, self.reason = code, reason
            self.ended.set()

    def sleep(self, seconds: float) -> bool:
        """Main thread: wait up to `seconds`; False as soon as the process should end."""
        deadline = time.monotonic() + seconds
        while True:
            if self._signalled and not self.ended.is_set():
                self.terminated = True
                self.end(0, "signal")
            remaining = deadline - time.monotonic()
            if self.ended.is_set():
                return False
            if remaining <= 0:
                return True
            self.ended.wait(min(remaining, 0.1))


def start_thread(target: Callable[[], None], name: str) -> None:
    # Daemon threads: nothing the stand-in runs may keep the process alive past its ending.
    threading.Thread(target=target, name=name, daemon=True).start()


# --- fault switches -----------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultState:
    exit_after_s: float | None = None
    hang: bool = False
    hold_mib: int = 0


def _fault_number(name: str, value: object) -> float | None:
    if value is None or value == "" or value is False:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{name}: not a number: {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{name}: must be a non-negative number, got {value!r}")
    return number


def parse_faults(values: Mapping[str, object]) -> FaultState:
    hang = values.get("ENGINE_FAULT_HANG")
    hold = _fault_number("ENGINE_FAULT_HOLD_MIB", values.get("ENGINE_FAULT_HOLD_MIB"))
    return FaultState(
        exit_after_s=_fault_number("ENGINE_FAULT_EXIT_AFTER_S", values.get("ENGINE_FAULT_EXIT_AFTER_S")),
        hang=hang is True or str(hang).strip().lower() in {"1", "true", "yes", "on"},
        hold_mib=int(hold or 0),
    )


class Faults:
    """The fault switches: environment first, the ENGINE_FAULT_FILE's keys over it, re-read each second."""

    def __init__(self, env: Mapping[str, str], life: Lifecycle) -> None:
        self._env: dict[str, object] = {key: env[key] for key in FAULT_KEYS if key in env}
        self._path = Path(env["ENGINE_FAULT_FILE"]) if env.get("ENGINE_FAULT_FILE") else None
        self._life = life
        self._deadline: float | None = None
        self._held = bytearray()
        self._problem = ""
        self.state = FaultState()
        try:
            self._apply(parse_faults(self._env))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    @property
    def hang(self) -> bool:
        return self.state.hang

    def start(self) -> None:
        start_thread(self._run, "faults")

    def _run(self) -> None:
        next_read = 0.0
        while True:
            now = time.monotonic()
            if now >= next_read:
                self.reload()
                next_read = now + 1.0
            if self._deadline is not None and now >= self._deadline:
                self._life.end(1, "fault injection: ENGINE_FAULT_EXIT_AFTER_S elapsed")
            time.sleep(0.05)

    def reload(self) -> None:
        values = self._read_file()
        if values is None:
            return
        try:
            state = parse_faults({**self._env, **values})
        except ValueError as exc:
            self._complain(f"ignoring {self._path}: {exc}")
            return
        self._apply(state)

    def _read_file(self) -> dict[str, object] | None:
        """The file's switches; {} without a file; None (keep the current state) if unreadable."""
        if self._path is None:
            return {}
        try:
            data = json.loads(self._path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            self._complain(f"cannot read fault file {self._path}: {exc}")
            return None
        if not isinstance(data, dict):
            self._complain(f"fault file {self._path} must hold a JSON object")
            return None
        self._problem = ""
        return {key: data[key] for key in FAULT_KEYS if key in data}

    def _complain(self, problem: str) -> None:
        if problem != self._problem:  # once per distinct problem, not every second
            self._problem = problem
            LOG.warning("standin_faults.py", problem)

    def _apply(self, new: FaultState) -> None:
        old, self.state = self.state, new
        if new.exit_after_s != old.exit_after_s:
            self._deadline = None if new.exit_after_s is None else time.monotonic() + new.exit_after_s
            if new.exit_after_s is not None:
                LOG.warning("standin_faults.py", f"fault injection: exiting with code 1 in {new.exit_after_s:g} s")
        if new.hold_mib != old.hold_mib:
            self._hold(new.hold_mib)
        if new.hang != old.hang:
            what = "the engine stops stepping (the API stays up)" if new.hang else "cleared, the engine steps again"
            LOG.warning("standin_faults.py", f"fault injection: ENGINE_FAULT_HANG={int(new.hang)}: {what}")

    def _hold(self, mib: int) -> None:
        self._held = bytearray()
        if mib > 0:
            held = bytearray(mib * MIB)
            # bytearray() maps zeroed pages lazily; writing one byte per page makes them resident.
            held[::PAGE] = b"\x01" * len(range(0, len(held), PAGE))
            self._held = held
        LOG.warning("standin_faults.py", f"fault injection: holding {mib} MiB (ENGINE_FAULT_HOLD_MIB)")


# --- the group: rank 0 and the headless ranks ---------------------------------------------------


class EngineDeadError(Exception):
    """vllm.v1.engine.exceptions.EngineDeadError: the engine core is gone; completions answer 500."""


class PeerLostError(Exception):
    def __init__(self, rank: int) -> None:
        super().__init__(f"rank {rank} lost")
        self.rank = rank


class StepTimeoutError(Exception):
    """A step's acks did not arrive within VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (a silent peer)."""


class Channel:
    """One TCP connection carrying JSON lines; writes from several threads are serialised."""

    def __init__(self, sock: socket.socket) -> None:
        # Steps and acks are tiny request/response messages: Nagle would add delayed-ACK stalls.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self._reader = sock.makefile("rb")
        self._lock = threading.Lock()

    def send(self, message: JsonObject) -> bool:
        data = (json.dumps(message) + "\n").encode()
        with self._lock:
            try:
                self.sock.sendall(data)
            except OSError:
                return False
        return True

    def receive(self) -> JsonObject | None:
        """The next message ({} if unreadable); None once the connection closed or broke."""
        try:
            line = self._reader.readline(65536)
        except OSError:
            return None
        if not line:
            return None
        try:
            message = json.loads(line)
        except ValueError:
            return {}
        return message if isinstance(message, dict) else {}

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()


@dataclass
class PeerLink:
    rank: int
    channel: Channel
    address: str
    last_seen: float = field(default_factory=time.monotonic)
    stale: bool = False


class Master:
    """Rank 0's side of the group: rendezvous on --master-addr:--master-port, then step round trips."""

    def __init__(self, cfg: Config) -> None:
        self.world_size = cfg.nnodes
        self._address = (cfg.master_addr, cfg.master_port)
        self._cond = threading.Condition()
        self._peers: dict[int, PeerLink] = {}
        self._lost: set[int] = set()
        self._pending: dict[int, set[int]] = {}
        self._next_step = 0
        self.formed = threading.Event()

    def start(self) -> None:
        """Listen on exactly the master address (raises OSError): the fabric address matters."""
        if self.world_size == 1:
            self.formed.set()
            return
        listener = socket.create_server(self._address, backlog=16)
        start_thread(lambda: self._accept(listener), "rendezvous")
        start_thread(self._watch_heartbeats, "heartbeats")

    def missing(self) -> int:
        with self._cond:
            return self.world_size - 1 - len(self._peers)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, address = listener.accept()
            except OSError:
                return
            peer = f"{address[0]}:{address[1]}"
            start_thread(functools.partial(self._serve_peer, conn, peer), f"peer {peer}")

    def _serve_peer(self, conn: socket.socket, address: str) -> None:
        channel = Channel(conn)
        conn.settimeout(HELLO_TIMEOUT_S)
        hello = channel.receive()
        conn.settimeout(None)
        rank = self._admit(channel, hello, address)
        if rank is None:
            channel.close()
            return
        try:
            self._read_peer(rank, channel)
        finally:
            self._lose(rank)

    def _check_hello(self, hello: JsonObject | None) -> tuple[str | None, int]:
        if not hello or hello.get("type") != "hello":
            return "no hello", 0
        rank, nnodes = hello.get("rank"), hello.get("nnodes")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 < rank < self.world_size:
            return f"rank {rank!r} is outside 1..{self.world_size - 1}", 0
        if nnodes != self.world_size:
            return f"its --nnodes {nnodes!r} differs from rank 0's {self.world_size}", 0
        return None, rank

    def _admit(self, channel: Channel, hello: JsonObject | None, address: str) -> int | None:
        problem, rank = self._check_hello(hello)
        complete = False
        with self._cond:
            if problem is None and self.formed.is_set():
                # torch.distributed cannot take a restarted rank into a running group.
                problem = "the group already formed; a restarted rank cannot rejoin it"
            elif problem is None and rank in self._peers:
                problem = f"rank {rank} already joined"
            if problem is None:
                self._peers[rank] = PeerLink(rank, channel, address)
                complete = len(self._peers) == self.world_size - 1
        if problem is not None:
            LOG.warning("parallel_state.py", f"rejected a rank connecting from {address}: {problem}")
            channel.send({"type": "reject", "reason": problem})
            return None
        LOG.info(
            "parallel_state.py", f"world_size={self.world_size} rank={rank} node_rank={rank} joined from {address}"
        )
        channel.send({"type": "welcome", "world_size": self.world_size})
        if complete:
            LOG.info(
                "parallel_state.py",
                f"world_size={self.world_size} rank=0 local_rank=0 distributed_init_method=tcp://"
                f"{self._address[0]}:{self._address[1]} backend=gloo: all {self.world_size} ranks joined",
            )
            self.formed.set()
        return rank

    def _read_peer(self, rank: int, channel: Channel) -> None:
        while (message := channel.receive()) is not None:
            with self._cond:
                link = self._peers.get(rank)
                if link is not None:
                    link.last_seen = time.monotonic()
                pending = self._pending.get(message.get("id", -1)) if message.get("type") == "ack" else None
                if pending is not None:
                    pending.discard(rank)
                    self._cond.notify_all()

    def _lose(self, rank: int) -> None:
        # Like gloo/NCCL, nothing notices a dead peer until the next collective:
        # record it quietly; the next step fails.
        with self._cond:
            early = not self.formed.is_set()
            if early:
                self._peers.pop(rank, None)
            else:
                self._lost.add(rank)
            self._cond.notify_all()
        if early:
            LOG.warning("parallel_state.py", f"rank {rank} left before the group formed; waiting for it again")

    def _watch_heartbeats(self) -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            now = time.monotonic()
            with self._cond:
                links = [link for rank, link in self._peers.items() if rank not in self._lost]
                changed = [link for link in links if (now - link.last_seen > HEARTBEAT_STALE_S) != link.stale]
                for link in changed:
                    link.stale = not link.stale
            for link in changed:
                if link.stale:
                    LOG.warning(
                        "parallel_state.py",
                        f"no heartbeat from rank {link.rank} ({link.address}) for {HEARTBEAT_STALE_S:g} s: "
                        "link down or peer stuck",
                    )
                else:
                    LOG.info("parallel_state.py", f"rank {link.rank} is heard again")

    def step(self, timeout_s: float) -> None:
        """One engine step: every peer must ack it before the caller may produce a token."""
        if self.world_size == 1:
            return
        with self._cond:
            self._raise_if_lost()
            step_id = self._next_step
            self._next_step += 1
            self._pending[step_id] = set(self._peers)
            links = list(self._peers.values())
        for link in links:
            if not link.channel.send({"type": "step", "id": step_id}):
                self._lose(link.rank)
        self._await_acks(step_id, timeout_s)

    def _await_acks(self, step_id: int, timeout_s: float) -> None:
        start = time.monotonic()
        deadline, notice = start + timeout_s, start + STUCK_NOTICE_S
        with self._cond:
            try:
                while self._pending[step_id]:
                    self._raise_if_lost()
                    now = time.monotonic()
                    if now >= deadline:
                        raise StepTimeoutError(f"RPC call to execute_model timed out after {timeout_s:g} s.")
                    if now >= notice:
                        notice += STUCK_NOTICE_S
                        LOG.warning(
                            "shm_broadcast.py",
                            f"No available shared memory broadcast block found in {STUCK_NOTICE_S:g} seconds. This "
                            "typically happens when some processes are hanging or doing some time-consuming work.",
                            role="EngineCore",
                        )
                    self._cond.wait(min(deadline, notice) - now)
            finally:
                del self._pending[step_id]

    def _raise_if_lost(self) -> None:
        if self._lost:
            raise PeerLostError(min(self._lost))


class Worker:
    """A headless rank: join rank 0, ack its steps, heartbeat; once rank 0 is gone, never rejoin."""

    def __init__(self, cfg: Config, faults: Faults, life: Lifecycle) -> None:
        self._cfg = cfg
        self._faults = faults
        self._life = life
        self._gone = threading.Event()

    def start(self) -> None:
        start_thread(self._run, "worker")

    def _run(self) -> None:
        channel = self._connect()
        if channel is None:
            return
        cfg = self._cfg
        channel.send({"type": "hello", "rank": cfg.node_rank, "nnodes": cfg.nnodes})
        start_thread(lambda: self._heartbeat(channel), "heartbeat")
        self._serve(channel)
        self._gone.set()
        LOG.error(
            "parallel_state.py",
            f"lost the connection to rank 0 at {cfg.master_addr}:{cfg.master_port} (rank 0 died or refused this "
            "rank). A headless rank cannot rejoin a new group: staying up without one until stopped.",
        )

    def _connect(self) -> Channel | None:
        cfg = self._cfg
        target = (cfg.master_addr, cfg.master_port)
        LOG.info(
            "parallel_state.py",
            f"world_size={cfg.nnodes} rank={cfg.node_rank}: connecting to rank 0 at {target[0]}:{target[1]}",
        )
        next_notice = time.monotonic() + 10.0
        while not self._life.ended.is_set():
            try:
                sock = socket.create_connection(target, timeout=2.0)
            except OSError as exc:
                if time.monotonic() >= next_notice:
                    next_notice += 10.0
                    LOG.warning(
                        "socket.cpp",
                        f"The client socket has failed to connect to [{target[0]}]:{target[1]} ({exc}); retrying",
                    )
                time.sleep(0.2)
                continue
            sock.settimeout(None)
            return Channel(sock)
        return None

    def _serve(self, channel: Channel) -> None:
        cfg = self._cfg
        while (message := channel.receive()) is not None:
            kind = message.get("type")
            if kind == "welcome":
                LOG.info(
                    "parallel_state.py",
                    f"world_size={cfg.nnodes} rank={cfg.node_rank} node_rank={cfg.node_rank} joined rank 0 at "
                    f"{cfg.master_addr}:{cfg.master_port} backend=gloo",
                )
            elif kind == "reject":
                LOG.error("parallel_state.py", f"rank 0 refused this rank: {message.get('reason')}")
            elif kind == "step" and not self._faults.hang:
                channel.send({"type": "ack", "id": message.get("id"), "rank": cfg.node_rank})

    def _heartbeat(self, channel: Channel) -> None:
        while not self._gone.wait(HEARTBEAT_S):
            if not self._faults.hang and not channel.send({"type": "heartbeat", "rank": self._cfg.node_rank}):
                return


class Engine:
    """The engine core as the API server sees it: steps, death, the hang switch."""

    def __init__(self, master: Master, faults: Faults, life: Lifecycle, settings: Settings) -> None:
        self._master = master
        self._faults = faults
        self._life = life
        self._settings = settings
        self._lock = threading.Lock()
        self.dead = False

    def step(self) -> None:
        """One step (prefill or one token); raises EngineDeadError once the engine died."""
        while self._faults.hang:  # API alive, engine dead: hang, answer nothing
            time.sleep(0.05)
        if self.dead:
            raise EngineDeadError(ENGINE_DEAD_MESSAGE)
        try:
            self._master.step(self._settings.execute_timeout_s)
        except PeerLostError as exc:
            self._die(f"Worker proc rank={exc.rank} (node_rank={exc.rank}) died unexpectedly, shutting down executor.")
            raise EngineDeadError(ENGINE_DEAD_MESSAGE) from exc
        except StepTimeoutError as exc:
            self._die(str(exc))
            raise EngineDeadError(ENGINE_DEAD_MESSAGE) from exc

    def token(self) -> None:
        self.step()
        if self._settings.token_delay_s:
            time.sleep(self._settings.token_delay_s)

    def prefill(self, prompt_tokens: int) -> None:
        """The prompt's step, taking ENGINE_PREFILL_TOKEN_DELAY_S per prompt token."""
        self.step()
        if self._settings.prefill_token_delay_s:
            time.sleep(self._settings.prefill_token_delay_s * prompt_tokens)

    def _die(self, cause: str) -> None:
        with self._lock:
            if self.dead:
                return
            self.dead = True
        LOG.error("multiproc_executor.py", cause, role="EngineCore")
        LOG.error("core.py", "EngineCore encountered a fatal error.", role="EngineCore")
        LOG.error("async_llm.py", "AsyncLLM output_handler failed.")
        LOG.error("async_llm.py", f"vllm.v1.engine.exceptions.EngineDeadError: {ENGINE_DEAD_MESSAGE}")
        # Measured: the API server exits with code 0 one to two seconds after the failed request.
        timer = threading.Timer(ENGINE_DEAD_EXIT_DELAY_S, self._life.end, args=(0, "EngineDeadError"))
        timer.daemon = True
        timer.start()


# --- tokens and canned answers --------------------------------------------------------------------


def count_tokens(text: str) -> int:
    return math.ceil(len(text.encode()) / 4)


def split_tokens(text: str) -> tuple[str, ...]:
    """Output tokens: pieces of at least 4 UTF-8 bytes that never split a character."""
    pieces: list[str] = []
    current: list[str] = []
    size = 0
    for char in text:
        current.append(char)
        size += len(char.encode())
        if size >= 4:
            pieces.append("".join(current))
            current, size = [], 0
    if current:
        pieces.append("".join(current))
    return tuple(pieces)


def token_ids(text: str) -> list[int]:
    data = text.encode()
    return [int.from_bytes(data[i : i + 4], "little") % VOCAB_SIZE for i in range(0, len(data), 4)]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str

    def to_json(self) -> JsonObject:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Answer:
    """What the model would say, before max_tokens and the context length cut it."""

    content: str
    reasoning: str = ""
    tool_call: ToolCall | None = None
    finish_reason: str = "stop"

    def past_eos(self, limit: int) -> Answer:
        """vLLM's `ignore_eos`: the model does not stop at its end of sequence, max_tokens (or the
        context) stops it; the stand-in's model says its answer again until then."""
        again = f"{self.content} "
        repeats = math.ceil(4 * limit / len(again.encode())) + 1  # a token is 4 bytes or more
        return Answer(again * repeats, self.reasoning, None, self.finish_reason)

    def within(self, limit: int) -> Output:
        reasoning = split_tokens(self.reasoning)
        body = split_tokens(self.tool_call.arguments if self.tool_call else self.content)
        if len(reasoning) + len(body) <= limit:
            content = () if self.tool_call else body
            return Output(reasoning, content, self.tool_call, body, self.finish_reason)
        # Cut short: a tool call cut in the middle no longer parses, so its text comes out as content.
        kept = body[: max(0, limit - len(reasoning))]
        return Output(reasoning[:limit], kept, None, kept, "length")


@dataclass(frozen=True)
class Output:
    reasoning: tuple[str, ...]
    content: tuple[str, ...]
    tool_call: ToolCall | None
    body: tuple[str, ...]
    finish_reason: str

    @property
    def completion_tokens(self) -> int:
        return len(self.reasoning) + len(self.body)

    def chat_deltas(self) -> list[JsonObject]:
        deltas: list[JsonObject] = [{"reasoning_content": piece} for piece in self.reasoning]
        deltas += [{"content": piece} for piece in self.content]
        if self.tool_call is not None:
            call = self.tool_call
            head = {"id": call.id, "type": "function", "index": 0, "function": {"name": call.name, "arguments": ""}}
            deltas.append({"tool_calls": [head]})
            deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": piece}}]} for piece in self.body]
        return deltas or [{"content": ""}]

    def chat_message(self) -> JsonObject:
        return {
            "role": "assistant",
            "content": "".join(self.content) or None,
            "reasoning_content": "".join(self.reasoning) or None,
            "tool_calls": [self.tool_call.to_json()] if self.tool_call else [],
        }


ARITHMETIC = re.compile(r"what\s+is\s+(-?\d+)\s*([-+*x\u00d7])\s*(-?\d+)", re.IGNORECASE)
PLACE = re.compile(r"\bin\s+([A-Z][\w-]*)")
PASS_KEY = re.compile(r"\bpass key is (\d+)", re.IGNORECASE)
PASS_KEY_QUESTION = re.compile(r"what\s+is\s+the\s+pass\s+key", re.IGNORECASE)
PLACE_PARAMETERS = {"city", "location", "place", "town"}
JSON_TYPE_EXAMPLES: dict[str, object] = {
    "string": "example",
    "integer": 1,
    "number": 1,
    "boolean": True,
    "array": [],
    "object": {},
}


def pass_key(text: str) -> str | None:
    """The long-context recall test: the key hidden in the text, when the text asks for it."""
    found = PASS_KEY.search(text)
    return found.group(1) if found is not None and PASS_KEY_QUESTION.search(text) else None


def arithmetic(text: str) -> str | None:
    match = ARITHMETIC.search(text)
    if match is None:
        return None
    left, operator, right = int(match.group(1)), match.group(2), int(match.group(3))
    result = left + right if operator == "+" else left - right if operator == "-" else left * right
    return str(result)


def argument_value(name: str, schema: object, text: str) -> object:
    """A plausible value for one tool parameter, from its name and JSON schema."""
    if name.lower() in PLACE_PARAMETERS:
        match = PLACE.search(text)
        return match.group(1) if match else "unknown"
    if not isinstance(schema, dict):
        return None
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    kind = schema.get("type")
    return JSON_TYPE_EXAMPLES.get(kind) if isinstance(kind, str) else None


def tool_answer(tool: JsonObject, text: str, named: bool) -> Answer:
    function = tool["function"]
    parameters = function.get("parameters")
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    if not isinstance(properties, dict):
        properties = {}
    arguments = {name: argument_value(name, schema, text) for name, schema in properties.items()}
    call = ToolCall(f"chatcmpl-tool-{uuid.uuid4().hex}", str(function["name"]), json.dumps(arguments))
    # Measured on vLLM 0.32: a named tool_choice ends with "stop", auto and required with "tool_calls".
    return Answer("", REASONING, call, "stop" if named else "tool_calls")


# --- PNG (vision) -------------------------------------------------------------------------------

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}  # grey, RGB, grey+alpha, RGBA (8 bits each)
COLOURS: tuple[tuple[str, tuple[int, int, int]], ...] = (
    ("red", (255, 0, 0)),
    ("green", (0, 255, 0)),
    ("blue", (0, 0, 255)),
    ("yellow", (255, 255, 0)),
    ("cyan", (0, 255, 255)),
    ("magenta", (255, 0, 255)),
    ("orange", (255, 165, 0)),
    ("purple", (128, 0, 128)),
    ("white", (255, 255, 255)),
    ("black", (0, 0, 0)),
    ("gray", (128, 128, 128)),
)


class PngError(ValueError):
    """Not a PNG this stand-in can read; the answer then only says it saw an image."""


@dataclass(frozen=True)
class Png:
    width: int
    height: int
    channels: int
    pixels: bytes  # unfiltered rows, `channels` bytes per pixel


def read_png(data: bytes) -> Png:
    if not data.startswith(PNG_SIGNATURE):
        raise PngError("not a PNG")
    header, compressed = _png_chunks(data)
    width, height, depth, colour, compression, filtering, interlace = header
    if depth != 8 or colour not in PNG_CHANNELS or (compression, filtering, interlace) != (0, 0, 0):
        raise PngError(f"unsupported PNG: bit depth {depth}, colour type {colour}, interlace {interlace}")
    if not 0 < width * height <= MAX_PNG_PIXELS:
        raise PngError(f"unsupported PNG size {width}x{height}")
    channels = PNG_CHANNELS[colour]
    expected = height * (width * channels + 1)
    try:
        raw = zlib.decompressobj().decompress(compressed, expected)  # bounded: no zip bomb
    except zlib.error as exc:
        raise PngError(f"corrupt image data: {exc}") from None
    if len(raw) < expected:
        raise PngError("truncated image data")
    return Png(width, height, channels, unfilter(raw, width * channels, height, channels))


def _png_chunks(data: bytes) -> tuple[tuple[int, ...], bytes]:
    header: tuple[int, ...] | None = None
    idat: list[bytes] = []
    position = len(PNG_SIGNATURE)
    while position + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[position : position + 8])
        chunk = data[position + 8 : position + 8 + length]
        position += 12 + length  # length, type, data, CRC
        if kind == b"IHDR" and len(chunk) == 13:
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat.append(chunk)
        elif kind == b"IEND":
            break
    if header is None or not idat:
        raise PngError("missing IHDR or IDAT")
    return header, b"".join(idat)


def unfilter(raw: bytes, stride: int, height: int, bpp: int) -> bytes:
    """Undo the five standard PNG row filters (None, Sub, Up, Average, Paeth)."""
    out = bytearray()
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        row = bytearray(raw[start + 1 : start + 1 + stride])
        _unfilter_row(raw[start], row, previous, bpp)
        out += row
        previous = row
    return bytes(out)


def _unfilter_row(kind: int, row: bytearray, up: bytearray, bpp: int) -> None:
    if kind == 0:
        return
    if kind == 2:
        row[:] = bytes((a + b) & 0xFF for a, b in zip(row, up, strict=True))
        return
    if kind not in (1, 3, 4):
        raise PngError(f"unknown PNG filter {kind}")
    for i in range(len(row)):
        left = row[i - bpp] if i >= bpp else 0
        if kind == 1:
            predicted = left
        elif kind == 3:
            predicted = (left + up[i]) >> 1
        else:
            predicted = _paeth(left, up[i], up[i - bpp] if i >= bpp else 0)
        row[i] = (row[i] + predicted) & 0xFF


def _paeth(left: int, above: int, upper_left: int) -> int:
    estimate = left + above - upper_left
    distances = (abs(estimate - left), abs(estimate - above), abs(estimate - upper_left))
    if distances[0] <= distances[1] and distances[0] <= distances[2]:
        return left
    return above if distances[1] <= distances[2] else upper_left


@functools.lru_cache(maxsize=4096)
def colour_name(red: int, green: int, blue: int) -> str:
    def distance(entry: tuple[str, tuple[int, int, int]]) -> int:
        r, g, b = entry[1]
        return (r - red) ** 2 + (g - green) ** 2 + (b - blue) ** 2

    return min(COLOURS, key=distance)[0]


def halves(png: Png) -> tuple[str, str]:
    """The dominant named colour of the left and of the right half (transparent pixels skipped)."""
    counts: tuple[Counter[str], Counter[str]] = (Counter(), Counter())
    # Sample about 20 000 pixels whatever the size, to keep big images cheap.
    step = max(1, int(math.sqrt(png.width * png.height / 20_000)))
    pixels, channels = png.pixels, png.channels
    for y in range(0, png.height, step):
        row = y * png.width * channels
        for x in range(0, png.width, step):
            i = row + x * channels
            if channels in (2, 4) and pixels[i + channels - 1] < 128:
                continue
            red, green, blue = (pixels[i], pixels[i + 1], pixels[i + 2]) if channels >= 3 else (pixels[i],) * 3
            counts[0 if 2 * x < png.width else 1][colour_name(red, green, blue)] += 1
    left, right = (most_common[0][0] if (most_common := c.most_common(1)) else "transparent" for c in counts)
    return left, right


def vision_answer(image: bytes) -> Answer:
    try:
        left, right = halves(read_png(image))
    except PngError as exc:
        return Answer(f"I can see an image, but the stand-in cannot read it ({exc}).", REASONING)
    return Answer(f"The left half is {left} and the right half is {right}.", REASONING)


# --- request parsing ----------------------------------------------------------------------------


class ApiError(Exception):
    """An OpenAI-shaped error as vLLM returns it: {"error": {message, type, param, code}}."""

    def __init__(self, status: HTTPStatus, message: str, kind: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.param = param

    def body(self) -> JsonObject:
        return error_body(str(self), self.kind, self.param, self.status)


def error_body(message: str, kind: str, param: str | None, status: HTTPStatus) -> JsonObject:
    return {"error": {"message": message, "type": kind, "param": param, "code": int(status)}}


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(HTTPStatus.BAD_REQUEST, message, "BadRequestError", param)


def parse_json_object(body: bytes) -> JsonObject:
    try:
        value = json.loads(body)
    except ValueError as exc:
        raise bad_request(f"JSON decode error: {exc}") from None
    if not isinstance(value, dict):
        raise bad_request("The request body must be a JSON object.")
    return value


def parse_max_tokens(request: JsonObject, default: int | None) -> int | None:
    value = request.get("max_completion_tokens")
    if value is None:
        value = request.get("max_tokens")
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"max_tokens must be an integer, got {value!r}.", "max_tokens")
    if value < 1:
        raise bad_request(f"max_tokens must be at least 1, got {value}.", "max_tokens")
    return value


def parse_messages(value: object) -> list[JsonObject]:
    if not isinstance(value, list) or not value:
        raise bad_request("messages must be a non-empty list.", "messages")
    for message in value:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request("Each message must be an object with a string role.", "messages")
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise bad_request("Message content must be a string or a list of parts.", "messages")
    return value


def content_parts(message: JsonObject) -> list[JsonObject]:
    content = message.get("content")
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    parts: list[JsonObject] = []
    for part in cast(list[object], content):
        if not isinstance(part, dict) or part.get("type") not in ("text", "image_url"):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise bad_request(f"Unsupported content part type: {kind!r}.", "messages")
        parts.append(part)
    return parts


def message_text(message: JsonObject) -> str:
    text = "".join(str(part.get("text", "")) for part in content_parts(message) if part["type"] == "text")
    calls = message.get("tool_calls")
    return text + (json.dumps(calls) if calls else "")


def image_urls(messages: list[JsonObject]) -> list[str]:
    urls: list[str] = []
    for message in messages:
        for part in content_parts(message):
            if part["type"] != "image_url":
                continue
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if not isinstance(url, str):
                raise bad_request("image_url needs a url.", "messages")
            urls.append(url)
    return urls


def load_image(url: str) -> bytes:
    match = re.fullmatch(r"data:([\w/+.-]*)((?:;[^,;]*)*);base64,(.*)", url, re.DOTALL)
    if match is None:
        if url.startswith("data:"):
            raise bad_request("Only base64 data URLs are supported for images.", "messages")
        # The stand-in never fetches; vLLM answers 500 when an image URL is unreachable.
        raise ApiError(
            HTTPStatus.INTERNAL_SERVER_ERROR,
            f"Cannot connect to host for image URL {url[:200]!r} (the stand-in never fetches URLs).",
            "InternalServerError",
        )
    try:
        return base64.b64decode(match.group(3), validate=True)
    except (binascii.Error, ValueError):
        raise bad_request("Failed to decode the base64 image data.", "messages") from None


@dataclass(frozen=True)
class ToolPlan:
    tool: JsonObject
    named: bool
    forced: bool


def parse_tools(request: JsonObject, cfg: Config) -> ToolPlan | None:
    tools = request.get("tools") or []
    if not isinstance(tools, list) or not all(_is_tool(tool) for tool in tools):
        raise bad_request("tools must be a list of {type: function, function: {name, parameters}}.", "tools")
    choice = request.get("tool_choice")
    if choice is None:
        choice = "auto" if tools else "none"
    if choice == "none":
        return None
    if not tools:
        raise bad_request("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if choice == "auto" and not (cfg.auto_tool_choice and cfg.tool_parser):
        raise bad_request('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')
    if choice in ("auto", "required"):
        return ToolPlan(tools[0], named=False, forced=choice == "required")
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    chosen = [tool for tool in tools if tool["function"]["name"] == name]
    if not chosen:
        raise bad_request(f"Invalid tool_choice {choice!r}: no such tool in `tools`.", "tool_choice")
    return ToolPlan(chosen[0], named=True, forced=True)


def _is_tool(tool: object) -> bool:
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        return False
    function = tool.get("function")
    return isinstance(function, dict) and isinstance(function.get("name"), str)


def render_chat(messages: list[JsonObject], tools: list[object]) -> str:
    """A stand-in chat template: only its length matters (prompt tokens)."""
    parts = [json.dumps(tools)] if tools else []
    parts += [f"<|{message['role']}|>{message_text(message)}" for message in messages]
    return "".join(parts) + "<|Assistant|>"


def chat_answer(messages: list[JsonObject], plan: ToolPlan | None, images: list[bytes]) -> Answer:
    users = [message for message in messages if message["role"] == "user"]
    user_text = message_text(users[-1]) if users else ""
    after_tool = messages[-1]["role"] == "tool"
    if plan is not None and (plan.forced or not after_tool):
        return tool_answer(plan.tool, user_text, plan.named)
    if after_tool:
        return Answer(f"The tool returned: {message_text(messages[-1])[:200]}", REASONING)
    if images:
        return vision_answer(images[0])
    return Answer(pass_key(user_text) or arithmetic(user_text) or FALLBACK_ANSWER, REASONING)


def completion_prompt(value: object) -> tuple[str | None, int]:
    """`prompt` as text or token ids: (text if known, prompt tokens)."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]  # a batch of one
    if isinstance(value, str) and value:
        return value, count_tokens(value)
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return None, len(value)
    raise bad_request("prompt must be a non-empty string or list of token ids.", "prompt")


# --- HTTP API -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    status: HTTPStatus
    body: bytes = b""
    content_type: str | None = "application/json"
    stream: Iterator[bytes] | None = None


def compact(value: object) -> bytes:
    # FastAPI/pydantic render JSON without spaces: the 401 body is exactly {"error":"Unauthorized"}.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def json_reply(value: object, status: HTTPStatus = HTTPStatus.OK) -> Reply:
    return Reply(status, compact(value))


def sse(value: object) -> bytes:
    return b"data: " + compact(value) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running = 0
        self.success: Counter[str] = Counter()
        self.prompt_tokens = 0
        self.generation_tokens = 0

    def started(self) -> None:
        with self._lock:
            self.running += 1

    def finished(self, prompt_tokens: int, output: Output | None) -> None:
        with self._lock:
            self.running -= 1
            if output is not None:
                self.success[output.finish_reason] += 1
                self.prompt_tokens += prompt_tokens
                self.generation_tokens += output.completion_tokens

    def text(self, model: str) -> str:
        label = f'model_name="{model}"'
        with self._lock:
            lines = [
                "# HELP vllm:num_requests_running Number of requests in model execution batches.",
                "# TYPE vllm:num_requests_running gauge",
                f"vllm:num_requests_running{{{label}}} {float(self.running)}",
                "# HELP vllm:request_success_total Count of successfully processed requests.",
                "# TYPE vllm:request_success_total counter",
                *(
                    f'vllm:request_success_total{{finished_reason="{reason}",{label}}} {float(self.success[reason])}'
                    for reason in ("stop", "length", "tool_calls")
                ),
                "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
                "# TYPE vllm:prompt_tokens_total counter",
                f"vllm:prompt_tokens_total{{{label}}} {float(self.prompt_tokens)}",
                "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
                "# TYPE vllm:generation_tokens_total counter",
                f"vllm:generation_tokens_total{{{label}}} {float(self.generation_tokens)}",
            ]
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Generation:
    """One accepted completion request, ready to run on the engine."""

    kind: str  # "chat" or "text"
    model: str
    prompt_tokens: int
    output: Output
    stream: bool
    include_usage: bool


class Api:
    """The OpenAI-compatible routes of vLLM's API server, as measured on vLLM 0.32."""

    def __init__(self, cfg: Config, engine: Engine) -> None:
        self.cfg = cfg
        self.engine = engine
        self.metrics = Metrics()
        self.created = int(time.time())
        self.routes: dict[str, dict[str, Callable[[bytes], Reply]]] = {
            "/health": {"GET": self.health},
            "/ping": {"GET": self.health, "POST": self.health},
            "/version": {"GET": self.version},
            "/metrics": {"GET": self.metrics_text},
            "/load": {"GET": self.load},
            "/tokenize": {"POST": self.tokenize},
            "/v1/models": {"GET": self.models},
            "/v1/chat/completions": {"POST": self.chat},
            "/v1/completions": {"POST": self.completions},
            # SageMaker's route: a chat or a completion by the body's shape, and, as on vLLM, open
            # without the key (vLLM's --api-key guards /v1 only): the front is what refuses it.
            "/invocations": {"POST": self.invocations},
            "/_standin/loaded": {"GET": self.loaded},  # stand-in only, see the module docstring
        }

    def authorized(self, header: str | None) -> bool:
        if self.cfg.api_key is None:
            return True
        expected = f"Bearer {self.cfg.api_key}".encode()
        return hmac.compare_digest((header or "").encode(), expected)

    def health(self, _body: bytes) -> Reply:
        # Liveness of the API process only: a dead peer is not noticed here.
        return Reply(HTTPStatus.SERVICE_UNAVAILABLE if self.engine.dead else HTTPStatus.OK, content_type=None)

    def loaded(self, _body: bytes) -> Reply:
        return json_reply(self.cfg.loaded.to_json())

    def version(self, _body: bytes) -> Reply:
        return json_reply({"version": VERSION})

    def load(self, _body: bytes) -> Reply:
        return json_reply({"server_load": self.metrics.running})

    def metrics_text(self, _body: bytes) -> Reply:
        text = self.metrics.text(self.cfg.served_names[0])
        return Reply(HTTPStatus.OK, text.encode(), "text/plain; version=0.0.4; charset=utf-8")

    def tokenize(self, body: bytes) -> Reply:
        request = parse_json_object(body)
        if "messages" in request:
            text = render_chat(parse_messages(request["messages"]), [])
        else:
            prompt = request.get("prompt")
            if not isinstance(prompt, str):
                raise bad_request("prompt must be a string.", "prompt")
            text = prompt
        ids = token_ids(text)
        return json_reply(
            {"count": len(ids), "max_model_len": self.cfg.max_model_len, "tokens": ids, "token_strs": None}
        )

    def models(self, _body: bytes) -> Reply:
        permission = {
            "id": f"modelperm-{uuid.uuid4().hex}",
            "object": "model_permission",
            "created": self.created,
            "allow_create_engine": False,
            "allow_sampling": True,
            "allow_logprobs": True,
            "allow_search_indices": False,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }
        cards = [
            {
                "id": name,
                "object": "model",
                "created": self.created,
                "owned_by": "vllm",
                "root": self.cfg.model,
                "parent": None,
                "max_model_len": self.cfg.max_model_len,
                "permission": [permission],
            }
            for name in self.cfg.served_names
        ]
        return json_reply({"object": "list", "data": cards})

    def invocations(self, body: bytes) -> Reply:
        request = parse_json_object(body)
        return self.chat(body) if "messages" in request else self.completions(body)

    def chat(self, body: bytes) -> Reply:
        request = parse_json_object(body)
        model = self._model(request)
        messages = parse_messages(request.get("messages"))
        max_tokens = parse_max_tokens(request, None)
        plan = parse_tools(request, self.cfg)
        urls = image_urls(messages)
        if len(urls) > self.cfg.image_limit:
            raise bad_request(f"At most {self.cfg.image_limit} image(s) may be provided in one prompt.")
        images = [load_image(url) for url in urls]
        tools = request.get("tools") or []
        prompt_tokens = count_tokens(render_chat(messages, tools)) + IMAGE_TOKENS * len(images)
        limit = self._room(prompt_tokens, max_tokens)
        output = chat_answer(messages, plan, images).within(limit)
        return self._run(Generation("chat", model, prompt_tokens, output, *self._stream_flags(request)))

    def completions(self, body: bytes) -> Reply:
        request = parse_json_object(body)
        model = self._model(request)
        text, prompt_tokens = completion_prompt(request.get("prompt"))
        max_tokens = parse_max_tokens(request, COMPLETIONS_DEFAULT_MAX_TOKENS)
        limit = self._room(prompt_tokens, max_tokens)
        answer = Answer(arithmetic(text or "") or FALLBACK_ANSWER)
        output = (answer.past_eos(limit) if request.get("ignore_eos") is True else answer).within(limit)
        return self._run(Generation("text", model, prompt_tokens, output, *self._stream_flags(request)))

    def _model(self, request: JsonObject) -> str:
        name = request.get("model")
        if name is None:
            return self.cfg.served_names[0]
        if name not in self.cfg.served_names:
            raise ApiError(HTTPStatus.NOT_FOUND, f"The model `{name}` does not exist.", "NotFoundError", "model")
        return str(name)

    def _stream_flags(self, request: JsonObject) -> tuple[bool, bool]:
        options = request.get("stream_options")
        asked = isinstance(options, dict) and bool(options.get("include_usage"))
        return bool(request.get("stream")), asked or self.cfg.force_include_usage

    def _room(self, prompt_tokens: int, max_tokens: int | None) -> int:
        """Tokens the answer may use; a prompt alone over the context is an error."""
        limit = self.cfg.max_model_len
        if prompt_tokens > limit:
            # vLLM tokenizes at most max_model_len + 1 tokens of an over-long prompt, hence "at least".
            raise bad_request(
                f"This model's maximum context length is {limit} tokens. However, your prompt contains at least "
                f"{limit + 1} input tokens, which exceeds the limit. Please reduce the length of the input prompt.",
                "input_tokens",
            )
        room = limit - prompt_tokens
        return room if max_tokens is None else min(max_tokens, room)

    def _run(self, gen: Generation) -> Reply:
        self.metrics.started()
        try:
            self.engine.prefill(gen.prompt_tokens)  # hangs before any header when the group is stuck
        except EngineDeadError:
            self.metrics.finished(gen.prompt_tokens, None)
            raise
        if gen.stream:
            return Reply(HTTPStatus.OK, content_type="text/event-stream; charset=utf-8", stream=self._events(gen))
        try:
            for _ in self._token_pieces(gen):
                self.engine.token()
        finally:
            self.metrics.finished(gen.prompt_tokens, None if self.engine.dead else gen.output)
        return json_reply(self._response(gen, f"{self._prefix(gen)}-{uuid.uuid4().hex}"))

    def _token_pieces(self, gen: Generation) -> list[JsonObject]:
        if gen.kind == "chat":
            return gen.output.chat_deltas()
        return [{"text": piece} for piece in gen.output.body] or [{"text": ""}]

    @staticmethod
    def _prefix(gen: Generation) -> str:
        return "chatcmpl" if gen.kind == "chat" else "cmpl"

    def _usage(self, gen: Generation) -> JsonObject:
        completion = gen.output.completion_tokens
        return {
            "prompt_tokens": gen.prompt_tokens,
            "total_tokens": gen.prompt_tokens + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": None,
        }

    def _response(self, gen: Generation, request_id: str) -> JsonObject:
        output = gen.output
        if gen.kind == "chat":
            choice: JsonObject = {"index": 0, "message": output.chat_message()}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": "".join(output.body), "prompt_logprobs": None}
            obj = "text_completion"
        choice.update({"logprobs": None, "finish_reason": output.finish_reason, "stop_reason": None})
        return {
            "id": request_id,
            "object": obj,
            "created": int(time.time()),
            "model": gen.model,
            "choices": [choice],
            "usage": self._usage(gen),
            "prompt_logprobs": None,
            "kv_transfer_params": None,
        }

    def _chunk(self, gen: Generation, request_id: str, piece: JsonObject, finish: str | None) -> JsonObject:
        if gen.kind == "chat":
            choice: JsonObject = {"index": 0, "delta": piece}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, **piece}
            obj = "text_completion"
        choice.update({"logprobs": None, "finish_reason": finish})
        if gen.kind == "text":
            choice["stop_reason"] = None
        return {"id": request_id, "object": obj, "created": int(time.time()), "model": gen.model, "choices": [choice]}

    def _events(self, gen: Generation) -> Iterator[bytes]:
        """The SSE body: role chunk (chat), one chunk per token, usage chunk, [DONE]."""
        request_id = f"{self._prefix(gen)}-{uuid.uuid4().hex}"
        done = False
        try:
            if gen.kind == "chat":
                yield sse(self._chunk(gen, request_id, {"role": "assistant", "content": ""}, None))
            pieces = self._token_pieces(gen)
            for index, piece in enumerate(pieces):
                self.engine.token()
                last = index == len(pieces) - 1
                yield sse(self._chunk(gen, request_id, piece, gen.output.finish_reason if last else None))
            if gen.include_usage:
                final = self._chunk(gen, request_id, {}, None)
                final.update({"choices": [], "usage": self._usage(gen)})
                yield sse(final)
            done = True
        except EngineDeadError:
            yield sse(error_body(ENGINE_DEAD_MESSAGE, "InternalServerError", None, HTTPStatus.INTERNAL_SERVER_ERROR))
        finally:
            self.metrics.finished(gen.prompt_tokens, gen.output if done else None)
        yield SSE_DONE


_REQUEST_LOG_LOCK = threading.Lock()


def record_request(log_path: str, method: str, path: str, authorization: str | None, body: bytes) -> None:
    """ENGINE_REQUEST_LOG (test-only): what a client sent, so tests can check keys and payload fields."""
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    line = {
        "method": method,
        "path": path,
        "authorization": authorization,
        "body": parsed if isinstance(parsed, dict) else None,
    }
    with _REQUEST_LOG_LOCK, open(log_path, "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


class ApiServer(ThreadingHTTPServer):
    daemon_threads = True
    # A hung request (hang fault, silent peer) must never block closing the server.
    block_on_close = False

    def __init__(self, address: tuple[str, int], api: Api) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.api = api
        super().__init__(address, Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, which can stall on a box without DNS.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def handle_error(self, request: object, client_address: object) -> None:
        del request, client_address
        if not isinstance(sys.exc_info()[1], ConnectionError):  # clients hanging up are normal
            LOG.error("api_server.py", traceback.format_exc().rstrip())


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    # TCP_NODELAY, as uvicorn's transports set it: with Nagle on, each small chunk after the
    # first waits for the client's delayed ACK (up to 200 ms on a kept-alive connection), and
    # a stream arrives late and in one burst that the real server never sends.
    disable_nagle_algorithm = True

    def version_string(self) -> str:
        return self.server_version

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # Uvicorn's access line; headers (and so the key) are never logged.
        del size
        try:
            phrase = HTTPStatus(int(code)).phrase
        except ValueError:
            phrase = ""
        host, port = self.client_address[:2]
        LOG.uvicorn(f'{host}:{port} - "{self.requestline}" {code} {phrase}')

    def log_message(self, format: str, *args: Any) -> None:
        LOG.warning("api_server.py", format % args)

    def _dispatch(self, method: str) -> None:
        api = cast(ApiServer, self.server).api
        body = self._read_body() if method == "POST" else b""
        if body is None:
            return
        path = urlsplit(self.path).path
        if api.cfg.settings.request_log:
            record_request(api.cfg.settings.request_log, method, path, self.headers.get("Authorization"), body)
        # vLLM's auth middleware runs before routing: any keyed path without the key is a 401.
        if path.startswith(KEYED_PREFIXES) and not api.authorized(self.headers.get("Authorization")):
            self._send(json_reply({"error": "Unauthorized"}, HTTPStatus.UNAUTHORIZED))
            return
        methods = api.routes.get(path)
        if methods is None:
            self._send(json_reply({"detail": "Not Found"}, HTTPStatus.NOT_FOUND))
            return
        route = methods.get(method)
        if route is None:
            self._send(json_reply({"detail": "Method Not Allowed"}, HTTPStatus.METHOD_NOT_ALLOWED))
            return
        self._send(self._call(route, body))

    def _call(self, route: Callable[[bytes], Reply], body: bytes) -> Reply:
        try:
            return route(body)
        except ApiError as exc:
            return json_reply(exc.body(), exc.status)
        except EngineDeadError:
            status = HTTPStatus.INTERNAL_SERVER_ERROR
            return json_reply(error_body(ENGINE_DEAD_MESSAGE, "InternalServerError", None, status), status)
        except Exception as exc:  # a stand-in bug must still answer, and say where it broke
            LOG.error("api_server.py", traceback.format_exc().rstrip())
            status = HTTPStatus.INTERNAL_SERVER_ERROR
            return json_reply(error_body(f"stand-in error: {exc!r}", "InternalServerError", None, status), status)

    def _read_body(self) -> bytes | None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            self._send(json_reply({"detail": "Request body too large"}, HTTPStatus.REQUEST_ENTITY_TOO_LARGE))
            return None
        return self.rfile.read(length) if length > 0 else b""

    def _send(self, reply: Reply) -> None:
        self.send_response(reply.status)
        if reply.content_type:
            self.send_header("content-type", reply.content_type)
        if reply.stream is None:
            self.send_header("content-length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
            return
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        try:
            for data in reply.stream:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.write(b"0\r\n\r\n")
        except ConnectionError:
            self.close_connection = True  # the client hung up mid-stream (bench prefill does)
        finally:
            close = getattr(reply.stream, "close", None)
            if close is not None:
                close()


# --- process flow -------------------------------------------------------------------------------


def wait_for_group(master: Master, cfg: Config, life: Lifecycle) -> bool:
    next_notice = 0.0
    while not master.formed.is_set():
        if time.monotonic() >= next_notice:
            next_notice = time.monotonic() + cfg.settings.join_notice_s
            LOG.info(
                "parallel_state.py",
                f"Waiting for {master.missing()} more rank(s) to join at {cfg.master_addr}:{cfg.master_port} "
                f"(world_size={cfg.nnodes})",
            )
        if not life.sleep(0.05):
            return False
    return True


def announce(cfg: Config) -> None:
    url = f"http://{cfg.host}:{cfg.port}"
    LOG.info("api_server.py", f"Starting vLLM API server 0 on {url}")
    LOG.uvicorn(f"Started server process [{os.getpid()}]")
    LOG.uvicorn("Waiting for application startup.")
    LOG.uvicorn("Application startup complete.")
    LOG.uvicorn(f"Uvicorn running on {url} (Press CTRL+C to quit)")


def run_head(cfg: Config, faults: Faults, life: Lifecycle) -> int:
    master = Master(cfg)
    try:
        master.start()
    except OSError as exc:
        LOG.error("parallel_state.py", f"cannot listen on {cfg.master_addr}:{cfg.master_port} for the ranks: {exc}")
        return 1
    if not wait_for_group(master, cfg, life):
        return ending(life, cfg, None)
    LOG.info("gpu_model_runner.py", "Model loading (stand-in: no weights are read)", role="EngineCore")
    if not life.sleep(cfg.settings.startup_delay_s):
        return ending(life, cfg, None)
    try:
        server = ApiServer((cfg.host, cfg.port), Api(cfg, Engine(master, faults, life, cfg.settings)))
    except OSError as exc:
        LOG.error("api_server.py", f"cannot bind the API to {cfg.host}:{cfg.port}: {exc}")
        return 1
    announce(cfg)
    start_thread(server.serve_forever, "http")
    life.sleep(math.inf)
    return ending(life, cfg, server)


def run_headless(cfg: Config, faults: Faults, life: Lifecycle) -> int:
    Worker(cfg, faults, life).start()
    life.sleep(math.inf)
    return ending(life, cfg, None)


def ending(life: Lifecycle, cfg: Config, server: ApiServer | None) -> int:
    if life.code != 0:
        LOG.error("standin.py", f"exiting with code {life.code}: {life.reason}")
        return life.code
    LOG.uvicorn("Shutting down")
    if server is not None:
        server.shutdown()
        server.server_close()
    LOG.uvicorn("Waiting for application shutdown.")
    if life.terminated:
        # Measured: vLLM needs more than Docker's default 10 s to stop.
        time.sleep(cfg.settings.shutdown_s)
    LOG.uvicorn("Application shutdown complete.")
    LOG.uvicorn(f"Finished server process [{os.getpid()}]")
    return 0


def log_start(parser: argparse.ArgumentParser, args: argparse.Namespace, cfg: Config) -> None:
    LOG.info("api_server.py", f"vLLM API server version {VERSION}")
    LOG.info("utils.py", f"non-default args: {non_default_args(parser, args)}")
    LOG.warning("standin.py", "this is a TEST STAND-IN for vLLM: no GPU, no weights, canned answers")
    LOG.info("standin.py", cfg.loaded.describe())
    if not cfg.headless:
        source = "--api-key" if args.api_key else "VLLM_API_KEY" if cfg.api_key else None
        LOG.info("api_server.py", f"API key required on /v1 (from {source})" if source else "no API key: /v1 is open")


def main(argv: list[str]) -> int:
    """`vllm serve ...` as the testbed's /usr/local/bin/vllm calls it (argv without the program name)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed usage and the error
        return exc.code if isinstance(exc.code, int) else 2
    life = Lifecycle()
    try:
        cfg = make_config(args, os.environ)
        faults = Faults(os.environ, life)
    except ConfigError as exc:
        LOG.error("api_server.py", f"ValueError: {exc}")
        return 1
    if cfg.headless:
        LOG.role = "Worker"
    log_start(parser, args, cfg)
    signal.signal(signal.SIGTERM, life.on_signal)
    signal.signal(signal.SIGINT, life.on_signal)
    faults.start()
    code = run_headless(cfg, faults, life) if cfg.headless else run_head(cfg, faults, life)
    # Hung request threads (hang fault, silent peer) must neither keep the process alive nor race
    # interpreter shutdown for stdout: leave at once, as a killed engine would.
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)
