"""Bring-up of the real-engine lane: the testbed, plus real vLLM and a real tiny model.

TEST LANE, not part of the product. `python3 -m tests.testbed real-engine-prepare|real-engine-up`.
`prepare` needs no testbed and caches everything under
$TB_ROOT/cache (the vLLM venv, the tiny checkpoint, the tb/vllm layers); `up` brings the
two-node testbed up, serves the tiny checkpoint from a second Hub stand-in on :5081 and
pushes tb/vllm to the registry. The reconciler itself pulls the image onto the nodes.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from tests.testbed import images as img
from tests.testbed import proc, services
from tests.testbed.config import PACKAGE_DIR, REPO_ROOT, Layout, TestbedError
from tests.testbed.realengine import vllmcpu
from tests.testbed.testbed import Testbed

TINY_PORT = 5081
TINY_REPO = "tb/tiny-qwen2-spark"
TINY_SOURCES = (PACKAGE_DIR / "realengine" / "tinymodel.py", *sorted((PACKAGE_DIR / "hub").glob("*.py")))


def tiny_root(layout: Layout) -> Path:
    return layout.cache / "tiny-hub"


def _sources_hash() -> str:
    sha = hashlib.sha256()
    for src in TINY_SOURCES:
        sha.update(src.name.encode() + b"\0" + src.read_bytes())
    return sha.hexdigest()


def build_tiny_checkpoint(layout: Layout) -> Path:
    """The tiny real model in the reference repo's shape, built once by the venv's python."""
    root = tiny_root(layout)
    stamp = layout.cache / "tiny-hub.stamp"
    want = _sources_hash()
    if root.is_dir() and stamp.is_file() and stamp.read_text().strip() == want:
        return root
    venv = vllmcpu.ensure_venv(layout.cache)
    started = time.monotonic()
    argv = [str(venv / "bin" / "python"), "-m", "tests.testbed.realengine.tinymodel", "--out", str(root)]
    result = proc.run([*argv, "--repo-id", TINY_REPO], check=False, timeout=600, cwd=REPO_ROOT)
    if result.returncode != 0:
        raise TestbedError(
            f"tiny model build failed ({result.returncode}):\n{(result.stderr or result.stdout)[-3000:]}"
        )
    stamp.write_text(want + "\n")
    print(f"  tiny checkpoint built in {time.monotonic() - started:.0f} s: {root}", flush=True)
    return root


def prepare(layout: Layout) -> img.Image:
    """Everything the lane needs that no testbed is needed for; cached after the first run."""
    layout.cache.mkdir(parents=True, exist_ok=True)
    steps = proc.Steps("real-engine lane: prepare")
    with steps.step("vLLM CPU venv"):
        vllmcpu.ensure_venv(layout.cache)
    with steps.step("tiny model checkpoint"):
        build_tiny_checkpoint(layout)
    with steps.step("tb/vllm image layers"):
        image = vllmcpu.build_image(layout.cache)
    steps.total()
    return image


def up(testbed: Testbed) -> str:
    """Testbed up with the tiny-model Hub and tb/vllm in the registry; returns the image ref."""
    image = prepare(testbed.layout)
    testbed.up(nodes=2)
    steps = proc.Steps("real-engine lane: up")
    with steps.step("hub stand-in for the tiny model"):
        services.start_hub(testbed.layout, tiny_root(testbed.layout), TINY_PORT)
    with steps.step("push tb/vllm"):
        img.Registry().push(image, mount_from="tb/pybase")
    refs = {**testbed.images(), "vllm": image.ref}
    testbed.layout.images_json.write_text(json.dumps(refs, indent=2) + "\n")
    steps.total()
    print(f"  image vllm: {image.ref}", flush=True)
    return image.ref
