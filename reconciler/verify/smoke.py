"""`reconciler smoke`: does the deployment work? Content checks plus the protocol.

The content checks ask what a working DeepSeek-V4.1-Flash answers: 17 * 23
(391), a get_weather call for Warsaw, and the colours of a red-left/blue-right image. Users
also meet the protocol: the served model listed, every route refused without the key, reasoning split
out by the reasoning parser, and streams framed as OpenAI clients parse them (role chunk, a
finish_reason, a final usage chunk, [DONE]). Each check is one request (I/O) and a pure
judgement, so every way a check fails is testable without a server.

Protocol checks pass on any vLLM with any model; the content checks need a model that can
answer, which the random-weights test lanes cannot: `startup.smoke: protocol` (or
`--checks protocol`) runs only the protocol checks.
"""

from __future__ import annotations

import base64
import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from reconciler.errors import CheckFailedError
from reconciler.verify.apiclient import (
    REQUEST_TIMEOUT_S,
    STREAM_WITH_USAGE,
    ApiTarget,
    JsonObject,
    chunk_json,
    client,
    error_text,
    first_choice,
    listed_models,
    shorten,
    sse_payloads,
    transport_problem,
)
from reconciler.verify.png import two_halves

CheckSet = Literal["all", "protocol"]
PROTOCOL_CHECKS = ("models", "unauthorized", "stream")
CONTENT_CHECKS = ("text", "reasoning", "tools", "vision")

TEXT_PROMPT = "What is 17 * 23? Answer with the number."
TOOL_PROMPT = "What's the weather in Warsaw right now?"
VISION_PROMPT = "This image has two halves. What colour is the left half, and what colour is the right half?"
STREAM_PROMPT = "What is 40 - 2? Answer with the number."
# Framing only: a cap keeps the check short even on a model that never stops (random weights).
STREAM_MAX_TOKENS = 64
RED, BLUE = (255, 0, 0), (0, 0, 255)
IMAGE_SIZE = 128
WEATHER_TOOL: JsonObject = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    },
}


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    reason: str
    seconds: float

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "ok": self.ok, "reason": self.reason, "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class SmokeReport:
    url: str
    model: str
    checks: tuple[CheckResult, ...]

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    @property
    def failed(self) -> list[CheckResult]:
        return [check for check in self.checks if not check.ok]

    def summary(self) -> str:
        passed = len(self.checks) - len(self.failed)
        return f"{passed}/{len(self.checks)} checks passed against {self.url} (model {self.model or 'unknown'})"

    def to_dict(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "url": self.url,
            "model": self.model,
            "checks": [check.to_dict() for check in self.checks],
        }


def render(report: SmokeReport) -> str:
    """One line per check: name, PASS or FAIL, the reason; then the count."""
    width = max((len(check.name) for check in report.checks), default=0)
    lines = [f"{check.name:<{width}}  {'PASS' if check.ok else 'FAIL'}  {check.reason}" for check in report.checks]
    lines.append(f"smoke: {report.summary()}")
    return "\n".join(lines) + "\n"


def failure_text(report: SmokeReport) -> str:
    return "; ".join(f"{check.name}: {check.reason}" for check in report.failed)


# --- judgements (pure) ------------------------------------------------------------------------


def judge_models(status: int, body: object, model: str | None) -> str:
    if status != 200:
        raise CheckFailedError(f"GET /v1/models answered HTTP {status}{' (wrong key?)' if status == 401 else ''}")
    models = listed_models(body)
    if not models:
        raise CheckFailedError("GET /v1/models lists no model")
    if model is not None and model not in models:
        raise CheckFailedError(f"lists {', '.join(models)}, not {model}")
    return f"lists {model or models[0]}"


# One request per class of route the engine serves, keyed or not by vLLM itself: the OpenAI API,
# SageMaker's /invocations, the tokenizer, metrics, version and load, the pooling family, the
# docs. The front must refuse every one without the key: 401, or 404 where it hides a route.
UNKEYED_PROBES: tuple[tuple[str, str], ...] = (
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/invocations"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("GET", "/metrics"),
    ("GET", "/version"),
    ("GET", "/load"),
    ("POST", "/pooling"),
    ("POST", "/score"),
    ("POST", "/rerank"),
    ("GET", "/docs"),
    ("GET", "/openapi.json"),
)
REFUSED = frozenset({401, 404})


def judge_unauthorized(answers: list[tuple[str, str, int]]) -> str:
    """`answers`: (request, how it was sent, HTTP status) for each probe without the key."""
    opened = [(request, how, status) for request, how, status in answers if status not in REFUSED]
    if opened:
        request, how, status = opened[0]
        open_api = " (open to anyone who reaches the port)" if status < 400 else ""
        more = f"; {len(opened) - 1} more request(s) not refused" if len(opened) > 1 else ""
        raise CheckFailedError(f"{request} {how} answered HTTP {status}, not 401{open_api}{more}")
    return f"{len(answers)} requests over {len(UNKEYED_PROBES)} routes refused without a key and with a wrong key"


def judge_text(body: object) -> str:
    content = _content(_message(body))
    if "391" not in content:
        raise CheckFailedError(f"391 not in the answer: {_quoted(content, body)}")
    return f"answered {_quoted(content, body)}"


def judge_reasoning(body: object) -> str:
    message = _message(body)
    for name in ("reasoning_content", "reasoning"):
        value = message.get(name)
        if isinstance(value, str) and value.strip():
            return f"{name} present ({len(value)} characters)"
    raise CheckFailedError("no reasoning_content in the answer (is --reasoning-parser set?)")


def judge_tools(body: object) -> str:
    message = _message(body)
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        raise CheckFailedError(f"no tool call: {_quoted(_content(message), body)}")
    function = calls[0].get("function") if isinstance(calls[0], dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if name != "get_weather":
        raise CheckFailedError(f"called {name!r}, not get_weather")
    raw = function.get("arguments") if isinstance(function, dict) else None
    try:
        arguments = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        raise CheckFailedError(f"the arguments are not a JSON object: {shorten(str(raw), 80)}")
    shown = json.dumps(arguments, ensure_ascii=False)
    if "warsaw" not in shown.lower():
        raise CheckFailedError(f"the arguments do not name Warsaw: {shorten(shown, 80)}")
    return f"get_weather({shorten(shown, 80)})"


def judge_vision(body: object) -> str:
    content = _content(_message(body))
    lowered = content.lower()
    red, blue = re.search(r"\bred\b", lowered), re.search(r"\bblue\b", lowered)
    missing = [name for name, found in (("red", red), ("blue", blue)) if found is None]
    if missing:
        raise CheckFailedError(f"the answer does not name {' or '.join(missing)}: {_quoted(content, body)}")
    if red is not None and blue is not None and blue.start() < red.start():
        raise CheckFailedError(f"blue named before red (the left half is red): {_quoted(content, body)}")
    return f"red named before blue: {_quoted(content, body)}"


def judge_stream(content_type: str, payloads: list[str]) -> str:
    """vLLM's framing: role chunk first, a finish_reason, a final usage chunk, then [DONE]."""
    if not content_type.startswith("text/event-stream"):
        raise CheckFailedError(f"content-type is {content_type or 'missing'}, not text/event-stream")
    if not payloads or payloads[-1] != "[DONE]":
        raise CheckFailedError("the stream does not end with data: [DONE]")
    try:
        chunks = [chunk_json(payload) for payload in payloads[:-1]]
    except ValueError as exc:
        raise CheckFailedError(str(exc)) from None
    choices = [first for chunk in chunks if (first := first_choice(chunk)) is not None]
    if not choices or (choices[0].get("delta") or {}).get("role") != "assistant":
        raise CheckFailedError("the first chunk does not carry delta.role 'assistant'")
    finishes = [choice["finish_reason"] for choice in choices if choice.get("finish_reason")]
    if not finishes:
        raise CheckFailedError("no chunk carries a finish_reason")
    usage = chunks[-1].get("usage")
    if chunks[-1].get("choices") != [] or not isinstance(usage, dict):
        raise CheckFailedError("no final usage chunk (choices: [] with usage) before [DONE]")
    tokens = usage.get("completion_tokens")
    if not isinstance(tokens, int) or tokens < 1:
        raise CheckFailedError(f"the usage chunk has no completion_tokens: {shorten(json.dumps(usage), 80)}")
    return f"{len(chunks)} chunks, finish_reason {finishes[-1]}, usage chunk ({tokens} completion tokens), [DONE]"


def _message(body: object) -> JsonObject:
    choice = first_choice(body)
    if choice is None:
        raise CheckFailedError("the answer has no choices")
    message = choice.get("message")
    if not isinstance(message, dict):
        raise CheckFailedError("the answer has no message")
    return message


def _content(message: JsonObject) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


def _quoted(content: str, body: object) -> str:
    if content:
        return repr(shorten(content, 120))
    choice = first_choice(body)
    finish = choice.get("finish_reason") if choice else None
    return f"empty content (finish_reason {finish})"


# --- requests (I/O) ---------------------------------------------------------------------------


@dataclass
class _Probe:
    """One smoke run's connection, model and the text answer the reasoning check reuses."""

    http: httpx.Client
    target: ApiTarget
    model: str | None  # the target's, else the first /v1/models lists
    max_tokens: int | None
    timeout_s: float
    _text: Any = None
    # A check found nothing listening: the others are not tried.
    unreachable: bool = False

    def body(self, content: object, max_tokens: int | None, **extra: object) -> JsonObject:
        body: JsonObject = {"messages": [{"role": "user", "content": content}], "temperature": 0, **extra}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if self.model is not None:
            body["model"] = self.model
        return body

    def chat(self, content: object, **extra: object) -> Any:
        # No cap unless asked; without one, a model that never emits EOS (random weights, a
        # broken tokenizer) generates up to max-model-len tokens per content check.
        response = self.http.post("/v1/chat/completions", json=self.body(content, self.max_tokens, **extra))
        if response.status_code != 200:
            raise CheckFailedError(f"POST /v1/chat/completions: {error_text(response)}")
        return response.json()

    def text_answer(self) -> Any:
        if self._text is None:
            self._text = self.chat(TEXT_PROMPT)
        return self._text


def _check_models(probe: _Probe) -> str:
    response = probe.http.get("/v1/models")
    body = response.json() if response.status_code == 200 else None
    reason = judge_models(response.status_code, body, probe.model)
    probe.model = probe.model or listed_models(body)[0]
    return reason


def _check_unauthorized(probe: _Probe) -> str:
    wrong = {"Authorization": f"Bearer wrong-{uuid.uuid4().hex}"}
    body = probe.body("Say hi.", 1)
    answers: list[tuple[str, str, int]] = []
    with client(probe.target, keyed=False, timeout=min(30.0, probe.timeout_s)) as anonymous:
        for method, path in UNKEYED_PROBES:
            for how, headers in (("without a key", {}), ("with a wrong key", wrong)):
                payload = body if method == "POST" else None
                status = anonymous.request(method, path, json=payload, headers=headers).status_code
                answers.append((f"{method} {path}", how, status))
    return judge_unauthorized(answers)


def _check_stream(probe: _Probe) -> str:
    body = probe.body(STREAM_PROMPT, STREAM_MAX_TOKENS, **STREAM_WITH_USAGE)
    with probe.http.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            response.read()
            raise CheckFailedError(f"POST /v1/chat/completions (stream): {error_text(response)}")
        payloads = list(sse_payloads(response.iter_lines()))
        return judge_stream(response.headers.get("content-type", ""), payloads)


def vision_image() -> str:
    """The vision check's image: 128x128, left half red, right half blue, as a data URL."""
    data = two_halves(IMAGE_SIZE, IMAGE_SIZE, RED, BLUE)
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _check_vision(probe: _Probe) -> str:
    content = [{"type": "text", "text": VISION_PROMPT}, {"type": "image_url", "image_url": {"url": vision_image()}}]
    return judge_vision(probe.chat(content))


CHECKS: dict[str, Callable[[_Probe], str]] = {
    "models": _check_models,
    "unauthorized": _check_unauthorized,
    "stream": _check_stream,
    "text": lambda probe: judge_text(probe.text_answer()),
    "reasoning": lambda probe: judge_reasoning(probe.text_answer()),
    "tools": lambda probe: judge_tools(probe.chat(TOOL_PROMPT, tools=[WEATHER_TOOL])),
    "vision": _check_vision,
}


def check_names(checks: CheckSet) -> tuple[str, ...]:
    return PROTOCOL_CHECKS + (CONTENT_CHECKS if checks == "all" else ())


def run_smoke(
    target: ApiTarget,
    checks: CheckSet = "all",
    max_tokens: int | None = None,
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> SmokeReport:
    """Every check of the set, each independent of the others' outcome.

    max_tokens caps the content answers; timeout_s bounds each request (an engine that hangs
    fails the check instead of holding the caller).
    """
    with client(target, timeout=timeout_s) as http:
        probe = _Probe(http, target, target.model, max_tokens, timeout_s)
        results = tuple(_run_check(probe, name) for name in check_names(checks))
    return SmokeReport(target.url, probe.model or "", results)


def _run_check(probe: _Probe, name: str) -> CheckResult:
    """One check; once the API could not be reached at all, the rest are not tried (each would
    only say the same, after its own timeout)."""
    if probe.unreachable:
        return CheckResult(name, False, "not run: the API could not be reached (see above)", 0.0)
    started = time.monotonic()
    try:
        ok, reason = True, CHECKS[name](probe)
    except CheckFailedError as failure:
        ok, reason = False, failure.reason
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        probe.unreachable = True
        ok, reason = False, f"no answer from {probe.target.url}: {transport_problem(exc)}"
    except httpx.HTTPError as exc:
        ok, reason = False, f"no answer from {probe.target.url}: {transport_problem(exc)}"
    except ValueError as exc:  # a 200 whose body is not JSON
        ok, reason = False, f"the answer is not JSON: {exc}"
    return CheckResult(name, ok, probe.target.redact(reason), time.monotonic() - started)
