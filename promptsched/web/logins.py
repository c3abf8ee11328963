"""Failed console logins slow their client down: after ``FREE`` failures from one client
address, each further failure makes it wait twice as long as the last (1 s, 2 s, 4 s, ... up to
``LONGEST``) before its next try is even checked. A success forgets the client; so does
``FORGET`` without a failure. Kept in this process's memory (each replica its own), for at
most ``CLIENTS`` addresses; an IPv6 client is its /64, which one machine usually holds whole."""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

FREE = 5  # failures without a wait
FIRST = 1.0  # the wait after the first failure past FREE, in seconds; doubled by each next
LONGEST = 60.0
FORGET = 15 * 60.0  # seconds without a failure after which a client starts afresh
CLIENTS = 10_000


@dataclass(slots=True)
class _Record:
    failures: int
    last: float  # monotonic time of the last failure
    until: float  # no try is checked before this monotonic time


def key(client: str) -> str:
    """The address the backoff counts under: an IPv4 address itself, an IPv6 address's /64."""
    try:
        parsed = ipaddress.ip_address(client)
    except ValueError:
        return client
    if isinstance(parsed, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((parsed, 64), strict=False))
    return str(parsed)


class LoginBackoff:
    """One process's record of failed logins per client (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._records: OrderedDict[str, _Record] = OrderedDict()

    def retry_after(self, client: str) -> int:
        """Whole seconds ``client`` must still wait before a try is checked (0: try now)."""
        record = self._current(key(client))
        if record is None:
            return 0
        wait = record.until - self._clock()
        return math.ceil(wait) if wait > 0 else 0

    def failed(self, client: str) -> None:
        name, now = key(client), self._clock()
        record = self._current(name) or _Record(0, now, now)
        record.failures += 1
        record.last = now
        beyond = record.failures - FREE
        if beyond > 0:
            record.until = now + min(FIRST * 2 ** min(beyond - 1, 32), LONGEST)
        self._records[name] = record
        self._records.move_to_end(name)
        while len(self._records) > CLIENTS:
            self._records.popitem(last=False)  # the longest without a failure

    def succeeded(self, client: str) -> None:
        self._records.pop(key(client), None)

    def _current(self, name: str) -> _Record | None:
        record = self._records.get(name)
        if record is not None and self._clock() - record.last > FORGET:
            del self._records[name]
            return None
        return record


LOGINS: web.AppKey[LoginBackoff] = web.AppKey("logins", LoginBackoff)
