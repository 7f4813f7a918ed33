"""The liveness probe against the engine stand-in: what /health hides, a keyed completion sees."""

from __future__ import annotations

import http.server
import threading

import pytest

from reconciler import health
from reconciler.execution import ApplyContext
from reconciler.health import health_code, liveness_problem
from tests.scenarios import empty_facts, reference_deployment, with_serving
from tests.unit.test_engine_standin import KEY, Launcher, start_group


def test_liveness_sees_a_dead_rank1_that_health_hides(launcher: Launcher) -> None:
    group = start_group(launcher)
    deployment = with_serving(reference_deployment(), port=group.port)
    assert liveness_problem(deployment, KEY) is None
    assert liveness_problem(deployment, "not-the-key") == "GET /v1/models answered 401"
    group.rank1.proc.kill()
    group.rank1.proc.wait(timeout=10)
    assert health_code(deployment) == 200  # the lie, as real vLLM tells it
    assert liveness_problem(deployment, KEY) == "POST /v1/completions answered 500"


def test_liveness_without_an_api_names_the_connection_error() -> None:
    deployment = with_serving(reference_deployment(), port=9)
    problem = liveness_problem(deployment, KEY)
    assert problem is not None
    assert problem.startswith("connection refused: nothing listens there")


def test_a_front_fault_the_engine_does_not_share_is_no_group_failure(
    launcher: Launcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no front listening, the keyed probe fails; rank 0 past the front still answers, so the
    loop must not count it against the group (a group restart would only take the API down). A
    dead engine behind it still counts."""
    group = start_group(launcher, keyed=False)
    deployment = with_serving(reference_deployment(), port=9)  # nothing listens on the front's port
    deployment = deployment.model_copy(update={"api": deployment.api.model_copy(update={"engine_port": group.port})})
    monkeypatch.setattr(health, "read_key", lambda _ctx: KEY)
    ctx = ApplyContext(deployment, empty_facts(), {})
    assert liveness_problem(deployment, KEY) is not None
    assert health.probe_liveness(ctx) is None
    group.rank1.proc.kill()
    group.rank1.proc.wait(timeout=10)
    problem = health.probe_liveness(ctx)
    assert problem is not None
    assert problem.startswith("connection refused")  # the front's failure is what is reported


def test_an_engine_that_hangs_behind_the_front_is_not_asked_again_past_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request the front passed on and nobody answered is the engine's: the probe reports it at
    once instead of waiting as long again on rank 0's own port."""
    thawed = threading.Event()
    asked_past_the_front: list[str] = []

    class Hanging(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # /v1/models answers; the completion never does
            body = b'{"object": "list", "data": []}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            thawed.wait(30)

        def log_message(self, format: str, *args: object) -> None:
            del format, args

    class Engine(Hanging):
        def do_GET(self) -> None:
            asked_past_the_front.append(self.path)

    front = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hanging)
    engine = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    for server in (front, engine):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        deployment = with_serving(reference_deployment(), port=front.server_address[1])
        api = deployment.api.model_copy(update={"engine_port": engine.server_address[1]})
        loop = deployment.loop.model_copy(update={"liveness_timeout_s": 1})
        deployment = deployment.model_copy(update={"api": api, "loop": loop})
        monkeypatch.setattr(health, "read_key", lambda _ctx: KEY)
        problem = health.probe_liveness(ApplyContext(deployment, empty_facts(), {}))
    finally:
        thawed.set()
        for server in (front, engine):
            server.shutdown()
            server.server_close()
    assert problem is not None
    assert problem.startswith("no completion within 1 s")
    assert asked_past_the_front == []
