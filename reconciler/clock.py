"""Wall-clock timestamps as the program writes them: always UTC, in one of two forms.

Status files, facts snapshots, intent records and bench reports carry ISO 8601 with a Z, so a
reader on any machine compares them without knowing the writer's time zone. Backup file names
carry a compact form that sorts by time and holds no colon (which some tools treat specially
in file names).
"""

from __future__ import annotations

import time

ISO_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
STAMP_FORMAT = "%Y%m%d-%H%M%S"


def utc_iso(seconds: float | None = None) -> str:
    """'2025-01-31T12:00:00Z' for `seconds` since the epoch (now when None)."""
    return time.strftime(ISO_FORMAT, time.gmtime(seconds))


def utc_stamp(seconds: float | None = None) -> str:
    """'20250131-120000' for `seconds` since the epoch (now when None), for file names."""
    return time.strftime(STAMP_FORMAT, time.gmtime(seconds))


def parse_utc_iso(text: str | None) -> float | None:
    """Seconds since the epoch of a `utc_iso` timestamp; None for anything else (a file edited
    by hand, 'unknown')."""
    import calendar

    if not text:
        return None
    try:
        return float(calendar.timegm(time.strptime(text, ISO_FORMAT)))
    except (ValueError, OverflowError):
        return None
