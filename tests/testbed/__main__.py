"""CLI: python3 -m tests.testbed COMMAND (install, up, down, exec, link, image-ref, spec, rebuild-engine, ...).

Runs from the repository root with the system python3 (stdlib only), as root.
$TB_ROOT (default /tmp/testbed) holds all testbed state and caches.
`spec SOURCE` writes SOURCE (a tracked testbed spec) with the running testbed's engine digest and
this $TB_ROOT's SSH key and known_hosts to $TB_ROOT/specs/, and prints where.
`hub-commits` prints the two commits the :5080 Hub stand-in serves (`A <sha>`, `B <sha>`);
`hub-branch NAME A|B|SHA` points a branch (e.g. main) of the running stand-in at one of them.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
from pathlib import Path

from tests.testbed import services, specfile
from tests.testbed.config import HOST_IP, HUB_PORT, TestbedError, node_named
from tests.testbed.hub.control import StandinControl
from tests.testbed.install import install
from tests.testbed.realengine import lane
from tests.testbed.testbed import Testbed


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 -m tests.testbed", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help="apt-get install the missing packages (starts no service)")
    up = sub.add_parser("up", help="tear down whatever is there, then bring the testbed up")
    up.add_argument("--nodes", type=int, choices=(2, 3, 4), default=2)
    down = sub.add_parser("down", help="ordered teardown and leftover check (non-zero exit on leftovers)")
    down.add_argument("--purge", action="store_true", help="also delete caches: keys, base layer, hub build")
    run = sub.add_parser("exec", help="run CMD inside a node (exit status passed through)")
    run.add_argument("node")
    run.add_argument("cmd", nargs=argparse.REMAINDER)
    link = sub.add_parser("link", help="take one node's fabric link down or up")
    link.add_argument("node")
    link.add_argument("state", choices=("up", "down"))
    ref = sub.add_parser("image-ref", help="print an image's digest reference")
    ref.add_argument("image", choices=("pybase", "engine"))
    spec = sub.add_parser("spec", help="render a tracked testbed spec for this testbed into $TB_ROOT/specs/")
    spec.add_argument("source", type=Path)
    spec.add_argument("--image", help="the engine image ref (default: the one the running testbed pulled)")
    spec.add_argument("--where", action="store_true", help="only print where it goes; write nothing")
    sub.add_parser("rebuild-engine", help="push a new engine image from tests/testbed/engine and pull it on the nodes")
    sub.add_parser("hub-commits", help="print the Hub stand-in's commits A and B")
    branch = sub.add_parser("hub-branch", help="point a branch of the running Hub stand-in at commit A, B or a sha")
    branch.add_argument("name")
    branch.add_argument("commit")
    sub.add_parser(
        "real-engine-prepare", help="the real-engine lane's vLLM CPU venv, tiny model and tb/vllm layers (cached)"
    )
    sub.add_parser("real-engine-up", help="real-engine-prepare, then the testbed with the tiny-model Hub and tb/vllm")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    testbed = Testbed()
    if args.command == "install":
        install()
    elif args.command == "up":
        testbed.up(nodes=args.nodes)
    elif args.command == "down":
        testbed.down(purge=args.purge)
    elif args.command == "exec":
        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        if not cmd:
            raise TestbedError("usage: exec NODE CMD...")
        full = testbed.exec_argv(node_named(args.node).name, cmd)
        os.execvp(full[0], full)  # nsenter passes the command's exit status through
    elif args.command == "link":
        testbed.link(args.node, args.state == "up")
    elif args.command == "image-ref":
        print(testbed.images()[args.image])
    elif args.command == "spec":
        target = testbed.layout.specs / args.source.name
        if not args.where:
            specfile.write(args.source, target, testbed.layout, args.image or testbed.images()["engine"])
        print(target)
    elif args.command == "rebuild-engine":
        testbed.rebuild_engine()
    elif args.command == "hub-commits":
        a, b = services.hub_commits(testbed.layout)
        print(f"A {a}\nB {b}")
    elif args.command == "hub-branch":
        _move_branch(testbed, args.name, args.commit)
    elif args.command == "real-engine-prepare":
        lane.prepare(testbed.layout)
    elif args.command == "real-engine-up":
        print(lane.up(testbed))
    return 0


def _move_branch(testbed: Testbed, name: str, commit: str) -> None:
    a, b = services.hub_commits(testbed.layout)
    target = {"A": a, "B": b}.get(commit, commit)
    try:
        branches = StandinControl(f"http://{HOST_IP}:{HUB_PORT}").move_branch(name, target)
    except urllib.error.HTTPError as error:
        raise TestbedError(f"hub-branch: {error.read().decode(errors='replace')}") from None
    except OSError as error:
        raise TestbedError(f"hub-branch: the Hub stand-in on {HOST_IP}:{HUB_PORT} does not answer: {error}") from None
    print(" ".join(f"{branch}={sha}" for branch, sha in sorted(branches.items())))


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except TestbedError as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        sys.exit(1)
