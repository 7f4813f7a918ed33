"""Command line of the stand-in Hub (TEST STAND-IN for the Hugging Face Hub, not part of the product).

    python3 -m tests.testbed.hub build --out DIR [--shard-mib N] [--part-mib N] [--seed S] [--repo-id ID] [--tag A]
    python3 -m tests.testbed.hub build-revision --base DIR --out DIR2 [--tag B] [--shard 3]
    python3 -m tests.testbed.hub serve --root DIR [--root DIR2 ...] [--branch main=COMMIT ...]
                                       [--host 127.0.0.1] [--port 0] [--token T] [--page-size N]
                                       [--cdn-host NAME] [--fault SPEC ...]

`build-revision` writes the next commit of a built checkpoint (see `checkpoint.build_revision`). `serve` serves
one commit per `--root`, oldest first; `--branch NAME=COMMIT` points a branch at one of them (`main` defaults to
the first root's commit; `POST /_standin/branches` moves branches at run time). It prints one line
`standin-hub listening on http://HOST:PORT repo=ID commit=SHA commits=SHA[,SHA...]` (`commit` is what `main`
resolves to) once it accepts connections (so `--port 0` is usable), then serves until interrupted.
Fault SPECs: `cut:PATH:BYTES[:TIMES]`, `fail:COUNT[:STATUS[:GLOB[:METHOD]]]`, `rate:BYTES_PER_SECOND`
(see faults.py; the same rules are settable at run time through `POST /_standin/faults`).
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType

from .checkpoint import DEFAULT_TAG, REVISION_SHARD, REVISION_TAG, build_checkpoint, build_revision
from .repo import DEFAULT_REPO_ID
from .server import DEFAULT_PAGE_SIZE, StandinHub


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 -m tests.testbed.hub", description="Hugging Face Hub test stand-in")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="write a small checkpoint shaped like the real one")
    build.add_argument("--out", type=Path, required=True)
    build.add_argument("--shard-mib", type=float, default=4.0, help="MiB of data in shards 1-4 (5-6 get 1.5x)")
    build.add_argument("--part-mib", type=float, default=2.5, help="split size of shards 5 and 6")
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--repo-id", default=DEFAULT_REPO_ID)
    build.add_argument("--tag", default=DEFAULT_TAG, help="config.json's checkpoint_tag")
    revision = sub.add_parser("build-revision", help="write the next commit of a built checkpoint")
    revision.add_argument("--base", type=Path, required=True, help="the --out directory of build")
    revision.add_argument("--out", type=Path, required=True)
    revision.add_argument("--tag", default=REVISION_TAG, help="config.json's checkpoint_tag")
    revision.add_argument("--shard", type=int, default=REVISION_SHARD, help="the whole shard (1-4) to regenerate")
    serve = sub.add_parser("serve", help="serve built checkpoints (one commit each) over the Hub API")
    serve.add_argument(
        "--root", type=Path, action="append", required=True, help="an --out directory of build (repeat: oldest first)"
    )
    serve.add_argument("--branch", action="append", default=[], metavar="NAME=COMMIT", help="point a branch")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0)
    serve.add_argument("--token", help="require 'Authorization: Bearer TOKEN' on every Hub request")
    serve.add_argument("--token-file", type=Path, help="--token, read from this file (kept out of the process list)")
    serve.add_argument("--page-size", type=int, default=DEFAULT_PAGE_SIZE, help="tree entries per page")
    serve.add_argument("--cdn-host", help="redirect LFS files to this host name (same port), like the Hub's CDN")
    serve.add_argument("--fault", action="append", default=[], metavar="SPEC")
    return parser


def _build(args: argparse.Namespace) -> int:
    if args.command == "build-revision":
        info = build_revision(args.base, args.out, tag=args.tag, shard=args.shard)
    else:
        info = build_checkpoint(
            args.out,
            shard_mib=args.shard_mib,
            part_mib=args.part_mib,
            seed=args.seed,
            repo_id=args.repo_id,
            tag=args.tag,
        )
    print(f"built {info.repo_id} commit={info.commit} files={len(info.files)} bytes={info.total_size()} in {args.out}")
    return 0


def _stop_on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _branches(specs: list[str]) -> dict[str, str]:
    branches: dict[str, str] = {}
    for spec in specs:
        name, sep, commit = spec.partition("=")
        if not sep or not name or not commit:
            raise SystemExit(f"bad --branch {spec!r}: use NAME=COMMIT")
        branches[name] = commit
    return branches


def _serve(args: argparse.Namespace) -> int:
    try:
        hub = StandinHub(
            args.root,
            branches=_branches(args.branch),
            host=args.host,
            port=args.port,
            token=args.token_file.read_text(encoding="utf-8").strip() if args.token_file else args.token,
            page_size=args.page_size,
            cdn_host=args.cdn_host,
        )
    except ValueError as error:
        raise SystemExit(f"serve: {error}") from None
    for spec in args.fault:
        hub.faults.add_cli_spec(spec)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    commits = ",".join(hub.commits)
    print(
        f"standin-hub listening on {hub.url} repo={hub.repo_id} commit={hub.info.commit} commits={commits}", flush=True
    )
    try:
        hub.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        hub.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return _serve(args) if args.command == "serve" else _build(args)


if __name__ == "__main__":
    sys.exit(main())
