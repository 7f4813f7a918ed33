"""A Docker API socket that answers every request with HTTP 500, for the service test.

Why 500: the sandboxed loop must show that it reached the socket (its STATUS then quotes
this answer instead of "No such file or directory") without getting a Docker it could act
on. Runs inside the test machine with the host's stdlib-only python3.
"""

from __future__ import annotations

import http.server
import os
import socketserver
import sys

ANSWER = b'{"message": "fake docker for the service test"}'


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)

    def do_POST(self) -> None:
        self.do_GET()

    def address_string(self) -> str:
        return "unix"  # a unix socket peer has no host to print


def main(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)
    with socketserver.UnixStreamServer(path, Handler) as server:
        server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1])
