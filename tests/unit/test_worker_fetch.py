"""The worker's own Hub fetch (reconciler/nodeside/fetch.py), shipped through `python3 -` as on a
node, against real local HTTP servers: two servers are two origins. What it must not do: hand the
token to another origin, follow https to http, write past a file's size, append a range the Hub
mislabelled, or hang on a Hub that trickles."""

from __future__ import annotations

import hashlib
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.client import HTTPMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from reconciler.errors import NodeCommandError
from reconciler.nodeside import fetch as worker_fetch
from reconciler.transport.base import run_program
from reconciler.transport.local import LocalTransport

NODE = LocalTransport("local")
CONTENT = bytes(range(256)) * 64  # 16 KiB
PATH = "model-00001-of-00001.safetensors"
ETAG = "e" * 64
TOKEN = "hf_worker_fetch_test_token_value"


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self.server.origin.seen.append((self.path, dict(self.headers.items())))
        self.server.origin.answer(self)

    def log_message(self, format: str, *args: Any) -> None:
        del format, args


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    origin: Origin


@dataclass
class Origin:
    """A real HTTP server in a thread; `answer` writes each response, `seen` holds (path, headers)."""

    answer: Callable[[BaseHTTPRequestHandler], None] = lambda handler: send_file(handler)
    seen: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    server: _Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def origins() -> Iterator[Callable[[], Origin]]:
    started: list[Origin] = []

    def start() -> Origin:
        origin = Origin()
        origin.server = _Server(("127.0.0.1", 0), _Handler)
        origin.server.origin = origin
        threading.Thread(target=origin.server.serve_forever, daemon=True).start()
        started.append(origin)
        return origin

    yield start
    for origin in started:
        assert origin.server is not None
        origin.server.shutdown()
        origin.server.server_close()


def requested_start(handler: BaseHTTPRequestHandler) -> int:
    asked = handler.headers.get("Range")
    return int(asked.removeprefix("bytes=").rstrip("-")) if asked else 0


def send_file(handler: BaseHTTPRequestHandler, *, extra: bytes = b"", length: bool = True) -> None:
    """The file from the byte asked for (206 with its Content-Range), with `extra` bytes past its end."""
    start = requested_start(handler)
    body = CONTENT[start:] + extra
    handler.send_response(206 if start else 200)
    if start:
        handler.send_header("Content-Range", f"bytes {start}-{len(CONTENT) - 1}/{len(CONTENT)}")
    if length:
        handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def redirect(handler: BaseHTTPRequestHandler, location: str) -> None:
    handler.send_response(302)
    handler.send_header("Location", location)
    handler.send_header("Content-Length", "0")
    handler.end_headers()


def fetch_args(hub: Origin, model_dir: Path, **extra: Any) -> dict[str, Any]:
    item = {"path": PATH, "size": len(CONTENT), "etag": ETAG, "sha256": hashlib.sha256(CONTENT).hexdigest()}
    return {
        "endpoint": hub.url,
        "repo": "org/model",
        "commit": "c" * 40,
        "token": TOKEN,
        "model_dir": str(model_dir),
        "files": [item],
        **extra,
    }


def partial_of(model_dir: Path) -> Path:
    return model_dir / f"{PATH}.{ETAG[:16]}.partial"


def run_fetch(args: dict[str, Any]) -> Any:
    return run_program(NODE, "fetch", "fetch", args, timeout=60)


# --- redirects --------------------------------------------------------------------------------------


def test_fetch_drops_authorization_on_cross_origin_redirect(origins: Callable[[], Origin], tmp_path: Path) -> None:
    hub, cdn = origins(), origins()
    hub.answer = lambda handler: redirect(handler, f"{cdn.url}/blob")
    run_fetch(fetch_args(hub, tmp_path / "model"))
    assert (tmp_path / "model" / PATH).read_bytes() == CONTENT
    assert [headers.get("Authorization") for _, headers in hub.seen] == [f"Bearer {TOKEN}"]
    assert [path for path, _ in cdn.seen] == ["/blob"]
    assert "Authorization" not in cdn.seen[0][1], "the token went to another origin"


def test_fetch_keeps_authorization_on_a_same_origin_redirect(origins: Callable[[], Origin], tmp_path: Path) -> None:
    hub = origins()
    hub.answer = lambda h: send_file(h) if h.path == "/moved" else redirect(h, "/moved")
    run_fetch(fetch_args(hub, tmp_path / "model"))
    assert (tmp_path / "model" / PATH).read_bytes() == CONTENT
    assert [headers.get("Authorization") for _, headers in hub.seen] == [f"Bearer {TOKEN}"] * 2


@pytest.mark.parametrize(
    ("current", "new", "refused"),
    [
        ("https://huggingface.co/a", "http://cdn.example/b", "plain http"),
        ("HTTPS://huggingface.co/a", "HTTP://huggingface.co/b", "plain http"),
        ("https://huggingface.co/a", "file:///etc/passwd", "not HTTP(S)"),
        ("https://huggingface.co/a", "https://cdn.example/b", None),
        ("http://127.0.0.1:8080/a", "http://127.0.0.1:9090/b", None),
        ("http://127.0.0.1:8080/a", "https://cdn.example/b", None),
    ],
)
def test_fetch_refuses_a_redirect_from_https_to_http(current: str, new: str, refused: str | None) -> None:
    reason = worker_fetch.redirect_refusal(current, new)
    assert (reason is None) if refused is None else (reason is not None and refused in reason)


def test_fetch_refuses_https_to_http_in_its_redirect_handler() -> None:
    """The handler the opener uses asks the decision above before it builds the next request."""
    request = urllib.request.Request("https://huggingface.co/x", headers={"Authorization": f"Bearer {TOKEN}"})
    with pytest.raises(SystemExit) as refused:
        worker_fetch._Redirects().redirect_request(request, None, 302, "Found", HTTPMessage(), "http://cdn.example/b")  # type: ignore[arg-type]
    assert "plain http" in str(refused.value)


def test_fetch_caps_the_number_of_redirects(origins: Callable[[], Origin], tmp_path: Path) -> None:
    hub = origins()
    hub.answer = lambda handler: redirect(handler, f"/hop{len(hub.seen)}")
    with pytest.raises(NodeCommandError) as failed:
        run_fetch(fetch_args(hub, tmp_path / "model"))
    assert f"more than {worker_fetch.MAX_REDIRECTS} times" in failed.value.message
    assert len(hub.seen) == worker_fetch.MAX_REDIRECTS + 1


# --- the body and its range -------------------------------------------------------------------------


@pytest.mark.parametrize("length", [True, False], ids=["announced", "unannounced"])
@pytest.mark.parametrize("have", [0, 1000], ids=["new", "resumed"])
def test_fetch_refuses_an_over_long_body(
    origins: Callable[[], Origin], tmp_path: Path, length: bool, have: int
) -> None:
    hub = origins()
    hub.answer = lambda handler: send_file(handler, extra=b"X" * 5000, length=length)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    partial_of(model_dir).write_bytes(CONTENT[:have])
    with pytest.raises(NodeCommandError) as failed:
        run_fetch(fetch_args(hub, model_dir))
    assert "nothing of that answer was kept" in failed.value.message
    assert partial_of(model_dir).read_bytes() == CONTENT[:have], "the partial grew past what it held"
    assert not (model_dir / PATH).exists()


def test_fetch_refuses_a_wrong_content_range(origins: Callable[[], Origin], tmp_path: Path) -> None:
    def from_the_start(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(206)
        handler.send_header("Content-Range", f"bytes 0-{len(CONTENT) - 1}/{len(CONTENT)}")
        handler.send_header("Content-Length", str(len(CONTENT)))
        handler.end_headers()
        handler.wfile.write(CONTENT)

    hub = origins()
    hub.answer = from_the_start
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    partial_of(model_dir).write_bytes(CONTENT[:1000])
    with pytest.raises(NodeCommandError) as failed:
        run_fetch(fetch_args(hub, model_dir))
    assert "asked from byte 1000, the Hub answered Content-Range 'bytes 0-16383/16384'" in failed.value.message
    assert partial_of(model_dir).read_bytes() == CONTENT[:1000], "a mislabelled range was appended"
    assert [headers.get("Range") for _, headers in hub.seen] == ["bytes=1000-"]


def test_fetch_resumes_a_partial_from_its_last_byte(origins: Callable[[], Origin], tmp_path: Path) -> None:
    hub = origins()
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    partial_of(model_dir).write_bytes(CONTENT[:1000])
    run_fetch(fetch_args(hub, model_dir))
    assert (model_dir / PATH).read_bytes() == CONTENT
    assert [headers.get("Range") for _, headers in hub.seen] == ["bytes=1000-"]


# --- a Hub that trickles ----------------------------------------------------------------------------


def trickle(handler: BaseHTTPRequestHandler, seconds: float = 10.0) -> None:
    """The file from the byte asked for, a byte every 20 ms, for at most `seconds`."""
    start = requested_start(handler)
    handler.send_response(206 if start else 200)
    if start:
        handler.send_header("Content-Range", f"bytes {start}-{len(CONTENT) - 1}/{len(CONTENT)}")
    handler.send_header("Content-Length", str(len(CONTENT) - start))
    handler.end_headers()
    deadline = time.monotonic() + seconds
    try:
        for offset in range(start, len(CONTENT)):
            if time.monotonic() > deadline:
                return
            handler.wfile.write(CONTENT[offset : offset + 1])
            handler.wfile.flush()
            time.sleep(0.02)
    except OSError:  # the fetch cut the connection: what this test wants
        return


SLOW = {"min_rate_bps": 100_000, "rate_window_s": 0.3}


def test_fetch_cuts_a_trickling_download_and_resumes_it(origins: Callable[[], Origin], tmp_path: Path) -> None:
    hub = origins()
    hub.answer = lambda handler: trickle(handler) if len(hub.seen) == 1 else send_file(handler)
    began = time.monotonic()
    run_fetch(fetch_args(hub, tmp_path / "model", **SLOW))
    assert time.monotonic() - began < 5
    assert (tmp_path / "model" / PATH).read_bytes() == CONTENT
    ranges = [headers.get("Range") for _, headers in hub.seen]
    assert len(ranges) == 2
    assert ranges[0] is None
    assert ranges[1] is not None
    assert int(ranges[1].removeprefix("bytes=").rstrip("-")) > 0, "resumed from the bytes that came"


def test_fetch_fails_clearly_when_the_hub_keeps_trickling(origins: Callable[[], Origin], tmp_path: Path) -> None:
    hub = origins()
    hub.answer = trickle
    began = time.monotonic()
    with pytest.raises(NodeCommandError) as failed:
        run_fetch(fetch_args(hub, tmp_path / "model", slow_retries=1, **SLOW))
    assert time.monotonic() - began < 5
    assert "2 times in a row" in failed.value.message
    assert len(hub.seen) == 2
    assert 0 < partial_of(tmp_path / "model").stat().st_size < len(CONTENT), "kept for the next run"
