"""Memory facts: the unified CPU/GPU pool of a Spark, read from /proc/meminfo.

`nvidia-smi` reports "Not Supported" for memory on GB10, so MemAvailable is the only
honest figure. Also the memory guard's state, because a guard trip is about memory.
"""

from __future__ import annotations

from typing import Annotated

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


class MemoryWindow(FactsModel):
    """One window of the guard's memory record: when it ended, its lowest MemAvailable, and the
    config hashes of the ranks that ran through all of it (none: it saw a restart, or no rank)."""

    at: int
    low_kib: KernelCount
    ranks: list[Annotated[str, Field(max_length=128)]] = Field(default_factory=lambda: [], max_length=16)

    @property
    def low_gib(self) -> float:
        return self.low_kib / KIB_PER_GIB


class GuardFacts(FactsModel):
    running: bool = False
    config_hash: str | None = None
    trip: GuardTrip | None = None
    # The memory record (oldest first) and how long each window is.
    windows: list[MemoryWindow] = Field(default_factory=lambda: [])
    window_s: float | None = None


# A record holds at most this many windows; more in a file is no record the guard wrote.
MAX_WINDOWS = 240
# A window the guard could write: at most its slowest interval (60 s) times a sample count.
MAX_WINDOW_S = 3600.0


def memory_windows(raw: object) -> tuple[list[MemoryWindow], float | None]:
    """The guard's record file: its last windows that read as windows, and their length in s."""
    if not isinstance(raw, dict):
        return [], None
    entries = raw.get("windows")
    windows = []
    for entry in (entries if isinstance(entries, list) else [])[-MAX_WINDOWS:]:
        try:
            windows.append(MemoryWindow.model_validate(entry))
        except ValueError:
            continue  # one odd window leaves the record shorter, never wrong
    samples, interval = raw.get("window_samples"), raw.get("interval_s")
    if not isinstance(samples, int) or not isinstance(interval, int | float):
        return windows, None
    if not (0 < samples <= MAX_WINDOW_S / 0.1 and 0 < interval <= MAX_WINDOW_S):
        return windows, None
    window_s = float(samples * interval)
    return windows, window_s if window_s <= MAX_WINDOW_S else None


def parse_meminfo(text: str) -> MemoryFacts:
    """Parse /proc/meminfo; values are in kB (KiB) as the kernel prints them."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            values[name.strip()] = int(fields[0])
    return MemoryFacts(total_kib=values["MemTotal"], available_kib=values["MemAvailable"])
