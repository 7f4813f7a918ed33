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
from typing import Any

from reconciler.nodeside.common import CHUNK, Meter, progress, reply


def _url(args: dict[str, Any], path: str) -> str:
    quoted = urllib.parse.quote(path)
    return f"{args['endpoint'].rstrip('/')}/{args['repo']}/resolve/{args['commit']}/{quoted}"


def _request(args: dict[str, Any], path: str, start: int) -> Any:
    headers = {"Accept-Encoding": "identity", "User-Agent": "spark-reconciler/worker-fetch"}
    if args.get("token"):
        headers["Authorization"] = f"Bearer {args['token']}"
    if start:
        headers["Range"] = f"bytes={start}-"
    return urllib.request.urlopen(urllib.request.Request(_url(args, path), headers=headers), timeout=60)


def _partial_path(target: str, etag: str) -> str:
    return f"{target}.{etag[:16]}.partial"


def _drop_stale_partials(target: str, keep: str) -> None:
    directory, name = os.path.split(target)
    for entry in os.listdir(directory):
        if entry.startswith(name + ".") and entry.endswith(".partial") and os.path.join(directory, entry) != keep:
            os.unlink(os.path.join(directory, entry))


def _download(args: dict[str, Any], item: dict[str, Any], target: str, meter: Meter) -> int:
    partial = _partial_path(target, item["etag"])
    _drop_stale_partials(target, partial)
    have = os.path.getsize(partial) if os.path.exists(partial) else 0
    if have:
        progress(f"resuming {item['path']} at byte {have} of {item['size']}")
    with _request(args, item["path"], have) as response:
        # A 200 to a Range request means the server ignored it: start the file again.
        mode = "ab" if have and response.status == 206 else "wb"
        done = have if mode == "ab" else 0
        meter.add(done, name=item["path"])
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if mode == "ab" else os.O_TRUNC)
        with os.fdopen(os.open(partial, flags, 0o644), mode) as out:
            while block := response.read(CHUNK):
                out.write(block)
                done += len(block)
                meter.add(len(block), name=item["path"])
    return done


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
