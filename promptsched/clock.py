"""The one clock: Postgres's, unless a test pins an instant.

SQL time predicates take ``coalesce($n::timestamptz, now())``. Production passes ``None``
so Postgres decides; tests pass an instant and move it without sleeping.
"""

from __future__ import annotations

from datetime import datetime, timedelta


class Clock:
    """Production clock: defers to the database's ``now()``."""

    def sql_now(self) -> datetime | None:
        return None


class FrozenClock(Clock):
    """A clock tests move by hand."""

    def __init__(self, instant: datetime) -> None:
        if instant.tzinfo is None:
            raise ValueError("FrozenClock needs an aware datetime")
        self.instant = instant

    def sql_now(self) -> datetime | None:
        return self.instant

    def advance(self, delta: timedelta) -> None:
        self.instant += delta

    def set(self, instant: datetime) -> None:
        self.instant = instant
