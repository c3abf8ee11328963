"""Retry decisions of the worker and the notifier: one pure function from a failure to what
happens next (retry after a backoff with jitter, or dead)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

MAX_RETRY_AFTER = 86_400.0  # a day: the longest wait a Retry-After is taken for


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int
    base: timedelta = timedelta(seconds=2)
    cap: timedelta = timedelta(hours=1)


class RetryAction(StrEnum):
    RETRY = "retry"  # try again after ``delay``
    DEAD = "dead"  # no more attempts: the run (or notification) is dead-lettered


@dataclass(frozen=True, slots=True)
class RetryDecision:
    action: RetryAction
    delay: timedelta = timedelta(0)


def decide(
    *,
    retryable: bool,
    retry_after: float | None,
    attempt: int,
    policy: RetryPolicy,
    jitter: float,
) -> RetryDecision:
    """``attempt`` counts from 1 (released attempts excluded); ``jitter`` is in [0, 1).

    Exponential backoff with "equal jitter" (half fixed, half random), so a rush of failures
    spreads out; a provider's ``Retry-After`` is a floor the backoff never shortens, up to
    MAX_RETRY_AFTER (it is written by whoever answered: no wait it asks for may overflow).
    """
    if not retryable or attempt >= policy.max_attempts:
        return RetryDecision(RetryAction.DEAD)
    exponent = min(attempt - 1, 30)
    ceiling = min(policy.cap.total_seconds(), policy.base.total_seconds() * 2**exponent)
    delay = ceiling / 2 + ceiling / 2 * jitter
    if retry_after is not None:
        delay = max(delay, min(retry_after, MAX_RETRY_AFTER))
    return RetryDecision(RetryAction.RETRY, timedelta(seconds=delay))
