"""Memory facts: the unified CPU/GPU pool of a Spark, read from /proc/meminfo.

`nvidia-smi` reports "Not Supported" for memory on GB10, so MemAvailable is the only
honest figure. Also the memory guard's state, because a guard trip is about memory.
"""

from __future__ import annotations

from pydantic import Field

from reconciler.facts.base import FactsModel, KernelCount

KIB_PER_GIB = 1024 * 1024


class MemoryFacts(FactsModel):
    total_kib: KernelCount
    available_kib: KernelCount

    @property
    def available_gib(self) -> float:
        return self.available_kib / KIB_PER_GIB


class GuardTrip(FactsModel):
    """A recorded guard trip: it holds the rank group until the spec changes or `start`."""

    at: str
    mem_available_gib: float
    floor_gib: float
    killed: list[str] = Field(default_factory=lambda: [])


class GuardFacts(FactsModel):
    running: bool = False
    config_hash: str | None = None
    trip: GuardTrip | None = None


def parse_meminfo(text: str) -> MemoryFacts:
    """Parse /proc/meminfo; values are in kB (KiB) as the kernel prints them."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            values[name.strip()] = int(fields[0])
    return MemoryFacts(total_kib=values["MemTotal"], available_kib=values["MemAvailable"])
