"""CLI: python3 -m tests.testbed.realengine {prepare,up} (as root, from the repository root).

prepare: the vLLM CPU venv, the tiny model checkpoint and the tb/vllm layers (no testbed).
up: `prepare`, then the testbed with the tiny-model Hub on :5081 and tb/vllm in the registry.
"""

from __future__ import annotations

import argparse
import sys

from tests.testbed.config import TestbedError
from tests.testbed.realengine import lane
from tests.testbed.testbed import Testbed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tests.testbed.realengine", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("prepare", "up"))
    args = parser.parse_args(argv)
    testbed = Testbed()
    if args.command == "prepare":
        lane.prepare(testbed.layout)
    else:
        print(lane.up(testbed))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except TestbedError as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        sys.exit(1)
