"""The front: the API's one door. A real HAProxy with the rendered config in front of the engine
stand-in refuses every route without the key and serves them with it (streams too); the plan
manages the front apart from the ranks, and an upgrade moves rank 0 behind it in one ordered change."""

from __future__ import annotations

import dataclasses
import http.server
import json
import socket
import socketserver
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from reconciler.errors import SpecError
from reconciler.facts.files import KeyFileFacts, TlsFacts
from reconciler.facts.node import Facts, load_facts
from reconciler.front import DRAIN_ON, LABEL_KEY_VERSION, RETRY_AFTER_S, files_version, haproxy_config, render_front
from reconciler.nodeside import memguard
from reconciler.nodeside.common import admin_command
from reconciler.nodeside.ops import engine_load
from reconciler.nodeside.probe import cert_fingerprint, front_draining
from reconciler.nodeside.statedir import StateDir
from reconciler.plan import Plan, plan, render_text
from reconciler.serving import LABEL_CONFIG_HASH
from reconciler.spec import Deployment, load_spec
from reconciler.spec.model import Tls
from reconciler.tlspair import self_signed
from reconciler.verify.apiclient import ApiTarget
from reconciler.verify.smoke import UNKEYED_PROBES, run_smoke
from tests.ports import free_port
from tests.scenarios import CONVERGED_FACTS, KEY_VERSION, reference_deployment, with_node
from tests.unit.frontproc import fronted_group, running_front
from tests.unit.test_engine_standin import KEY, MODEL, Group

HEAD = "spark-head"
# The stand-in's pause per token: a stream has a rhythm a buffering front would flatten.
TOKEN_DELAY_S = 0.005
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "What is 17 * 23?"}], "max_tokens": 8}


@pytest.fixture(scope="module")
def fronted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Group, Path]]:
    """Rank 0 without a key behind the front, as the reconciler runs them; and the key file."""
    directory = tmp_path_factory.mktemp("front")
    with fronted_group(directory, {"ENGINE_TOKEN_DELAY_S": str(TOKEN_DELAY_S)}) as (group, port):
        yield dataclasses.replace(group, url=f"http://127.0.0.1:{port}"), directory / "api_key"


def ask(url: str, method: str, path: str, authorization: str | None) -> httpx.Response:
    headers = {"Authorization": authorization} if authorization is not None else {}
    body = CHAT if method == "POST" else None
    return httpx.request(method, url + path, json=body, headers=headers, timeout=30)


@pytest.mark.parametrize(("method", "path"), UNKEYED_PROBES, ids=lambda item: str(item))
def test_every_route_class_is_refused_without_the_key_and_served_with_it(
    fronted: tuple[Group, Path], method: str, path: str
) -> None:
    group, _ = fronted
    wrong = f"Bearer wrong-{uuid.uuid4().hex}"
    for authorization in (None, wrong, f"bearer {KEY}", f"Bearer {KEY}x", f"Bearer  {KEY}", f"Basic {KEY}", KEY):
        refused = ask(group.url, method, path, authorization)
        assert refused.status_code == 401, (authorization and authorization[:6], refused.text)
        assert refused.json() == {"error": "Unauthorized"}
    # With the key the request reaches the engine, whatever it then makes of it.
    assert ask(group.url, method, path, f"Bearer {KEY}").status_code != 401


def test_the_engine_behind_the_front_serves_completions_without_the_key_only_past_it(
    fronted: tuple[Group, Path],
) -> None:
    """The stand-in, like vLLM, serves /invocations to anyone: the front is what refuses it."""
    group, _ = fronted
    direct = f"http://127.0.0.1:{group.port}"
    assert ask(direct, "POST", "/invocations", None).status_code == 200
    assert ask(group.url, "POST", "/invocations", None).status_code == 401
    answer = ask(group.url, "POST", "/invocations", f"Bearer {KEY}")
    assert answer.status_code == 200
    assert "391" in answer.json()["choices"][0]["message"]["content"]


def test_health_is_open_for_get_only(fronted: tuple[Group, Path]) -> None:
    group, _ = fronted
    assert ask(group.url, "GET", "/health", None).status_code == 200
    for method, path in (("POST", "/health"), ("GET", "/health/../v1/models"), ("GET", "//health")):
        assert ask(group.url, method, path, None).status_code == 401, (method, path)


def raw_status(port: int, request: bytes) -> int:
    """The status HAProxy answers to `request` sent byte for byte (no client normalises it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(request)
        first = connection.makefile("rb").readline()
    return int(first.split()[1])


@pytest.mark.parametrize(
    "request_text",
    [
        "GET /health/../v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET http://x/health HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET /v1/models HTTP/1.0\r\n\r\n",
        "HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n",
        "get /health HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope, Bearer {key}\r\n\r\n",
        "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}, Bearer {key}\r\n\r\n",
        "POST /invocations HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{{}}",
    ],
    ids=["dot-segments", "absolute-form", "http-1.0", "head", "lowercase-method", "comma", "comma-twice", "expect"],
)
def test_requests_no_client_would_send_are_refused_too(fronted: tuple[Group, Path], request_text: str) -> None:
    group, _ = fronted
    port = int(group.url.rsplit(":", 1)[1])
    assert raw_status(port, request_text.format(key=KEY).encode()) in {400, 401}


def test_two_authorization_headers_are_refused(fronted: tuple[Group, Path]) -> None:
    group, _ = fronted
    headers = [("Authorization", "Bearer nope"), ("Authorization", f"Bearer {KEY}")]
    assert httpx.get(group.url + "/v1/models", headers=headers, timeout=30).status_code == 401


def test_a_stream_passes_through_chunk_by_chunk(fronted: tuple[Group, Path]) -> None:
    """Each token's event reaches the client as the engine sends it: a front that held chunks
    back (HAProxy without http-no-delay corks them until the stream's end) would deliver them all
    at once, however slowly the engine made them."""
    group, _ = fronted
    story = [{"role": "user", "content": "Write a long story about a lighthouse."}]
    body = {**CHAT, "messages": story, "max_tokens": 16, "stream": True, "stream_options": {"include_usage": True}}
    headers = {"Authorization": f"Bearer {KEY}"}
    arrivals: list[float] = []
    with httpx.stream("POST", group.url + "/v1/chat/completions", json=body, headers=headers, timeout=30) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        events = []
        for line in answer.iter_lines():
            if line.startswith("data: "):
                events.append(line)
                arrivals.append(time.monotonic())
    assert events[-1] == "data: [DONE]"
    tokens = sum('"content":"' in event.replace(" ", "") for event in events)
    assert tokens >= 8
    # The engine spaced the tokens at least TOKEN_DELAY_S apart; so must their arrivals be, in all.
    assert arrivals[-1] - arrivals[0] >= 0.5 * (tokens - 1) * TOKEN_DELAY_S


def test_a_drain_answers_new_requests_503_and_lets_the_stream_in_flight_finish(fronted: tuple[Group, Path]) -> None:
    """The drain switch through the real HAProxy's admin socket: a stream that passed before it
    runs to its end, a request after it gets 503 with Retry-After (health too), rank 0's metrics
    count the stream until it ends, and the switch off lets requests pass again."""
    group, key_file = fronted
    layout = StateDir(str(key_file.parent))
    metrics = f"http://127.0.0.1:{group.port}/metrics"
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 600, "ignore_eos": True, "stream": True}
    events: list[str] = []
    assert front_draining(layout, layout.front_drain) is False
    try:
        with httpx.stream("POST", group.url + "/v1/completions", json=body, headers=headers, timeout=30) as answer:
            lines = answer.iter_lines()
            events.append(next(line for line in lines if line.startswith("data: ")))
            assert admin_command(layout.front_admin_socket, f"add acl {layout.front_drain} {DRAIN_ON}") is not None
            assert front_draining(layout, layout.front_drain) is True
            refused = ask(group.url, "POST", "/v1/chat/completions", f"Bearer {KEY}")
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == str(RETRY_AFTER_S)
            assert refused.json() == {"error": "the deployment is restarting; retry later"}
            assert httpx.get(group.url + "/health", timeout=10).status_code == 503
            assert ask(group.url, "GET", "/v1/models", None).status_code == 401, "the key check comes first"
            assert engine_load({"url": metrics})["requests"] == 1, "the stream in flight"
            events += [line for line in lines if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert len(events) > 550, "the stream ran to its end through the drain"
        assert engine_load({"url": metrics})["requests"] == 0
    finally:
        admin_command(layout.front_admin_socket, f"clear acl {layout.front_drain}")
    assert front_draining(layout, layout.front_drain) is False
    assert ask(group.url, "POST", "/v1/chat/completions", f"Bearer {KEY}").status_code == 200


def test_the_drain_helpers_say_when_nothing_answers(tmp_path: Path) -> None:
    layout = StateDir(str(tmp_path))
    assert admin_command(layout.front_admin_socket, "show acl x") is None
    assert front_draining(layout, "/run/front/drain.acl") is None
    assert engine_load({"url": f"http://127.0.0.1:{free_port()}/metrics"})["requests"] is None


def test_the_config_holds_no_key_and_names_the_key_file_only() -> None:
    config = haproxy_config("0.0.0.0", 8000, 18000, "/run/secrets/dsv41-api-key")
    assert "-f /run/secrets/dsv41-api-key" in config
    assert "bind 0.0.0.0:8000" in config
    assert "server rank0 127.0.0.1:18000" in config
    assert "http-request del-header authorization" in config


# --- the plan ------------------------------------------------------------------------------------


def converged() -> Facts:
    return load_facts(CONVERGED_FACTS)


def with_front(facts: Facts, **changes: object) -> Facts:
    """The converged facts with the head's front container changed."""
    containers = []
    for container in facts.nodes[HEAD].containers:
        if container.name == "dsv41-front":
            container = container.model_copy(update=changes)
        containers.append(container)
    return with_node(facts, HEAD, containers=containers)


def kinds(result: Plan) -> list[str]:
    return [action.id for action in result.actions]


def with_api(deployment: Deployment, **changes: object) -> Deployment:
    return deployment.model_copy(update={"api": deployment.api.model_copy(update=changes)})


def test_a_front_setting_changed_replaces_the_front_alone() -> None:
    deployment = with_api(reference_deployment(), bind="10.0.0.5")
    result = plan(deployment, converged())
    assert kinds(result) == ["front.start-dsv41-front@spark-head"]
    assert result.actions[0].verb == "replace"
    assert result.actions[0].cause == "front settings changed (config, image or mounts)"


def test_a_rotated_key_file_replaces_the_front_alone() -> None:
    facts = converged()
    key = facts.nodes[HEAD].api_key
    assert key is not None
    facts = with_node(facts, HEAD, api_key=key.model_copy(update={"version": "1:2:44"}))
    result = plan(reference_deployment(), facts)
    assert kinds(result) == ["front.start-dsv41-front@spark-head"]
    assert result.actions[0].cause == "the key file (or the TLS pair) changed since the front read it"


def test_an_exited_or_missing_front_is_started_again_and_a_stray_one_removed() -> None:
    exited = plan(reference_deployment(), with_front(converged(), status="exited", exit_code=137))
    assert kinds(exited) == ["front.start-dsv41-front@spark-head"]
    assert exited.actions[0].cause == "the front is exited (exit code 137)"
    renamed = plan(reference_deployment(), with_front(converged(), name="old-front"))
    assert kinds(renamed) == ["front.remove-old-front@spark-head", "front.start-dsv41-front@spark-head"]
    assert renamed.actions[1].verb == "create"


def test_a_front_in_sync_is_named_in_sync() -> None:
    result = plan(reference_deployment(), converged())
    assert not result.has_changes
    assert any(item.component == "front" for item in result.in_sync)


def test_an_upgrade_adds_the_front_and_moves_rank0_behind_it_in_one_ordered_change() -> None:
    """What a reconciler from before the front left: rank 0 on 0.0.0.0:8000 with the key, no front."""
    facts = old_rank0_facts()
    facts = with_node(facts, HEAD, images=facts.nodes[HEAD].images[:1])
    result = plan(reference_deployment(), facts)
    assert kinds(result) == [
        "image.pull-front@spark-head",
        "ranks.stop-dsv41-r0@spark-head",
        "ranks.stop-dsv41-r1@spark-worker",
        "ranks.start-dsv41-r1@spark-worker",
        "ranks.start-dsv41-r0@spark-head",
        "front.start-dsv41-front@spark-head",
        "ranks.wait-ready@spark-head",
        "ranks.smoke@spark-head",
    ]
    front = result.actions[5]
    assert set(front.depends_on) == {"image.pull-front@spark-head", "ranks.start-dsv41-r0@spark-head"}
    assert front.id in result.actions[6].depends_on
    text = render_text(result)
    assert "--host 0.0.0.0 -> 127.0.0.1" in text
    assert "--port 8000 -> 18000" in text
    assert "front on spark-head: start dsv41-front (HAProxy, HTTP on 0.0.0.0:8000" in text
    # Once applied, nothing is left to do.
    applied = with_node(load_facts(CONVERGED_FACTS), HEAD)
    assert not plan(reference_deployment(), applied).has_changes


def test_the_key_version_label_is_what_the_plan_compares() -> None:
    facts = converged()
    front = next(c for c in facts.nodes[HEAD].containers if c.name == "dsv41-front")
    assert front.labels[LABEL_KEY_VERSION] == facts.nodes[HEAD].api_key.version  # type: ignore[union-attr]


def test_a_guard_trip_kills_the_ranks_not_the_front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard finds our running containers by label through Docker's API; the front holds no
    GPU memory and keeps answering (503) while the ranks are held."""
    killed: list[str] = []
    listed = [
        {"Id": "r0", "Names": ["/dsv41-r0"], "Labels": {"io.spark-reconciler.rank": "0"}},
        {"Id": "fr", "Names": ["/dsv41-front"], "Labels": {"io.spark-reconciler.role": "front"}},
    ]

    class Docker(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._answer(json.dumps(listed).encode())

        def do_POST(self) -> None:
            killed.append(self.path.split("/")[2])
            self._answer(b"")

        def _answer(self, body: bytes) -> None:
            self.send_response(200 if body else 204)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            del format, args

    socket_path = tmp_path / "docker.sock"
    server = socketserver.ThreadingUnixStreamServer(str(socket_path), Docker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{socket_path}")
    try:
        assert memguard.kill_ranks(["io.spark-reconciler.owner=spark-reconciler"]) == ["dsv41-r0"]
    finally:
        server.shutdown()
        server.server_close()
    assert killed == ["r0"]


# --- TLS ----------------------------------------------------------------------------------------


def test_https_through_the_front_with_the_self_signed_pair_pinned(fronted: tuple[Group, Path], tmp_path: Path) -> None:
    """The pair the reconciler makes, served by a real HAProxy: a client pinning its certificate
    gets through (smoke's protocol checks pass), plain HTTP and an unpinned client do not."""
    group, key_file = fronted
    key_pem, cert_pem = self_signed(["127.0.0.1", "localhost"], 30)
    cert = tmp_path / "tls.pem"
    cert.write_text(cert_pem, encoding="utf-8")
    (tmp_path / "tls.pem.key").write_text(key_pem, encoding="utf-8")
    with running_front(tmp_path, group.port, key_file, cert) as port:
        url = f"https://127.0.0.1:{port}"
        report = run_smoke(ApiTarget(url, KEY, MODEL, ca=cert_pem), "protocol")
        assert report.ok, report.checks
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(url + "/health", timeout=10)
        with pytest.raises(httpx.RemoteProtocolError):  # plain HTTP on the TLS port: no answer at all
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
    assert (
        cert_fingerprint(cert_pem)
        == x509.load_pem_x509_certificate(cert_pem.encode()).fingerprint(hashes.SHA256()).hex(":").upper()
    )


def with_tls(deployment: Deployment, **files: str) -> Deployment:
    return with_api(deployment, tls=Tls(**files))


def tls_facts(cert: bool = True, key: bool = True) -> TlsFacts:
    return TlsFacts(
        cert=KeyFileFacts(present=cert, empty=not cert, mode=0o644, version="1:1:700" if cert else None),
        key=KeyFileFacts(present=key, empty=not key, mode=0o600, version="2:2:240" if key else None),
        fingerprint="AB:" * 31 + "CD" if cert else None,
    )


def test_turning_tls_on_makes_a_pair_once_and_replaces_the_front_alone() -> None:
    deployment = with_tls(reference_deployment())
    result = plan(deployment, converged())
    assert kinds(result) == ["front.create-cert@spark-head", "front.start-dsv41-front@spark-head"]
    assert result.actions[1].depends_on == ("front.create-cert@spark-head",)
    assert "HTTPS on 0.0.0.0:8000" in result.actions[1].summary
    hostname = converged().nodes[HEAD].hostname
    assert result.actions[0].payload.names == ["127.0.0.1", "localhost", hostname]  # type: ignore[union-attr]
    made = with_node(converged(), HEAD, tls=tls_facts())
    after = plan(deployment, made)
    assert kinds(after) == ["front.start-dsv41-front@spark-head"]  # the pair is kept; the front reads it
    front = next(c for c in made.nodes[HEAD].containers if c.name == "dsv41-front")
    labels = {
        **render_front(deployment, "/home/nvidia").labels,
        LABEL_KEY_VERSION: files_version([KEY_VERSION, "1:1:700", "2:2:240"]),
    }
    running = with_front(made, labels=labels)
    assert not plan(deployment, running).has_changes, front
    rotated = with_node(
        running,
        HEAD,
        tls=tls_facts().model_copy(update={"key": tls_facts().key.model_copy(update={"version": "3:3:240"})}),
    )
    assert (
        plan(deployment, rotated).actions[0].cause == "the key file (or the TLS pair) changed since the front read it"
    )


def test_tls_files_of_yours_missing_hold_the_front_and_ranks_and_half_a_pair_of_ours_is_remade() -> None:
    yours = with_tls(reference_deployment(), cert_file="/etc/ssl/api.pem", key_file="/etc/ssl/api.key")
    result = plan(yours, converged())
    assert not result.actions
    blocker, ranks_wait = result.blockers
    assert ranks_wait.message == "ranks wait for front on spark-head"
    assert blocker.message == (
        "api.tls: the certificate and key are missing on spark-head (/etc/ssl/api.pem, /etc/ssl/api.key)"
    )
    assert blocker.holds_ranks  # readiness goes through the front: the ranks wait for it
    assert not any(action.component == "ranks" for action in result.actions)
    half = plan(with_tls(reference_deployment()), with_node(converged(), HEAD, tls=tls_facts(key=False)))
    made = half.actions[0]
    assert made.id == "front.create-cert@spark-head"
    assert made.payload.remake  # type: ignore[union-attr]
    assert made.cause == "half of the self-signed pair is there (no key)"


def test_a_tls_section_needs_both_files_or_neither(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "nodes:\n  - {name: a, role: head}\n  - {name: b, ssh: {host: 10.0.0.2}}\napi:\n  tls: {cert_file: /x.pem}\n",
        encoding="utf-8",
    )
    with pytest.raises(SpecError) as refused:
        load_spec(spec)
    (problem,) = refused.value.problems
    assert (problem.path, problem.message) == ("api.tls.key_file", "api.tls has a cert_file but no key_file")


def test_a_privileged_api_port_is_a_warning_naming_the_sysctl(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("nodes:\n  - {name: a, role: head}\n  - {name: b, ssh: {host: 10.0.0.2}}\nserving: {port: 443}\n")
    warned = [problem for problem in load_spec(spec).warnings if problem.path == "serving.port"]
    assert [problem.message for problem in warned] == [
        "serving.port 443 is below 1024: the front runs without privileges"
    ]
    assert "net.ipv4.ip_unprivileged_port_start" in warned[0].hint


def old_rank0_facts() -> Facts:
    """Converged as a reconciler from before the front left it: rank 0 on 0.0.0.0:8000, no front."""
    facts = converged()
    old = []
    for container in facts.nodes[HEAD].containers:
        if container.name == "dsv41-front":
            continue
        if container.name == "dsv41-r0":
            command = [*container.command]
            at = command.index("--host")
            command[at : at + 4] = ["--host", "0.0.0.0", "--port", "8000"]
            labels = {**container.labels, LABEL_CONFIG_HASH: "v2:" + "0" * 64}
            container = container.model_copy(update={"command": command, "labels": labels})
        old.append(container)
    return with_node(facts, HEAD, containers=old)


def test_an_old_rank0_on_the_api_port_holds_the_front_until_the_group_can_restart() -> None:
    """A blocked group (here: the worker does not answer) keeps the old rank 0 on :8000; starting
    the front then would fail on every pass: it waits, and never holds the ranks itself."""
    facts = with_node(old_rank0_facts(), "spark-worker", reachable=False, error="ssh: timed out")
    result = plan(reference_deployment(), facts)
    assert not any(action.component == "front" for action in result.actions)
    front = next(blocker for blocker in result.blockers if blocker.component == "front")
    assert front.message == "rank 0 of a reconciler from before the front holds :8000"
    assert not front.holds_ranks


def test_a_foreign_container_with_the_fronts_name_is_never_touched() -> None:
    facts = converged()
    containers = [
        c.model_copy(update={"labels": {}, "id": "e" * 64}) if c.name == "dsv41-front" else c
        for c in facts.nodes[HEAD].containers
    ]
    result = plan(reference_deployment(), with_node(facts, HEAD, containers=containers))
    assert not any(action.component == "front" for action in result.actions)
    assert any("a container named dsv41-front is not the reconciler's" in b.message for b in result.blockers)
