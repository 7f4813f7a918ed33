"""The HTTP endpoint Prometheus scrapes: `loop.metrics`, loopback unless the owner says otherwise.

On loopback anyone on the machine may read it (as Prometheus's own node exporter works). Bound
to any other address it answers only a request with `Authorization: Bearer <the API key>`, the
same key and the same header as the API's front: nothing listens on the LAN without the key.
The key is read through a callable (from the head's key file), compared in constant time, and
never logged. A port already taken is reported and the loop runs on without metrics.
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

UNAUTHORIZED = b'{"error":"Unauthorized"}'


def parse_listen(value: str) -> tuple[str, int]:
    """`127.0.0.1:9464` or `[::1]:9464` as (host, port); the spec has checked its shape."""
    host, _, port = value.rpartition(":")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def keyed(app: WsgiApp, key: Callable[[], str | None]) -> WsgiApp:
    """`app` behind the bearer key; no key readable yet means nobody is let in."""

    def guarded(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        expected = key()
        given = str(environ.get("HTTP_AUTHORIZATION", ""))
        if expected is not None and hmac.compare_digest(given.encode(), f"Bearer {expected}".encode()):
            return app(environ, start_response)
        headers = [("Content-Type", "application/json"), ("WWW-Authenticate", "Bearer")]
        start_response("401 Unauthorized", headers)
        return [UNAUTHORIZED]

    return guarded


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _IPv6Server(_Server):
    address_family = socket.AF_INET6


class _Quiet(WSGIRequestHandler):
    """No line per scrape on stderr (the journal): Prometheus asks every few seconds. A client
    that sends nothing for `timeout` seconds is dropped, so idle connections hold no thread."""

    timeout = 10

    def log_message(self, format: str, *args: Any) -> None:
        del format, args


class MetricsServer:
    """Serves a registry on a thread of its own until `close`."""

    def __init__(self, listen: str, registry: CollectorRegistry, key: Callable[[], str | None]) -> None:
        self.listen = listen
        host, port = parse_listen(listen)
        app: WsgiApp = make_wsgi_app(registry)
        self.keyed = not is_loopback(host)
        server_class = _IPv6Server if ":" in host else _Server
        self._server = make_server(host, port, keyed(app, key) if self.keyed else app, server_class, _Quiet)
        self.url = f"http://{listen}/metrics"
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
