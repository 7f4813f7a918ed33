"""The spec a run converges on this testbed: a tracked testbed spec made to fit the testbed that is up.
(api.front_image, when the spec names one, becomes the front image the testbed built.)

specs/testbed.yaml and specs/testbed-vllm.yaml name an engine image of some earlier build and
the SSH key and known_hosts of the default $TB_ROOT. What a run hands the reconciler is a copy
with the image the registry holds now and the key and known_hosts of this $TB_ROOT, so that
another TB_ROOT works, written outside the checkout: the tracked files are never rewritten.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.testbed.config import Layout, TestbedError

_IMAGE_REF = re.compile(r"(?m)^(  ref:) .*$")
_IDENTITY_FILE = re.compile(r"(?m)^(\s+identity_file:) .*$")
_KNOWN_HOSTS = re.compile(r"(?m)^(\s+known_hosts:) .*$")
_FRONT_IMAGE = re.compile(r"(?m)^(  front_image:) \S+")


def render(text: str, layout: Layout, image: str) -> str:
    """`text` with image.ref set to `image` and every node's identity_file and known_hosts set
    to this testbed's; refuses a spec without an image ref or without an SSH node."""
    text, images = _IMAGE_REF.subn(lambda match: f"{match[1]} {image}", text)
    text, keys = _IDENTITY_FILE.subn(lambda match: f"{match[1]} {layout.client_key}", text)
    text, hosts = _KNOWN_HOSTS.subn(lambda match: f"{match[1]} {layout.known_hosts}", text)
    front = _front_image(layout)
    if front is not None:
        text = _FRONT_IMAGE.sub(lambda match: f"{match[1]} {front}", text)
    if images != 1 or keys == 0 or keys != hosts:
        raise TestbedError(
            f"a testbed spec needs one image ref and an identity_file and known_hosts per SSH node "
            f"(found {images}, {keys}, {hosts})"
        )
    return text


def _front_image(layout: Layout) -> str | None:
    """The front image the testbed built (api.front_image), once it is up."""
    try:
        ref = json.loads(layout.images_json.read_text(encoding="utf-8")).get("front")
    except (OSError, ValueError):
        return None
    return ref if isinstance(ref, str) else None


def write(source: Path, target: Path, layout: Layout, image: str, extra: str = "") -> Path:
    """Render `source` (plus `extra` YAML at its end) into `target`, which must not be `source`."""
    if target.resolve() == source.resolve():
        raise TestbedError(f"refusing to rewrite the tracked spec {source}: write the rendered one elsewhere")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(source.read_text(encoding="utf-8"), layout, image) + extra, encoding="utf-8")
    return target
