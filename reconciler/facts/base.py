"""Common configuration of every facts model."""

from pydantic import BaseModel, ConfigDict


class FactsModel(BaseModel):
    """Strict so that a typo in a hand-written fixture fails loudly instead of meaning 'absent'."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # List defaults are `lambda: []`, not `list`: pydantic reads a factory's signature, and a
    # builtin's is parsed from its text, which costs start-up (5 ms for the first one).
