"""HTTP server answering the subset of the Hugging Face Hub API that `huggingface_hub` downloads use.

TEST STAND-IN for the Hugging Face Hub, not part of the product; stdlib only (`http.server`).
What it implements, and why, follows the real client's source (huggingface_hub 2.4.0; see
docs/sources.md):

- `GET /api/models/{repo}[/revision/{rev}]` -> model info with `sha` and `siblings` (size, blobId, lfs with
  `?blobs=true`). 2.4.0 calls it only for a non-sha revision; 0.36/1.17 list files from `siblings`.
- `GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=&expand=` -> file/directory entries, paginated with
  `Link: <…&cursor=N>; rel="next"` (the client follows `response.links["next"]`).
- `POST /api/models/{repo}/paths-info/{rev}` (form `paths=…&expand=…`) -> entries of the existing paths.
- `HEAD`/`GET /{repo}/resolve/{rev}/{path}` -> `X-Repo-Commit`, quoted `ETag` (sha256 for LFS, git blob id
  otherwise; the client strips quotes and `W/`), `Content-Length`, `Accept-Ranges: bytes`; LFS files also
  `X-Linked-Etag`/`X-Linked-Size`. `Range: bytes=N-`, `bytes=N-M`, `bytes=-N` -> 206 + `Content-Range`.
  A same-origin 200 is what the client expects from a mirror; with `cdn_host` set, LFS files instead answer
  302 to that host like the real Hub's CDN redirect (the client then does not forward `Authorization`).
- Errors carry `X-Error-Code` (`RepoNotFound`, `RevisionNotFound`, `EntryNotFound`) and `X-Error-Message`;
  with a token configured, a missing token is 401 `RepoNotFound`, a wrong one 401
  `Invalid credentials in Authorization header` (client: `HfHubHTTPError`).

Several commits of the one repo can be served (one built root each, given oldest first: the stand-in has no
git graph, commit i's parent is commit i-1). Every endpoint that takes a revision accepts any served commit
sha (40 hex) or a branch name (`main`, also spelled `refs/heads/main`); a branch resolves to one served commit,
`main` to the first root's unless told otherwise. Each commit shows its own files, `sha`, `lastModified`
(one day per commit after COMMIT_DATE) and, with `expand`, each entry's `lastCommit` is the commit that last
changed it, as on the Hub. A request without a revision (`/api/models/{repo}`) means `main`.

Test controls live under `/_standin/` (no token needed, never logged): `GET /_standin/health` (repo, the
commit `main` resolves to, the served `commits`, the `branches`), `GET|POST /_standin/branches`
(`{"main": "<commit>"}` moves or creates branches; answers the branches), `GET|DELETE /_standin/log[?since=N]`
(each entry's `commit` is the commit its revision resolved to), `GET|POST|DELETE /_standin/faults`
(see `faults.py`).
"""

from __future__ import annotations

import contextlib
import datetime
import hmac
import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, cast
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from .faults import Faults, LogEntry, RequestLog
from .repo import COMMIT_DATE, COMMIT_TITLE, RepoFile, RepoInfo, load_repo_info, tree_id

DEFAULT_PAGE_SIZE = 1000  # the Hub's tree page size without `expand`
EXPAND_PAGE_SIZE = 50  # … and with it
SEND_STEP = 1 << 20
BAD_TOKEN_MESSAGE = "Invalid credentials in Authorization header"
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_BRANCH = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,99}")
BRANCH_PREFIX = "refs/heads/"
DEFAULT_BRANCH = "main"


class HubError(Exception):
    """An error answer, shaped like the Hub's (status + `X-Error-Code` + `X-Error-Message`)."""

    def __init__(self, status: int, message: str, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = headers or {}


class UnsatisfiableRangeError(Exception):
    pass


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """Byte range `(start, end_inclusive)` of a single-range header, None to send the whole file.

    Malformed or multi-range headers are ignored, as HTTP allows (see docs/sources.md); a start beyond
    the end is unsatisfiable.
    """
    match = _RANGE.fullmatch(header.strip()) if header else None
    if match is None or match[1] == match[2] == "":
        return None
    if match[1] == "":
        suffix = int(match[2])
        if suffix == 0 or size == 0:
            raise UnsatisfiableRangeError
        return max(0, size - suffix), size - 1
    start = int(match[1])
    if start >= size:
        raise UnsatisfiableRangeError
    end = min(int(match[2]), size - 1) if match[2] else size - 1
    return None if end < start else (start, end)


def commit_date(index: int) -> str:
    """The date of the `index`-th served commit: COMMIT_DATE, then one day later per commit."""
    start = datetime.datetime.fromisoformat(COMMIT_DATE.replace("Z", "+00:00"))
    return (start + datetime.timedelta(days=index)).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def branch_name(revision: str) -> str:
    """`refs/heads/main` and `main` name the same branch."""
    return revision.removeprefix(BRANCH_PREFIX)


class StandinHub:
    """One repo at one or more commits, served on `host:port` (port 0 picks a free one).

    `root` is one build directory (`build_checkpoint`'s `out`) or several, oldest commit first, all of
    the same repo. `branches` maps branch names to served commits; `main` defaults to the first root's
    commit. `start()` runs the server in a daemon thread.
    """

    def __init__(
        self,
        root: Path | str | Sequence[Path | str],
        *,
        branches: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        cdn_host: str | None = None,
    ) -> None:
        roots = [root] if isinstance(root, str | os.PathLike) else list(root)
        infos = [load_repo_info(Path(r)) for r in roots]
        if not infos:
            raise ValueError("StandinHub needs at least one built root")
        if len({i.repo_id for i in infos}) > 1:
            raise ValueError(f"all roots must hold the same repo, not {sorted({i.repo_id for i in infos})}")
        if len({i.commit for i in infos}) < len(infos):
            raise ValueError("two roots hold the same commit")
        self.repo_id = infos[0].repo_id
        self.infos: dict[str, RepoInfo] = {i.commit: i for i in infos}
        self._index = {commit: n for n, commit in enumerate(self.infos)}
        self._last_changed = _last_changed(infos)
        self._lock = threading.Lock()
        self._branches: dict[str, str] = {DEFAULT_BRANCH: infos[0].commit}
        for name, commit in (branches or {}).items():
            self.move_branch(name, commit)
        self.token = token
        self.page_size = page_size
        self.cdn_host = cdn_host
        self.faults = Faults()
        self.log = RequestLog()
        self._server = _HubServer((host, port), self)
        self._thread: threading.Thread | None = None

    # --- commits and branches ---------------------------------------------------------------------------

    @property
    def commits(self) -> tuple[str, ...]:
        """The served commits, oldest first."""
        return tuple(self.infos)

    @property
    def info(self) -> RepoInfo:
        """The commit `main` resolves to now (with one root: the only one)."""
        return self.infos[self.branches()[DEFAULT_BRANCH]]

    def branches(self) -> dict[str, str]:
        with self._lock:
            return dict(self._branches)

    def move_branch(self, name: str, commit: str) -> None:
        """Point branch `name` (created if new) at a served commit, as a push to the real repo would."""
        name = branch_name(str(name))
        if not _BRANCH.fullmatch(name) or _COMMIT.fullmatch(name):
            raise ValueError(f"bad branch name {name!r}")
        if commit not in self.infos:
            raise ValueError(f"{commit!r} is not a served commit (served: {', '.join(self.infos)})")
        with self._lock:
            self._branches[name] = commit

    def resolve(self, revision: str) -> RepoInfo | None:
        """The served commit a revision names (a served sha or a branch), None if it names none."""
        if revision in self.infos:
            return self.infos[revision]
        commit = self.branches().get(branch_name(revision))
        return None if commit is None else self.infos[commit]

    def commit_index(self, commit: str) -> int:
        return self._index[commit]

    def last_changed(self, commit: str, path: str) -> str:
        """The commit, at or before `commit`, that last changed `path` (a file, or anything under a directory)."""
        changed = self._last_changed[commit]
        if path in changed:
            return changed[path]
        prefix = path + "/"
        under = [c for p, c in changed.items() if p.startswith(prefix)]
        return max(under, key=self.commit_index, default=commit)

    def by_sha256(self, sha256: str) -> tuple[RepoInfo, RepoFile] | None:
        for info in self.infos.values():
            file = info.by_sha256(sha256)
            if file is not None:
                return info, file
        return None

    def health(self) -> dict[str, Any]:
        branches = self.branches()
        return {
            "ok": True,
            "repo_id": self.repo_id,
            "commit": branches[DEFAULT_BRANCH],
            "commits": list(self.infos),
            "branches": branches,
        }

    # --- server -----------------------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> StandinHub:
        self._thread = threading.Thread(target=self.serve_forever, name="standin-hub", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever(poll_interval=0.05)

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> StandinHub:
        return self.start()

    def __exit__(self, exc: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


class _HubServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], hub: StandinHub) -> None:
        self.hub = hub
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client's connection pool expects
    server_version = "standin-hub/1"
    _entry: LogEntry | None = None

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: the request log (`GET /_standin/log`) is the record."""

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    @property
    def hub(self) -> StandinHub:
        return cast(_HubServer, self.server).hub

    # --- dispatch -------------------------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        body = self._read_body()
        self._entry = None  # a kept-alive connection must not update the previous request's entry
        try:
            if url.path.startswith("/_standin/") and not url.path.startswith("/_standin/cdn/"):
                self._control(method, url.path, url.query, body)
                return
            self._entry = self.hub.log.open(method, url.path, url.query, self._lower_headers())
            try:
                self._serve(method, url.path, url.query, body)
            except HubError as error:
                self._send_error(error)
        except (BrokenPipeError, ConnectionResetError):
            # The client hung up mid-answer; nothing left to tell it.
            self.close_connection = True
            if self._entry is not None:
                self._entry.note = "client disconnected"

    def _serve(self, method: str, path: str, query: str, body: bytes) -> None:
        status = self.hub.faults.take_failure(method, path)
        if status == 200:
            # A "200" fault is what a captive portal or a misrouted proxy sends: a page, not JSON.
            self._send_page(b"<html><body>Please log in to the network</body></html>")
            return
        if status is not None:
            headers = {"Retry-After": "30"} if status == 429 else {}
            raise HubError(status, f"injected fault: HTTP {status}", headers=headers)
        if path.startswith("/_standin/cdn/"):
            self._cdn(method, path)
            return
        self._check_token()
        segments = path.split("/")[1:]
        if segments[0] == "api":
            self._api(method, segments[1:], query, body)
        elif len(segments) >= 5 and segments[2] == "resolve":
            self._resolve(method, segments)
        elif segments[0] in ("datasets", "spaces") and len(segments) >= 5 and segments[3] == "resolve":
            raise HubError(404, "Repository not found", "RepoNotFound")
        else:
            raise HubError(404, "Not Found")

    def _lower_headers(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.headers.items()}

    def _read_body(self) -> bytes:
        # Read any body even when unused: the connection is kept alive for the next request.
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _check_token(self) -> None:
        expected = self.hub.token
        if expected is None:
            return
        given = self.headers.get("Authorization")
        if given is None:
            # What the Hub answers for a private repo without credentials: indistinguishable from "no such repo".
            raise HubError(401, "Invalid username or password.", "RepoNotFound")
        if not hmac.compare_digest(given.encode(), f"Bearer {expected}".encode()):
            raise HubError(401, BAD_TOKEN_MESSAGE)

    # --- API ------------------------------------------------------------------------------------------------

    def _api(self, method: str, segments: list[str], query: str, body: bytes) -> None:
        if len(segments) < 3:
            raise HubError(404, "Not Found")
        kind, repo_id, rest = segments[0], f"{unquote(segments[1])}/{unquote(segments[2])}", segments[3:]
        if kind != "models" or repo_id != self.hub.repo_id:
            raise HubError(404, "Repository not found", "RepoNotFound")
        params = parse_qs(query)
        handlers: dict[tuple[str, str], Callable[[], None]] = {
            ("GET", ""): lambda: self._model_info(DEFAULT_BRANCH, params),
            ("GET", "revision"): lambda: self._model_info(unquote(rest[1]), params),
            ("GET", "tree"): lambda: self._tree(unquote(rest[1]), "/".join(unquote(s) for s in rest[2:]), params),
            ("POST", "paths-info"): lambda: self._paths_info(unquote(rest[1]), body),
        }
        action = rest[0] if rest else ""
        if (method, action) not in handlers or (action and len(rest) < 2):
            raise HubError(404, "Not Found")
        handlers[(method, action)]()

    def _commit_of(self, revision: str) -> RepoInfo:
        info = self.hub.resolve(revision)
        if info is None:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        if self._entry is not None:
            self._entry.commit = info.commit
        return info

    def _model_info(self, revision: str, params: dict[str, list[str]]) -> None:
        hub = self.hub
        info = self._commit_of(revision)
        blobs = params.get("blobs", ["false"])[0].lower() == "true"
        self._send_json(
            {
                "_id": hub.commits[0][:24],  # the repo's id: the same at every revision
                "id": info.repo_id,
                "modelId": info.repo_id,
                "author": info.repo_id.split("/")[0],
                "sha": info.commit,
                "lastModified": commit_date(hub.commit_index(info.commit)),
                "createdAt": commit_date(0),
                "private": self.hub.token is not None,
                "disabled": False,
                "gated": False,
                "downloads": 0,
                "likes": 0,
                "library_name": "transformers",
                "tags": ["safetensors", "deepseek_v4", "test-standin"],
                "pipeline_tag": "text-generation",
                "siblings": [_sibling(f, blobs) for f in info.files],
                "spaces": [],
                "usedStorage": info.total_size(),
            }
        )

    def _tree(self, revision: str, path: str, params: dict[str, list[str]]) -> None:
        info = self._commit_of(revision)
        recursive = params.get("recursive", ["false"])[0].lower() == "true"
        expand = params.get("expand", ["false"])[0].lower() == "true"
        entries = _tree_entries(info, path.strip("/"), recursive=recursive)
        cursor = int(params.get("cursor", ["0"])[0] or 0)
        size = min(self.hub.page_size, EXPAND_PAGE_SIZE) if expand else self.hub.page_size
        page = entries[cursor : cursor + size]
        headers = {}
        if cursor + size < len(entries):
            next_query = urlencode(
                {"recursive": str(recursive).lower(), "expand": str(expand).lower(), "cursor": cursor + size}
            )
            headers["Link"] = f'<http://{self._host()}{self.path.split("?")[0]}?{next_query}>; rel="next"'
        self._send_json([self._entry_json(info, e, expand) for e in page], headers)

    def _entry_json(self, info: RepoInfo, path: str, expand: bool) -> dict[str, Any]:
        entry = _entry_json(info, path)
        if expand:
            changed = self.hub.last_changed(info.commit, path)
            date = commit_date(self.hub.commit_index(changed))
            entry["lastCommit"] = {"id": changed, "title": COMMIT_TITLE, "date": date}
        return entry

    def _paths_info(self, revision: str, body: bytes) -> None:
        info = self._commit_of(revision)
        if (self.headers.get("Content-Type") or "").startswith("application/json"):
            data = json.loads(body or b"{}")
            paths, expand = [str(p) for p in data.get("paths", [])], bool(data.get("expand", False))
        else:
            form = parse_qs(body.decode())
            paths, expand = form.get("paths", []), form.get("expand", ["false"])[0].lower() == "true"
        known = set(_all_entries(info))
        found = [p.strip("/") for p in paths if p.strip("/") in known]
        self._send_json([self._entry_json(info, p, expand) for p in found])

    def _host(self) -> str:
        return self.headers.get("Host") or f"{self.hub.host}:{self.hub.port}"

    # --- files ----------------------------------------------------------------------------------------------

    def _resolve(self, method: str, segments: list[str]) -> None:
        repo_id = f"{unquote(segments[0])}/{unquote(segments[1])}"
        if repo_id != self.hub.repo_id:
            raise HubError(404, "Repository not found", "RepoNotFound")
        if method not in ("GET", "HEAD"):
            raise HubError(405, "Method Not Allowed")
        info = self._commit_of(unquote(segments[3]))
        commit = info.commit
        path = "/".join(unquote(s) for s in segments[4:])
        file = info.file(path)
        if file is None:
            raise HubError(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": commit})
        if file.lfs and self.hub.cdn_host is not None:
            self._redirect_to_cdn(file, commit)
            return
        self._send_file(method, info, file, {"X-Repo-Commit": commit, **_file_headers(file)})

    def _redirect_to_cdn(self, file: RepoFile, commit: str) -> None:
        # The real Hub answers LFS files with a 302 to another host; its metadata rides on the 302 itself.
        location = (
            f"http://{self.hub.cdn_host}:{self.hub.port}/_standin/cdn/{file.sha256}?{urlencode({'name': file.path})}"
        )
        self._send_head(
            302, {"Location": location, "X-Repo-Commit": commit, "Content-Length": "0", **_file_headers(file)}
        )

    def _cdn(self, method: str, path: str) -> None:
        found = self.hub.by_sha256(path.rsplit("/", 1)[-1])
        if found is None or method not in ("GET", "HEAD"):
            raise HubError(404, "Not Found")
        info, file = found
        self._send_file(method, info, file, {"ETag": f'"{file.sha256}"'})

    def _send_file(self, method: str, info: RepoInfo, file: RepoFile, headers: dict[str, str]) -> None:
        if self._entry is not None:
            self._entry.file = file.path
        try:
            ranged = method == "GET" and not self.hub.faults.ignore_ranges
            span = parse_range(self.headers.get("Range"), file.size) if ranged else None
        except UnsatisfiableRangeError:
            raise HubError(416, "Range Not Satisfiable", None, {"Content-Range": f"bytes */{file.size}"}) from None
        start, end = span if span is not None else (0, file.size - 1)
        length = end - start + 1
        headers = {**headers, "Content-Length": str(length), "Accept-Ranges": "bytes"}
        headers["Content-Type"] = "application/octet-stream"
        name = file.path.rsplit("/", 1)[-1]
        headers["Content-Disposition"] = f"inline; filename*=UTF-8''{quote(name)}; filename=\"{name}\";"
        if span is not None:
            headers["Content-Range"] = f"bytes {start}-{end}/{file.size}"
        self._send_head(206 if span is not None else 200, headers)
        if method == "GET" and length > 0:
            self._stream(info.local_path(file), start, length, self.hub.faults.take_cut(file.path))

    def _stream(self, local: Path, start: int, length: int, cut: int | None) -> None:
        """Send the byte span with sendfile, pacing to the rate cap and stopping at an injected cut."""
        limit = length if cut is None else min(cut, length)
        rate = self.hub.faults.rate_bps
        step = SEND_STEP if rate is None else max(1, min(SEND_STEP, rate // 20))
        began, sent = time.monotonic(), 0
        with local.open("rb") as stream:
            while sent < limit:
                count = self._counted_send(stream, start + sent, min(step, limit - sent), sent)
                if count == 0:
                    break
                sent += count
                if rate is not None:
                    time.sleep(max(0.0, sent / rate - (time.monotonic() - began)))
        if sent < length:
            self._cut_connection()

    def _counted_send(self, stream: BinaryIO, offset: int, count: int, sent_before: int) -> int:
        if self._entry is None:
            return int(self.connection.sendfile(stream, offset, count))
        with self._entry.sending:
            count = int(self.connection.sendfile(stream, offset, count))
            self._entry.bytes_sent = sent_before + count
        return count

    def _cut_connection(self) -> None:
        # Close without finishing the body, so the client sees a short read (h11: "peer closed connection …").
        self.close_connection = True
        if self._entry is not None:
            self._entry.note = "cut"
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    # --- answers --------------------------------------------------------------------------------------------

    def _send_head(self, status: int, headers: dict[str, str]) -> None:
        if self._entry is not None:
            self._entry.status = status
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def _send_json(self, document: Any, headers: dict[str, str] | None = None, status: int = 200) -> None:
        payload = json.dumps(document).encode()
        all_headers = {"Content-Type": "application/json; charset=utf-8", "Content-Length": str(len(payload))}
        self._send_head(status, {**all_headers, **(headers or {})})
        if self.command == "HEAD":
            return
        if self._entry is None:
            self.wfile.write(payload)
            return
        with self._entry.sending:
            self.wfile.write(payload)
            self._entry.bytes_sent = len(payload)

    def _send_page(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_error(self, error: HubError) -> None:
        headers = {"X-Error-Message": error.message, **error.headers}
        if error.code is not None:
            headers["X-Error-Code"] = error.code
        self._send_json({"error": error.message}, headers, error.status)

    # --- test controls --------------------------------------------------------------------------------------

    def _control(self, method: str, path: str, query: str, body: bytes) -> None:
        try:
            answer = self._control_answer(method, path.rstrip("/"), query, body)
        except (ValueError, KeyError, TypeError) as error:
            self._send_json({"error": f"bad control request: {error}"}, status=400)
            return
        if answer is None:
            self._send_json({"error": f"no control route {method} {path}"}, status=404)
        else:
            self._send_json(answer)

    def _control_answer(self, method: str, path: str, query: str, body: bytes) -> Any:
        hub = self.hub
        if (method, path) == ("GET", "/_standin/health"):
            return hub.health()
        if path == "/_standin/branches" and method in ("GET", "POST"):
            if method == "POST":
                moves = json.loads(body or b"{}")
                if not isinstance(moves, dict):
                    raise TypeError('expected {"BRANCH": "COMMIT", ...}')
                for name, commit in moves.items():
                    hub.move_branch(str(name), str(commit))
            return hub.branches()
        if path == "/_standin/log" and method in ("GET", "DELETE"):
            if method == "DELETE":
                hub.log.clear()
            return hub.log.entries(int(parse_qs(query).get("since", ["0"])[0]))
        if path == "/_standin/faults" and method in ("GET", "POST", "DELETE"):
            if method == "POST":
                hub.faults.update_from_json(json.loads(body or b"{}"))
            elif method == "DELETE":
                hub.faults.clear()
            return hub.faults.to_json()
        return None


def _file_headers(file: RepoFile) -> dict[str, str]:
    headers = {"ETag": f'"{file.etag}"'}
    if file.lfs:
        headers["X-Linked-Etag"] = f'"{file.sha256}"'
        headers["X-Linked-Size"] = str(file.size)
    return headers


def _sibling(file: RepoFile, blobs: bool) -> dict[str, Any]:
    sibling: dict[str, Any] = {"rfilename": file.path}
    if blobs:
        sibling.update(size=file.size, blobId=file.blob_id)
        if file.lfs:
            sibling["lfs"] = {"size": file.size, "sha256": file.sha256, "pointerSize": file.pointer_size}
    return sibling


def _all_entries(info: RepoInfo) -> list[str]:
    return sorted([*info.directories(), *(f.path for f in info.files)])


def _tree_entries(info: RepoInfo, path: str, *, recursive: bool) -> list[str]:
    if path and path not in info.directories():
        raise HubError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": info.commit})
    prefix = f"{path}/" if path else ""
    under = [e for e in _all_entries(info) if e.startswith(prefix)]
    return under if recursive else [e for e in under if "/" not in e[len(prefix) :]]


def _entry_json(info: RepoInfo, path: str) -> dict[str, Any]:
    file = info.file(path)
    entry: dict[str, Any]
    if file is None:
        entry = {"type": "directory", "oid": tree_id(info, path), "size": 0, "path": path}
    else:
        entry = {"type": "file", "oid": file.blob_id, "size": file.size, "path": path}
        if file.lfs:
            entry["lfs"] = {"oid": file.sha256, "size": file.size, "pointerSize": file.pointer_size}
    return entry


def _last_changed(infos: list[RepoInfo]) -> dict[str, dict[str, str]]:
    """commit -> file path -> the commit (that one or an earlier one) whose content the file still has."""
    result: dict[str, dict[str, str]] = {}
    before: dict[str, tuple[str, str, str]] = {}  # path -> (blob id, sha256, commit that wrote it)
    for info in infos:
        now: dict[str, tuple[str, str, str]] = {}
        for f in info.files:
            seen = before.get(f.path)
            same = seen is not None and seen[:2] == (f.blob_id, f.sha256)
            now[f.path] = (f.blob_id, f.sha256, seen[2] if seen is not None and same else info.commit)
        result[info.commit] = {path: entry[2] for path, entry in now.items()}
        before = now
    return result
