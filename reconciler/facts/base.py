"""Common configuration of every facts model."""

from pydantic import BaseModel, ConfigDict


class FactsModel(BaseModel):
    """Strict so that a typo in a hand-written fixture fails loudly instead of meaning 'absent'."""

    model_config = ConfigDict(extra="forbid", frozen=True)
