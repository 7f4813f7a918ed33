"""Minimal HTTP helpers: TCP to testbed addresses and the Docker API over a unix socket."""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix socket (a node's dockerd)."""

    def __init__(self, sock_path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.sock_path = sock_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.sock_path)
        self.sock = sock


def docker_api(sock_path: str, method: str, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """One Docker Engine API call; returns (status, body). Streams (pull) are read to the end."""
    conn = UnixHTTPConnection(sock_path, timeout)
    try:
        conn.request(method, path, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def docker_json(sock_path: str, method: str, path: str, timeout: float = 10.0) -> Any:
    status, body = docker_api(sock_path, method, path, timeout)
    if status >= 300:
        raise OSError(f"docker API {method} {path}: {status} {body[:300]!r}")
    return json.loads(body) if body else None


def http_status(host: str, port: int, path: str, timeout: float = 2.0) -> int | None:
    """Status of GET http://host:port/path, or None if nothing answers."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except OSError:
        return None
    finally:
        conn.close()


def tcp_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
