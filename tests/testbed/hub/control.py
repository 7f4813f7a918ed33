"""Client for the stand-in Hub's test controls (`/_standin/...`), stdlib only.

TEST STAND-IN machinery, not part of the product: lets tests (in-process or against `serve` in another
process or network namespace) read the request log, inject faults and move branches at run time. See
`faults.py` for the rules and `server.py` for the routes.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any


class StandinControl:
    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, document: dict[str, Any] | None = None) -> Any:
        data = None if document is None else json.dumps(document).encode()
        request = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            return json.loads(response.read())

    def health(self) -> dict[str, Any]:
        """`{"ok", "repo_id", "commit" (what main resolves to), "commits" (served, oldest first), "branches"}`."""
        answer: dict[str, Any] = self._call("GET", "/_standin/health")
        return answer

    def commits(self) -> list[str]:
        """The served commits, oldest first."""
        return [str(c) for c in self.health()["commits"]]

    def branches(self) -> dict[str, str]:
        answer: dict[str, str] = self._call("GET", "/_standin/branches")
        return answer

    def move_branch(self, name: str, commit: str) -> dict[str, str]:
        """Point branch `name` (e.g. "main") at a served commit, like a push to the repo; returns the branches."""
        answer: dict[str, str] = self._call("POST", "/_standin/branches", {name: commit})
        return answer

    def log(self, since: int = 0) -> list[dict[str, Any]]:
        """Requests seen so far (see `faults.LogEntry` for the fields)."""
        entries: list[dict[str, Any]] = self._call("GET", f"/_standin/log?since={since}")
        return entries

    def clear_log(self) -> None:
        self._call("DELETE", "/_standin/log")

    def cut(self, path: str, after_bytes: int, times: int = 1) -> None:
        self._call("POST", "/_standin/faults", {"cut": [{"path": path, "after_bytes": after_bytes, "times": times}]})

    def fail(self, count: int, status: int = 503, path: str = "*", method: str | None = None) -> None:
        rule = {"count": count, "status": status, "path": path, "method": method}
        self._call("POST", "/_standin/faults", {"fail": [rule]})

    def rate(self, bytes_per_second: int | None) -> None:
        self._call("POST", "/_standin/faults", {"rate_bps": bytes_per_second})

    def faults(self) -> dict[str, Any]:
        answer: dict[str, Any] = self._call("GET", "/_standin/faults")
        return answer

    def clear_faults(self) -> None:
        self._call("DELETE", "/_standin/faults")
