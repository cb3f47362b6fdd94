"""The time as run records write it: ISO 8601 in UTC."""

from __future__ import annotations

from datetime import datetime, timezone


def now(precise: bool = False) -> str:
    """The current time, ISO 8601 in UTC to the second (to the millisecond when ``precise``: runs played at once
    start and end within seconds of each other)."""
    if precise:
        return datetime.now(timezone.utc).isoformat(timespec="milliseconds")
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()
