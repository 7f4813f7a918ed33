"""Runs ON a worker whose model_source is hub (stdlib only): fetch listed files from the Hub.

The head resolves the revision and lists the files with the real huggingface_hub client and
sends this program the exact list (path, size, etag, sha256) plus the token (inside the
program text on stdin: never in argv). Each file is fetched with HTTP Range into
`<file>.<etag>.partial`, so a killed run resumes from the bytes it has; an LFS file is
checked against its sha256 before it is renamed into place. Files already complete (same
size) are skipped; nothing is ever deleted but this program's own stale partials.
"""

from __future__ import annotations

import hashlib
import os
import urllib.parse
import urllib.request
from http.client import HTTPMessage
from typing import IO, Any

from reconciler.nodeside.common import (
    CHUNK,
    MIN_RATE_BPS,
    RATE_WINDOW_S,
    Meter,
    RateFloor,
    content_range_fits,
    partial_size,
    progress,
    refused_redirect,
    reply,
    url_origin,
    url_where,
)

# A worker follows at most this many redirects per request (the Hub sends one, to its CDN).
MAX_REDIRECTS = 5
# A file cut for slowness this many times in a row, each time without a window's worth of bytes
# gained, fails the fetch.
SLOW_RETRIES = 5


def _url(args: dict[str, Any], path: str) -> str:
    quoted = urllib.parse.quote(path)
    return f"{args['endpoint'].rstrip('/')}/{args['repo']}/resolve/{args['commit']}/{quoted}"


def redirect_refusal(current: str, new: str) -> str | None:
    """Why a redirect from `current` to `new` is not followed; None when it may be."""
    return refused_redirect(current, new, "Check model.endpoint (a proxy may rewrite the Hub's redirects)")


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follows a few redirects, never from https to http, and the token only within its origin:
    the Hub redirects to a CDN that needs no token and must not get one."""

    def redirect_request(
        self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str, headers: HTTPMessage, newurl: str
    ) -> urllib.request.Request | None:
        refusal = redirect_refusal(req.full_url, newurl)
        if refusal is not None:
            raise SystemExit(refusal)
        if sum(getattr(req, "redirect_dict", {}).values()) >= MAX_REDIRECTS:
            raise SystemExit(f"{url_where(req.full_url)} redirected the download more than {MAX_REDIRECTS} times")
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and url_origin(newurl) != url_origin(req.full_url):
            new.remove_header("Authorization")
        return new


_OPENER = urllib.request.build_opener(_Redirects)


def _request(args: dict[str, Any], path: str, start: int) -> Any:
    headers = {"Accept-Encoding": "identity", "User-Agent": "spark-reconciler/worker-fetch"}
    if args.get("token"):
        headers["Authorization"] = f"Bearer {args['token']}"
    if start:
        headers["Range"] = f"bytes={start}-"
    return _OPENER.open(urllib.request.Request(_url(args, path), headers=headers), timeout=60)


def _partial_path(target: str, etag: str) -> str:
    return f"{target}.{etag[:16]}.partial"


def _drop_stale_partials(target: str, keep: str) -> None:
    directory, name = os.path.split(target)
    for entry in os.listdir(directory):
        if entry.startswith(name + ".") and entry.endswith(".partial") and os.path.join(directory, entry) != keep:
            os.unlink(os.path.join(directory, entry))


class _TooSlowError(Exception):
    """The answer stayed under the floor rate for a whole window: cut, to be resumed."""


def _download(args: dict[str, Any], item: dict[str, Any], target: str, meter: Meter) -> None:
    """The file into its partial, resumed from the bytes there, again after a cut for slowness."""
    partial = _partial_path(target, item["etag"])
    _drop_stale_partials(target, partial)
    floor = float(args.get("min_rate_bps", MIN_RATE_BPS))
    window = float(args.get("rate_window_s", RATE_WINDOW_S))
    counted = failures = 0
    while True:
        have = partial_size(partial)
        if have == item["size"]:  # all in (a run killed before the rename): checked, then placed
            meter.add(have - counted, name=item["path"])
            return
        if have and not counted:
            progress(f"resuming {item['path']} at byte {have} of {item['size']}")
        try:
            _fetch_rest(
                args, item, partial, have if have < item["size"] else 0, counted, meter, RateFloor(floor, window)
            )
            return
        except _TooSlowError:
            counted = partial_size(partial)
            failures = 0 if counted - have >= floor * window else failures + 1
            if failures > int(args.get("slow_retries", SLOW_RETRIES)):
                raise SystemExit(
                    f"{item['path']}: the Hub sent it at under {floor:.0f} bytes/s for {window:.0f} s, {failures} "
                    "times in a row; the network or the Hub is slow: run apply again later (it resumes)"
                ) from None
            progress(f"{item['path']}: under {floor:.0f} bytes/s for {window:.0f} s: asking again from byte {counted}")


def _fetch_rest(
    args: dict[str, Any], item: dict[str, Any], partial: str, start: int, counted: int, meter: Meter, rate: RateFloor
) -> None:
    """One request for the file from byte `start`; `counted` of its bytes are in the meter already."""
    with _request(args, item["path"], start) as response:
        # A 200 to a Range request means the server ignored it: start the file again.
        resume = bool(start) and response.status == 206
        if response.status == 206:
            _check_content_range(item, response.headers.get("Content-Range"), start)
        begin = start if resume else 0
        meter.add(begin - counted, name=item["path"])
        flags = os.O_WRONLY | os.O_NOFOLLOW | (os.O_APPEND if resume else os.O_CREAT | os.O_TRUNC)
        if not begin and not os.path.lexists(partial):
            flags |= os.O_CREAT | os.O_EXCL  # new: created here, never an existing file or link
        with os.fdopen(os.open(partial, flags, 0o644), "ab" if resume else "wb") as out:
            _copy(response, out, item, begin, meter, rate)


def _check_content_range(item: dict[str, Any], header: str | None, start: int) -> None:
    """A 206 must hold the bytes from `start` of a file of the listed size, or it is not appended."""
    if content_range_fits(header, start, item["size"]):
        return
    raise SystemExit(
        f"{item['path']}: asked from byte {start}, the Hub answered Content-Range {header!r:.80} (the file is "
        f"{item['size']} bytes); nothing was written. Run apply again; if it persists, a proxy mangles ranges"
    )


def _copy(response: Any, out: IO[bytes], item: dict[str, Any], begin: int, meter: Meter, rate: RateFloor) -> None:
    """The answer into the partial, which holds `begin` bytes: never past the file's size."""
    expected = item["size"] - begin
    length = response.headers.get("Content-Length")
    if length is not None and length.strip().isdigit() and int(length) > expected:
        raise SystemExit(_too_long(item, begin, f"announced {int(length)} bytes"))
    left = expected
    while left and (block := response.read1(min(CHUNK, left))):
        out.write(block)
        left -= len(block)
        meter.add(len(block), name=item["path"])
        if rate.too_slow(len(block)):
            raise _TooSlowError
    if not left and response.read1(1):
        out.truncate(begin)  # the answer is not the file: none of it stays
        raise SystemExit(_too_long(item, begin, "sent more"))


def _too_long(item: dict[str, Any], begin: int, what: str) -> str:
    return (
        f"{item['path']}: asked from byte {begin} for the {item['size'] - begin} bytes left, the Hub {what}; "
        "nothing of that answer was kept. Run apply again; if it persists, check model.endpoint (a proxy may "
        "answer instead of the Hub)"
    )


def _check_and_place(item: dict[str, Any], target: str) -> None:
    partial = _partial_path(target, item["etag"])
    if os.path.getsize(partial) != item["size"]:
        raise SystemExit(f"{item['path']}: got {os.path.getsize(partial)} bytes, expected {item['size']}")
    if item.get("sha256"):
        digest = hashlib.sha256()
        with open(partial, "rb") as handle:
            while block := handle.read(CHUNK):
                digest.update(block)
        if digest.hexdigest() != item["sha256"]:
            os.unlink(partial)
            raise SystemExit(f"{item['path']}: sha256 mismatch after download; run apply again")
    os.replace(partial, target)


def _complete(target: str, item: dict[str, Any]) -> bool:
    return os.path.exists(target) and os.path.getsize(target) == item["size"] and not item.get("force")


def fetch(args: dict[str, Any]) -> None:
    root = os.path.expanduser(args["model_dir"])
    wanted = []
    for item in args["files"]:
        target = os.path.join(root, item["path"])
        if not os.path.realpath(target).startswith(os.path.realpath(root) + os.sep):
            raise SystemExit(f"refusing {item['path']!r}: it would land outside {root}")
        if not _complete(target, item):
            wanted.append((item, target))
    meter = Meter("download", sum(item["size"] for item, _ in wanted), len(wanted))
    fetched = []
    for item, target in wanted:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        _download(args, item, target, meter)
        _check_and_place(item, target)
        meter.file_done()
        fetched.append(item["path"])
    reply({"fetched": fetched})
