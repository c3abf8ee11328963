"""The error tree shared by every layer: what failed, and whether trying again can help."""

from __future__ import annotations

import errno
import socket
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Pace:
    """A provider's rate-limit headers said nothing is left for ``seconds``; ``header`` names
    the header that said so (executors/ratelimit.py reads them)."""

    seconds: float
    header: str


class PromptschedError(Exception):
    """Base class for every error promptsched raises on purpose."""


class ValidationError(PromptschedError):
    """Bad input: names the offending field so users can fix it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class NotFound(PromptschedError):
    """The resource does not exist, or is not the caller's."""

    def __init__(self, what: str, ident: int | str) -> None:
        super().__init__(f"{what} {ident} not found")


class VersionConflict(PromptschedError):
    """The schedule changed since the editor read it."""

    def __init__(self, current: int) -> None:
        super().__init__(f"the schedule changed meanwhile (now at version {current})")
        self.current = current


class StateConflict(PromptschedError):
    """The resource's current state does not allow the operation (e.g. cancel a finished run)."""


class QuotaExceeded(ValidationError):
    """An owner reached one of its quotas (docs/deploying.md, "Quotas"): the message names the
    limit and its setting."""


class ConfigError(ValidationError):
    """Invalid configuration, found at startup."""


class SchemaMismatch(PromptschedError):
    """The database schema is behind or ahead of this code."""


class ExecutorError(PromptschedError):
    """An executor failed. ``retryable`` says whether another attempt can help.

    ``retry_after`` (seconds) is the provider's own wish, e.g. from a ``Retry-After``
    header; the backoff never shortens it.
    """

    retryable: bool = True
    # The provider said "not now" (a 429, a 503 with Retry-After): the attempt does not count
    # against max_attempts, and the run waits until the schedule's give_up_after.
    throttled: bool = False

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        usage: Mapping[str, int] | None = None,
        pace: Pace | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
        self.usage = usage  # what the provider reported before it failed, if anything
        self.pace = pace  # what the provider's rate-limit headers said is left, if anything


class RetryableError(ExecutorError):
    """Transient: timeouts, connection errors, 5xx, 408, 429."""

    retryable = True


class Throttled(RetryableError):
    """The provider pushed back: a 429 (with or without ``Retry-After``), or a 503 with
    ``Retry-After``. Trying again later helps; it is not a failure of the run."""

    throttled = True


class PermanentError(ExecutorError):
    """Trying again gives the same answer: other 4xx, invalid responses, bad templates."""

    retryable = False


class AttemptTimeout(RetryableError):
    """The attempt ran past the schedule's timeout."""


_UNREACHABLE = {errno.ECONNREFUSED: "connection refused", errno.EHOSTUNREACH: "no route to host",
                errno.ENETUNREACH: "network unreachable", errno.ETIMEDOUT: "timed out",
                errno.ENOENT: "no server socket there"}  # fmt: skip


def connect_failure(exc: BaseException) -> str | None:
    """A connection that could not be made, in a few words ("connection refused"), or None for
    any other error. asyncpg joins several addresses' failures in one OSError whose text is
    "Multiple exceptions: [Errno 111] Connect call failed ...", without an errno of its own."""
    if isinstance(exc, socket.gaierror):
        return "no such host"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if not isinstance(exc, OSError):
        return None
    if exc.errno in _UNREACHABLE:
        return _UNREACHABLE[exc.errno]
    return "connection refused" if "Connect call failed" in str(exc) else None
