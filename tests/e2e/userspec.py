"""What a testbed user edits by hand after `reconciler init`, shared by the init and quickstart tests.

init drafts a spec for real Sparks; on the testbed a user then points it at the Hub stand-in
(model.endpoint), the engine stand-in's image, no GPUs or --privileged (serving), the front image (api), a small memory
floor and short startup timeouts, and a state dir on /srv/spark. These helpers paste exactly
those sections from specs/testbed.yaml over the drafted ones, as a user editing the file would,
and leave everything init detected untouched.
"""

from __future__ import annotations

import re

# The sections a user of the testbed edits after init.
TESTBED_SECTIONS = ("state_dir", "model", "image", "serving", "api", "memguard", "startup")


def top_level_blocks(text: str) -> dict[str, str]:
    """Each top-level key of a spec with the indented lines under it."""
    blocks: dict[str, str] = {}
    key: str | None = None
    for line in text.splitlines(keepends=True):
        match = re.match(r"^([a-z_]+):", line)
        if match:
            key = match.group(1)
            blocks[key] = line
        elif key is not None and line.startswith(" "):
            blocks[key] += line
        else:
            key = None
    return blocks


def edited_like_a_user(drafted: str, testbed_spec: str) -> str:
    """The drafted spec with the testbed's own sections pasted in place of init's."""
    ours = top_level_blocks(drafted)
    kept = drafted
    for key in TESTBED_SECTIONS:
        if key in ours:
            kept = kept.replace(ours[key], "")
    theirs = top_level_blocks(testbed_spec)
    pasted = "".join(theirs[key].rstrip("\n") + "\n" for key in TESTBED_SECTIONS)
    return kept.rstrip("\n") + "\n\n# pasted from specs/testbed.yaml by hand:\n" + pasted
