"""The Hub may be down, slow or wrong at any time: every failure is a HubError, and only the
checkpoint waits for the Hub.

The real huggingface_hub client talks to the Hub stand-in, which answers errors on demand
(`fail` rules: 401, 429, 500, and an HTML page instead of JSON); refused connections, a server
that never answers, DNS and TLS failures are real sockets or real exception chains.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from huggingface_hub import close_session

from reconciler import hub
from reconciler.errors import HubError, UntrustedFileError
from reconciler.facts.gather import with_hub_listing
from reconciler.hub import list_files, translate
from reconciler.plan import plan, render_text
from reconciler.spec import Model
from tests.scenarios import converged_facts, empty_facts, reference_deployment, with_node
from tests.testbed.hub.checkpoint import build_checkpoint
from tests.testbed.hub.faults import FailRule
from tests.testbed.hub.server import StandinHub

HEAD, WORKER = "spark-head", "spark-worker"


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandinHub]:
    data = tmp_path_factory.mktemp("hub")
    build_checkpoint(data, shard_mib=1, part_mib=1)
    server = StandinHub(data).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def _quiet_client(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield
    close_session()


def failing(standin: StandinHub, status: int) -> Model:
    standin.faults.clear()
    standin.faults.add_fail(FailRule(count=100, status=status, path="/api/*"))
    return Model(endpoint=standin.url, revision=standin.info.commit)


@pytest.mark.parametrize(
    ("status", "says", "advises"),
    [
        (500, "the Hub answered HTTP 500", "retry later"),
        (503, "the Hub answered HTTP 503", "retry later"),
        (429, "rate-limited (HTTP 429)", "retry after 30 s"),
        (401, "was refused (HTTP 401)", "check the token"),
        (403, "was refused (HTTP 403)", "check the token"),
        (200, "the answer is not what a Hub sends", "captive portal"),
    ],
)
def test_every_hub_answer_that_is_not_a_listing_is_a_hub_error(
    standin: StandinHub, status: int, says: str, advises: str
) -> None:
    with pytest.raises(HubError) as raised:
        list_files(failing(standin, status))
    assert says in raised.value.message
    assert advises in raised.value.hint
    standin.faults.clear()


def test_a_refused_connection_is_a_hub_error_that_says_where() -> None:
    with pytest.raises(HubError) as raised:
        list_files(Model(endpoint="http://127.0.0.1:1"))
    assert raised.value.kind == "network"
    assert "cannot reach http://127.0.0.1:1" in raised.value.message
    assert "commands that do not need the Hub keep working" in raised.value.hint


def test_a_hub_that_never_answers_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's default HTTP client waits forever; ours gives up after READ_TIMEOUT_S."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True).start()
    monkeypatch.setattr(hub.client, "READ_TIMEOUT_S", 0.5)
    monkeypatch.setattr(hub.client, "_bounded", False)
    close_session()
    try:
        with pytest.raises(HubError) as raised:
            list_files(Model(endpoint=f"http://127.0.0.1:{listener.getsockname()[1]}"))
    finally:
        listener.close()
        for connection in accepted:
            connection.close()
    assert "timed out" in raised.value.message


def test_dns_and_tls_failures_say_what_to_check() -> None:
    model = Model(endpoint="https://hub.example.invalid")
    dns = httpx.ConnectError("[Errno -2] Name or service not known")
    dns.__cause__ = socket.gaierror(-2, "Name or service not known")
    assert "cannot resolve the host" in translate(dns, model, "listing").message
    tls = httpx.ConnectError("certificate verify failed")
    tls.__cause__ = ssl.SSLCertVerificationError("certificate verify failed: self-signed certificate")
    error = translate(tls, model, "listing")
    assert "TLS" in error.message
    assert "CA certificates" in error.hint


def test_an_unknown_failure_is_still_a_hub_error() -> None:
    error = translate(RuntimeError("something new"), Model(), "listing")
    assert error.kind == "unknown"
    assert "RuntimeError: something new" in error.message


def test_a_listing_with_a_path_that_leaves_the_model_dir_is_refused() -> None:
    from huggingface_hub.hf_api import RepoFile

    entry = RepoFile(path="../../.bashrc", size=10, oid="ab" * 20)  # type: ignore[no-untyped-call]
    with pytest.raises(HubError, match="unsafe path"):
        hub.listing._hub_file(entry)


def test_a_failed_listing_becomes_the_checkpoints_blocker_and_ranks_keep_serving() -> None:
    deployment = reference_deployment()
    facts = converged_facts(deployment)
    head = facts.nodes[HEAD].checkpoint.model_copy(update={"hub": {}})
    facts = with_node(facts, HEAD, checkpoint=head)
    outage = deployment.model_copy(update={"model": Model(endpoint="http://127.0.0.1:1")})
    observed = with_hub_listing(outage, facts.nodes[HEAD])
    assert observed.checkpoint.hub == {}
    assert observed.checkpoint.hub_error is not None
    assert "cannot reach http://127.0.0.1:1" in observed.checkpoint.hub_error

    result = plan(deployment, with_node(facts, HEAD, checkpoint=observed.checkpoint))
    assert [(b.node, b.component, b.holds_ranks) for b in result.blockers] == [(HEAD, "checkpoint", False)]
    assert "cannot check the checkpoint against the Hub" in result.blockers[0].message
    assert not result.actions
    assert not result.ranks_blocked
    assert "cannot reach http://127.0.0.1:1" in render_text(result)


def test_without_the_hub_a_dead_rank_is_still_restarted() -> None:
    deployment = reference_deployment()
    facts = converged_facts(deployment)
    head = facts.nodes[HEAD].checkpoint.model_copy(update={"hub": {}, "hub_error": "cannot reach the Hub"})
    facts = with_node(facts, HEAD, checkpoint=head)
    worker = facts.nodes[WORKER].containers[0].model_copy(update={"status": "exited", "exit_code": 0})
    facts = with_node(facts, WORKER, containers=[worker])
    result = plan(deployment, facts)
    assert any(a.component == "ranks" and a.verb in {"create", "replace"} for a in result.actions)


def test_without_the_hub_an_incomplete_checkpoint_blocks_the_ranks_naming_the_cause() -> None:
    facts = empty_facts()
    head = facts.nodes[HEAD].checkpoint.model_copy(update={"hub": {}, "hub_error": "the Hub answered HTTP 500"})
    result = plan(reference_deployment(), with_node(facts, HEAD, checkpoint=head))
    checkpoint = [b for b in result.blockers if b.component == "checkpoint"]
    assert {b.node for b in checkpoint} == {HEAD, WORKER}
    assert all("HTTP 500" in b.message for b in checkpoint)
    assert not any(a.component in {"checkpoint", "ranks"} for a in result.actions)
    assert any(a.component == "image" for a in result.actions)


def test_a_repo_file_refused_as_read_is_named_with_what_was_being_done() -> None:
    """A manifest over its size limit (or not a regular file) says which read of which repo
    failed, as any other Hub failure does, not the bare reason."""
    model = reference_deployment().model
    with pytest.raises(HubError) as failed, hub.failures.hub_call(model, "reading manifest.sha256 of the repo"):
        raise UntrustedFileError("it is larger than 1 MiB")
    assert failed.value.message.startswith("reading manifest.sha256 of the repo at ")
    assert "it is larger than 1 MiB" in failed.value.message
