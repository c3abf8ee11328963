"""The error tree shared by every layer: what failed, and whether trying again can help."""

from __future__ import annotations

from collections.abc import Mapping


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

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        usage: Mapping[str, int] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
        self.usage = usage  # what the provider reported before it failed, if anything


class RetryableError(ExecutorError):
    """Transient: timeouts, connection errors, 5xx, 408, 429."""

    retryable = True


class PermanentError(ExecutorError):
    """Trying again gives the same answer: other 4xx, invalid responses, bad templates."""

    retryable = False


class AttemptTimeout(RetryableError):
    """The attempt ran past the schedule's timeout."""
