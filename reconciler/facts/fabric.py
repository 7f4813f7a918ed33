"""Fabric facts: which interface, address and RDMA devices carry tensor-parallel traffic.

Detection from sysfs, `ip -j addr` and `rdma -j link` fills `detected`; until it runs (or
when it finds nothing) the spec's overrides are the only source.
"""

from __future__ import annotations

from pydantic import Field

from reconciler.facts.base import FactsModel


class FabricFacts(FactsModel):
    """The fabric selection detected on a node; None where nothing was found."""

    ifname: str | None = None
    ip: str | None = None
    hcas: list[str] = Field(default_factory=list)
