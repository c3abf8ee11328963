"""Deterministic jitter: the same offset for a (schedule, slot) on every replica."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


def offset(schedule_id: int, slot: datetime, max_jitter: timedelta) -> timedelta:
    """An offset in [0, max_jitter) from a hash of (schedule, slot): never random.

    The slot is read as an instant (its zone does not matter); resolution is one microsecond.
    """
    if slot.tzinfo is None:
        raise ValueError("`slot` must be timezone-aware")
    span = max_jitter // _US
    if span <= 0:
        return timedelta(0)
    key = f"{schedule_id}:{(slot - _EPOCH) // _US}".encode()
    digest = hashlib.blake2b(key, digest_size=8, person=b"ps-jitter").digest()
    return timedelta(microseconds=int.from_bytes(digest, "big") % span)
