"""`reconciler smoke`: every check passes against the engine stand-in on loopback, and each
check's FAIL path — through a real server (a wrong key, a wrong model, an open API, a fake
that answers wrongly) and through its pure judgement — names the reason."""

from __future__ import annotations

import base64
import dataclasses
import json
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from reconciler import apply, commands
from reconciler.actions import Action, Smoke
from reconciler.cli import main
from reconciler.errors import CheckFailedError, SmokeFailedError
from reconciler.execution import ApplyContext
from reconciler.plan import plan
from reconciler.spec import Deployment
from reconciler.verify import smoke
from reconciler.verify.apiclient import ApiTarget
from reconciler.verify.smoke import run_smoke
from tests.ports import free_port
from tests.scenarios import empty_facts, reference_deployment, with_serving
from tests.unit.frontproc import fronted_group
from tests.unit.test_engine_standin import (
    KEY,
    MODEL,
    Group,
    Launcher,
    single_argv,
    wait_healthy,
)

ALL = ["models", "unauthorized", "stream", "text", "reasoning", "tools", "vision"]
Route = Callable[[str, str, dict[str, Any]], tuple[int, str, bytes]]


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    """The two-rank stand-in as the reconciler runs it: rank 0 without the key, behind a real
    HAProxy with the rendered front config; `url` and `port` are the front's."""
    with fronted_group(tmp_path_factory.mktemp("fronted")) as (started, port):
        yield dataclasses.replace(started, url=f"http://127.0.0.1:{port}", port=port)


@pytest.fixture(scope="module")
def open_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A stand-in started without any API key: /v1 is open to anyone."""
    launcher = Launcher(tmp_path_factory.mktemp("smoke-open"))
    port = free_port()
    engine = launcher.start(
        single_argv(launcher.model_dir, port, "--enable-auto-tool-choice", "--tool-call-parser", "x")
    )
    try:
        wait_healthy(engine, f"http://127.0.0.1:{port}")
        yield f"http://127.0.0.1:{port}"
    finally:
        launcher.close()


def results(report: smoke.SmokeReport) -> dict[str, tuple[bool, str]]:
    return {check.name: (check.ok, check.reason) for check in report.checks}


# --- PASS paths: the stand-in answers like DeepSeek-V4.1-Flash on vLLM ---------------------------


def test_every_check_passes_against_the_standin(group: Group) -> None:
    report = run_smoke(ApiTarget(group.url, KEY, MODEL))
    found = results(report)
    assert list(found) == ALL
    assert all(ok for ok, _ in found.values()), found
    assert found["models"][1] == f"lists {MODEL}"
    assert found["unauthorized"][1] == "28 requests over 14 routes refused without a key and with a wrong key"
    assert found["stream"][1].endswith("finish_reason stop, usage chunk (5 completion tokens), [DONE]")
    assert found["text"][1] == "answered '391'"
    assert found["reasoning"][1].startswith("reasoning_content present")
    assert found["tools"][1] == 'get_weather({"city": "Warsaw"})'
    assert found["vision"][1] == "red named before blue: 'The left half is red and the right half is blue.'"
    assert report.ok
    assert report.summary() == f"7/7 checks passed against {group.url} (model {MODEL})"


def test_protocol_checks_only(group: Group) -> None:
    report = run_smoke(ApiTarget(group.url, KEY, MODEL), "protocol")
    assert [check.name for check in report.checks] == ["models", "unauthorized", "stream"]
    assert report.ok


def test_the_model_is_discovered_when_not_given(group: Group) -> None:
    report = run_smoke(ApiTarget(group.url, KEY, None), "protocol")
    assert report.model == MODEL
    assert report.ok


def test_the_vision_image_is_red_left_and_blue_right() -> None:
    data = smoke.vision_image().removeprefix("data:image/png;base64,")
    raw = base64.b64decode(data)
    width, height = struct.unpack(">II", raw[16:24])
    length = struct.unpack(">I", raw[33:37])[0]
    pixels = zlib.decompress(raw[41 : 41 + length])
    row = pixels[1 : 1 + width * 3]
    assert (width, height) == (128, 128)
    assert tuple(row[:3]) == (255, 0, 0)
    assert tuple(row[63 * 3 : 64 * 3]) == (255, 0, 0)
    assert tuple(row[64 * 3 : 65 * 3]) == (0, 0, 255)
    assert tuple(row[-3:]) == (0, 0, 255)


# --- FAIL paths through a server ----------------------------------------------------------------


def test_a_wrong_key_fails_every_keyed_check_and_is_never_shown(group: Group) -> None:
    wrong = "not-the-key-4c3b2a"
    found = results(run_smoke(ApiTarget(group.url, wrong, MODEL)))
    assert found["models"] == (False, "GET /v1/models answered HTTP 401 (wrong key?)")
    assert found["unauthorized"][0]
    for name in ("stream", "text", "reasoning", "tools", "vision"):
        ok, reason = found[name]
        assert not ok
        assert "HTTP 401: Unauthorized" in reason
    assert all(wrong not in reason for _, reason in found.values())


def test_an_unknown_model_fails_models_and_every_request(group: Group) -> None:
    found = results(run_smoke(ApiTarget(group.url, KEY, "other-model")))
    assert found["models"] == (False, f"lists {MODEL}, not other-model")
    assert "HTTP 404: The model `other-model` does not exist." in found["text"][1]
    assert not any(ok for name, (ok, _) in found.items() if name != "unauthorized")


def test_an_api_without_a_key_fails_unauthorized(open_url: str) -> None:
    found = results(run_smoke(ApiTarget(open_url, "any-key", MODEL), "protocol"))
    ok, reason = found["unauthorized"]
    assert not ok
    assert reason.startswith(
        "GET /v1/models without a key answered HTTP 200, not 401 (open to anyone who reaches the port); "
    )
    assert found["models"][0]
    assert found["stream"][0]


def test_nothing_listening_fails_the_first_check_with_the_cause_once_and_tries_no_other() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    report = run_smoke(ApiTarget(url, KEY, MODEL))
    first, *rest = report.checks
    assert not first.ok
    assert (
        first.reason == f"no answer from {url}: connection refused: nothing listens there (is the deployment up? "
        "`reconciler status`)"
    )
    assert rest
    assert all(not item.ok and item.reason.startswith("not run: the API could not be reached") for item in rest)
    assert all("Errno" not in item.reason and "Error" not in item.reason for item in report.checks)


class FakeServer(ThreadingHTTPServer):
    """An OpenAI-shaped server on loopback whose answers a test chooses (`route`)."""

    daemon_threads = True

    def __init__(self, route: Route) -> None:
        self.route = route
        super().__init__(("127.0.0.1", 0), FakeHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class FakeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._answer("GET", {})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self._answer("POST", json.loads(self.rfile.read(length) or b"{}"))

    def _answer(self, method: str, body: dict[str, Any]) -> None:
        server = self.server
        assert isinstance(server, FakeServer)
        status, content_type, payload = server.route(method, self.path, body)
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        del format, args


@pytest.fixture
def serve() -> Iterator[Callable[[Route], str]]:
    servers: list[FakeServer] = []

    def start(route: Route) -> str:
        server = FakeServer(route)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def reply(message: dict[str, Any], finish: str = "stop") -> tuple[int, str, bytes]:
    body = {"choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}]}
    return 200, "application/json", json.dumps(body).encode()


def wrong_answers(method: str, path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
    """Open, lists another model, answers wrongly, and streams without the usage chunk."""
    del path
    if method == "GET":
        return 200, "application/json", b'{"object": "list", "data": [{"id": "other-model"}]}'
    if body.get("stream"):
        chunks = [
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {"content": "38"}, "finish_reason": "stop"}]},
        ]
        events = b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks)
        return 200, "text/event-stream", events + b"data: [DONE]\n\n"
    if body.get("tools"):
        return reply({"content": "It is sunny in Warsaw."})
    if isinstance(body["messages"][0]["content"], list):
        return reply({"content": "The left half is blue and the right half is red."})
    return reply({"content": "I believe it is 392."})


def test_wrong_answers_fail_each_check_with_its_reason(serve: Callable[[Route], str]) -> None:
    found = results(run_smoke(ApiTarget(serve(wrong_answers), KEY, MODEL)))
    assert found == {
        "models": (False, f"lists other-model, not {MODEL}"),
        "unauthorized": (
            False,
            "GET /v1/models without a key answered HTTP 200, not 401 (open to anyone who reaches the port); "
            "27 more request(s) not refused",
        ),
        "stream": (False, "no final usage chunk (choices: [] with usage) before [DONE]"),
        "text": (False, "391 not in the answer: 'I believe it is 392.'"),
        "reasoning": (False, "no reasoning_content in the answer (is --reasoning-parser set?)"),
        "tools": (False, "no tool call: 'It is sunny in Warsaw.'"),
        "vision": (
            False,
            "blue named before red (the left half is red): 'The left half is blue and the right half is red.'",
        ),
    }


def test_max_tokens_caps_only_the_content_checks(serve: Callable[[Route], str]) -> None:
    caps: dict[str, object] = {}

    def record(method: str, path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
        if method == "POST":
            kind = "stream" if body.get("stream") else "tools" if body.get("tools") else "chat"
            caps[kind] = body.get("max_tokens")
        return wrong_answers(method, path, body)

    run_smoke(ApiTarget(serve(record), KEY, MODEL))
    assert caps == {"stream": 64, "tools": None, "chat": None}  # the reference sets no cap
    run_smoke(ApiTarget(serve(record), KEY, MODEL), max_tokens=32)
    assert caps == {"stream": 64, "tools": 32, "chat": 32}


def test_server_errors_and_non_json_are_reasons(serve: Callable[[Route], str]) -> None:
    def broken(method: str, path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
        del body
        if method == "GET":
            return 200, "application/json", b"<html>not json</html>"
        if path.endswith("/chat/completions"):
            error = {"error": {"message": "boom: the engine died", "type": "InternalServerError", "code": 500}}
            return 500, "application/json", json.dumps(error).encode()
        return 404, "application/json", b"{}"

    found = results(run_smoke(ApiTarget(serve(broken), KEY, MODEL)))
    assert found["models"][1].startswith("the answer is not JSON")
    assert found["text"] == (False, "POST /v1/chat/completions: HTTP 500: boom: the engine died")
    assert found["stream"] == (False, "POST /v1/chat/completions (stream): HTTP 500: boom: the engine died")


def test_a_key_echoed_by_a_server_is_redacted(serve: Callable[[Route], str]) -> None:
    def echo(method: str, path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
        del method, path, body
        return 400, "application/json", json.dumps({"error": {"message": f"bad key {KEY}"}}).encode()

    found = results(run_smoke(ApiTarget(serve(echo), KEY, MODEL)))
    assert found["text"] == (False, "POST /v1/chat/completions: HTTP 400: bad key (redacted)")


# --- FAIL paths of each judgement ---------------------------------------------------------------


def answer(content: str | None = None, finish: str = "stop", **message: object) -> dict[str, Any]:
    return {"choices": [{"message": {"content": content, **message}, "finish_reason": finish}]}


def call(name: str, arguments: str) -> dict[str, Any]:
    return answer(None, "tool_calls", tool_calls=[{"function": {"name": name, "arguments": arguments}}])


@pytest.mark.parametrize(
    ("judge", "body", "reason"),
    [
        (smoke.judge_text, answer("392"), "391 not in the answer: '392'"),
        (smoke.judge_text, answer(None, "length"), "391 not in the answer: empty content (finish_reason length)"),
        (smoke.judge_text, {"choices": []}, "the answer has no choices"),
        (smoke.judge_reasoning, answer("391", reasoning_content=""), "no reasoning_content in the answer"),
        (smoke.judge_tools, answer("Sunny."), "no tool call: 'Sunny.'"),
        (smoke.judge_tools, call("get_time", '{"city": "Warsaw"}'), "called 'get_time', not get_weather"),
        (smoke.judge_tools, call("get_weather", '{"city": "Wars'), "the arguments are not a JSON object"),
        (smoke.judge_tools, call("get_weather", '["Warsaw"]'), "the arguments are not a JSON object"),
        (smoke.judge_tools, call("get_weather", '{"city": "Krakow"}'), "the arguments do not name Warsaw"),
        (smoke.judge_vision, answer("Both halves are blue."), "the answer does not name red: 'Both halves are blue.'"),
        (smoke.judge_vision, answer("It is coloured."), "the answer does not name red or blue"),
        (smoke.judge_vision, answer("Covered in blue, then red."), "blue named before red"),
    ],
)
def test_each_judgement_names_why_it_fails(judge: Callable[[object], str], body: object, reason: str) -> None:
    with pytest.raises(CheckFailedError) as failed:
        judge(body)
    assert failed.value.reason.startswith(reason)


def test_judgements_accept_the_variants_vllm_produces() -> None:
    assert smoke.judge_reasoning(answer("391", reasoning="newer vLLM field")).startswith("reasoning present")
    assert (
        smoke.judge_tools(call("get_weather", '{"location": "warsaw, PL"}'))
        == 'get_weather({"location": "warsaw, PL"})'
    )
    assert smoke.judge_vision(answer("Red on the left, blue on the right.")).startswith("red named before blue")


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: object) -> str:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return json.dumps({"object": "chat.completion.chunk", "choices": choices, **extra})


GOOD_STREAM = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "38"}, "stop"),
    chunk(None, usage={"prompt_tokens": 5, "completion_tokens": 1}),
    "[DONE]",
]


@pytest.mark.parametrize(
    ("content_type", "payloads", "reason"),
    [
        ("application/json", GOOD_STREAM, "content-type is application/json, not text/event-stream"),
        ("text/event-stream", GOOD_STREAM[:-1], "the stream does not end with data: [DONE]"),
        ("text/event-stream", ["{oops", "[DONE]"], "a chunk is not JSON: {oops"),
        ("text/event-stream", GOOD_STREAM[1:], "the first chunk does not carry delta.role 'assistant'"),
        ("text/event-stream", [GOOD_STREAM[0], chunk({"content": "38"}), *GOOD_STREAM[2:]], "no chunk carries a"),
        ("text/event-stream", [*GOOD_STREAM[:2], "[DONE]"], "no final usage chunk"),
        ("text/event-stream", [*GOOD_STREAM[:2], chunk(None, usage={}), "[DONE]"], "the usage chunk has no completion"),
    ],
)
def test_each_stream_framing_fault_is_named(content_type: str, payloads: list[str], reason: str) -> None:
    assert smoke.judge_stream("text/event-stream; charset=utf-8", GOOD_STREAM).startswith("3 chunks")
    with pytest.raises(CheckFailedError) as failed:
        smoke.judge_stream(content_type, payloads)
    assert failed.value.reason.startswith(reason)


@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        (401, None, "GET /v1/models answered HTTP 401 (wrong key?)"),
        (200, {"data": []}, "GET /v1/models lists no model"),
        (200, {"data": [{"id": "a"}, {"id": "b"}]}, f"lists a, b, not {MODEL}"),
    ],
)
def test_models_failures(status: int, body: object, reason: str) -> None:
    with pytest.raises(CheckFailedError) as failed:
        smoke.judge_models(status, body, MODEL)
    assert failed.value.reason == reason


def test_unauthorized_needs_401_both_without_and_with_a_wrong_key() -> None:
    with pytest.raises(CheckFailedError) as failed:
        smoke.judge_unauthorized(
            [("GET /v1/models", "without a key", 401), ("GET /v1/models", "with a wrong key", 403)]
        )
    assert failed.value.reason == "GET /v1/models with a wrong key answered HTTP 403, not 401"


def test_unauthorized_fails_on_any_route_the_engine_serves_without_the_key() -> None:
    """vLLM's own --api-key guards /v1 only: /invocations answering 200 without a key must fail."""
    answers = [("GET /v1/models", "without a key", 401), ("POST /invocations", "without a key", 200)]
    answers.append(("GET /metrics", "without a key", 200))
    with pytest.raises(CheckFailedError) as failed:
        smoke.judge_unauthorized(answers)
    assert failed.value.reason == (
        "POST /invocations without a key answered HTTP 200, not 401 (open to anyone who reaches the port); "
        "1 more request(s) not refused"
    )
    assert "refused" in smoke.judge_unauthorized([("GET /docs", "without a key", 404)])


# --- the command line ---------------------------------------------------------------------------


def spec_for(group: Group, directory: Path) -> Path:
    """A minimal spec (every other key at its default) with the head's API on the stand-in's port."""
    key_file = directory / "api_key"
    key_file.write_text(KEY + "\n", encoding="utf-8")
    spec = directory / "spec.yaml"
    spec.write_text(
        "nodes:\n"
        "  - {name: spark-head, role: head}\n"
        "  - {name: spark-worker, ssh: {host: 10.10.10.11}}\n"
        f"serving: {{port: {group.port}}}\n"
        f"api: {{key_file: {key_file}, bind: 127.0.0.1}}\n",
        encoding="utf-8",
    )
    return spec


def test_cli_reads_url_key_and_model_from_the_spec(
    group: Group, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DSV41_API_KEY", raising=False)
    code = main(["smoke", "--spec", str(spec_for(group, tmp_path)), "--json"])
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert code == 0, out + err
    assert data["ok"] is True
    assert data["url"] == group.url
    assert data["model"] == MODEL
    assert [check["name"] for check in data["checks"]] == ALL
    assert KEY not in out + err


def test_cli_takes_the_key_from_the_environment_and_exits_1_on_a_failure(
    group: Group, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DSV41_API_KEY", KEY)
    code = main(["smoke", group.url + "/v1/", "--model", "other-model", "--checks", "protocol"])
    out, _ = capsys.readouterr()
    assert code == 1
    assert f"models        FAIL  lists {MODEL}, not other-model" in out
    assert "unauthorized  PASS  28 requests over 14 routes refused without a key and with a wrong key" in out
    assert out.rstrip().endswith(f"smoke: 1/3 checks passed against {group.url} (model other-model)")
    assert KEY not in out


def test_cli_without_a_readable_key_says_where_to_put_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DSV41_API_KEY", raising=False)
    code = main(["smoke", "http://127.0.0.1:9", "--key-file", str(tmp_path / "missing"), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    assert data["message"].startswith(f"cannot read the API key file {tmp_path / 'missing'}")
    assert "DSV41_API_KEY" in data["hint"]


# --- after apply ---------------------------------------------------------------------------------


def smoke_setting(setting: str) -> Deployment:
    deployment = reference_deployment()
    startup = deployment.startup.model_copy(update={"smoke": setting})
    return deployment.model_copy(update={"startup": startup})


def rank_actions(deployment: Deployment) -> list[Action]:
    """The group restart of a bring-up (after it, the checkpoint's link switch)."""
    return [a for a in plan(deployment, empty_facts()).actions if a.component == "ranks"]


def test_a_group_restart_ends_with_the_smoke_step() -> None:
    actions = rank_actions(reference_deployment())
    assert [a.id for a in actions[-2:]] == ["ranks.wait-ready@spark-head", "ranks.smoke@spark-head"]
    assert actions[-1].depends_on == ("ranks.wait-ready@spark-head",)
    assert actions[-1].verb == "run"
    assert "models, unauthorized, stream, text, reasoning, tools, vision (startup.smoke: all)" in actions[-1].summary


def test_the_smoke_step_follows_the_spec_switch() -> None:
    protocol = rank_actions(smoke_setting("protocol"))[-1]
    assert protocol.summary.startswith("smoke-test the API: models, unauthorized, stream (startup.smoke: protocol)")
    assert rank_actions(smoke_setting("off"))[-1].id == "ranks.wait-ready@spark-head"


def executor_context(group: Group, monkeypatch: pytest.MonkeyPatch, **serving: object) -> ApplyContext:
    """The context a converge hands the rank component: the post-start smoke is passed in."""
    monkeypatch.setattr(commands, "read_key", lambda _ctx: KEY)
    deployment = with_serving(reference_deployment(), port=group.port, **serving)
    return ApplyContext(deployment, empty_facts(), {}, smoke=commands.smoke_after_start)


def test_the_smoke_executor_passes_on_a_working_group(group: Group, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = executor_context(group, monkeypatch)
    action = rank_actions(ctx.deployment)[-1]
    assert apply.EXECUTORS[Smoke](ctx, action) == f"7/7 checks passed against {group.url} (model {MODEL})"


def test_the_smoke_executor_fails_the_apply_with_the_failing_checks(
    group: Group, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = executor_context(group, monkeypatch, served_model_name="other-model")
    action = rank_actions(ctx.deployment)[-1]
    with pytest.raises(SmokeFailedError) as failed:
        apply.EXECUTORS[Smoke](ctx, action)
    assert failed.value.message.startswith(f"smoke failed: models: lists {MODEL}, not other-model; stream: ")
    assert "startup.smoke: protocol" in failed.value.hint
    assert KEY not in failed.value.message


def test_a_hanging_engine_fails_the_smoke_step_within_its_timeout(
    serve: Callable[[Route], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    thawed = threading.Event()

    def hang(method: str, path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
        thawed.wait(60)  # a frozen engine: it answers nothing while the checks run, however slow they are
        return wrong_answers(method, path, body)

    port = int(serve(hang).rsplit(":", 1)[1])
    monkeypatch.setattr(commands, "read_key", lambda _ctx: KEY)
    deployment = with_serving(smoke_setting("protocol"), port=port)
    startup = deployment.startup.model_copy(update={"smoke_timeout_s": 1})
    ctx = ApplyContext(
        deployment.model_copy(update={"startup": startup}), empty_facts(), {}, smoke=commands.smoke_after_start
    )
    try:
        with pytest.raises(SmokeFailedError) as failed:
            apply.EXECUTORS[Smoke](ctx, rank_actions(ctx.deployment)[-1])
    finally:
        thawed.set()
    # Each check gave up after the spec's 1 s, not after an answer or the reference's 3600 s.
    assert failed.value.message.count("no answer in time") == 3, failed.value.message
