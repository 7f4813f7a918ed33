"""Common configuration of every facts model, the bounds of a kernel's counts, and the one
reading of an optional text field."""

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

# A count a node's kernel reports (a file's or a disk's bytes, memory in KiB): 64 bits, never
# negative. A larger one is no observation, and shown as a size it would not fit a float.
MAX_KERNEL_COUNT = 2**63 - 1
KernelCount = Annotated[int, Field(ge=0, le=MAX_KERNEL_COUNT)]
# Free disk space as the probe computed it: a failed computation can make it negative, which is
# kept (and shown as unknown), but it is still a signed 64-bit number.
SignedKernelCount = Annotated[int, Field(ge=-MAX_KERNEL_COUNT - 1, le=MAX_KERNEL_COUNT)]


class FactsModel(BaseModel):
    """Strict so that a typo in a hand-written fixture fails loudly instead of meaning 'absent'."""

    # defer_build: a model's own validator is built when it is first used. Loading facts
    # validates the top-level model, whose schema holds every part's, so most parts never need
    # their own (about 10 ms of `plan --facts` start-up).
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    # List defaults are `lambda: []`, not `list`: pydantic reads a factory's signature, and a
    # builtin's is parsed from its text, which costs start-up (5 ms for the first one).


def text_or_none(value: object) -> str | None:
    """A field of untrusted JSON that should be text: anything else counts as absent."""
    return value if isinstance(value, str) else None
