"""Common configuration of every facts model, and the one reading of a text in a raw answer."""

from pydantic import BaseModel, ConfigDict


class FactsModel(BaseModel):
    """Strict so that a typo in a hand-written fixture fails loudly instead of meaning 'absent'."""

    # defer_build: a model's own validator is built when it is first used. Loading facts
    # validates the top-level model, whose schema holds every part's, so most parts never need
    # their own (about 10 ms of `plan --facts` start-up).
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    # List defaults are `lambda: []`, not `list`: pydantic reads a factory's signature, and a
    # builtin's is parsed from its text, which costs start-up (5 ms for the first one).


def text_or_none(value: object) -> str | None:
    """A raw answer's text; anything else (absent, a number, a list) is no text."""
    return value if isinstance(value, str) else None
