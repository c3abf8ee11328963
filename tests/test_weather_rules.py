"""Provider weather, the pure rules and the provider's row (docs/providers.md, "When the provider
pushes back"): which answers are throttling, how rate-limit headers are read, what a throttled
attempt's final write is (it waits as asked, spends no attempt, gives up after
give_up_after, goes on to a fallback), and the fleet's row: one burst is one event, and the
allowed concurrency ramps back from one after an opening. The row is driven with explicit
instants, nothing sleeps."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from promptsched import fallback
from promptsched.domain import ClaimedRun, RunStatus
from promptsched.errors import Pace, PermanentError, RetryableError, Throttled
from promptsched.executors import http_client, ratelimit
from promptsched.roles.worker import attempt
from promptsched.roles.worker import fleet as worker_fleet
from promptsched.roles.worker.inflight import StopReason
from promptsched.store import queries

NOW = datetime(2026, 3, 2, 7, 0, tzinfo=UTC)
P = "prov"


# --- which answers are throttling ------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "headers", "throttled"),
    [
        (429, {}, True),
        (429, {"Retry-After": "5"}, True),
        (503, {"Retry-After": "5"}, True),
        (503, {}, False),
        (500, {"Retry-After": "5"}, False),
        (408, {}, False),
    ],
)
def test_a_429_or_a_503_with_retry_after_is_throttling(
    status: int, headers: dict[str, str], throttled: bool
) -> None:
    error = http_client.classify_status(status, headers, "", provider="p", now=NOW)
    assert error.retryable and error.throttled is throttled
    assert isinstance(error, Throttled) is throttled


# --- rate-limit headers ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("6m0s", 360.0), ("1s", 1.0), ("20ms", 0.02), ("1h2m3.5s", 3723.5), ("2.5", 2.5),
     ("2026-03-02T07:00:02Z", 2.0), ("2026-03-02T08:00:03+01:00", 3.0)],
)  # fmt: skip
def test_reset_values_are_read_as_providers_write_them(value: str, seconds: float) -> None:
    assert ratelimit.parse_reset(value, NOW) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["soon", "", "6x", "-1s", "2026-03-02T06:59:00Z", "1s2", "NaN"])
def test_malformed_or_past_resets_change_nothing(value: str) -> None:
    assert ratelimit.parse_reset(value, NOW) is None
    headers = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": value}
    assert ratelimit.pace_of(headers, NOW) is None


def test_headers_pace_only_when_nothing_is_left() -> None:
    openai = {"X-RateLimit-Remaining-Requests": "0", "X-RateLimit-Reset-Requests": "2s",
              "x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "6m0s"}  # fmt: skip
    assert ratelimit.pace_of(openai, NOW) == Pace(360.0, "x-ratelimit-reset-tokens")
    anthropic = {"anthropic-ratelimit-requests-remaining": "0",
                 "anthropic-ratelimit-requests-reset": "2026-03-02T07:00:02Z"}  # fmt: skip
    assert ratelimit.pace_of(anthropic, NOW) == Pace(2.0, "anthropic-ratelimit-requests-reset")
    assert ratelimit.pace_of({**anthropic, "anthropic-ratelimit-requests-remaining": "4"}) is None
    assert ratelimit.pace_of({"x-ratelimit-remaining-requests": "zero",
                              "x-ratelimit-reset-requests": "1s"}, NOW) is None  # fmt: skip
    assert ratelimit.pace_of({"x-ratelimit-remaining-requests": "0"}, NOW) is None
    far = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "30h"}
    assert ratelimit.pace_of(far, NOW) == Pace(ratelimit.MAX_PACE, "x-ratelimit-reset-requests")


# --- a throttled attempt's final write -------------------------------------------------------


def _run(**fields: Any) -> ClaimedRun:
    base: dict[str, Any] = dict(
        id=1, schedule_id=1, slot=NOW, attempt_id=uuid.uuid4(), attempts=1, releases=0,
        max_attempts=1, name="s", prompt="p", model="m", params={}, timezone="UTC",
        enabled=True, timeout_seconds=30.0, start_lag=0.0, schedule_provider=P,
        schedule_model="m", give_up_seconds=3600.0,
    )  # fmt: skip
    return ClaimedRun(**{**base, **fields})


def _settle(run: ClaimedRun, outcome: Any, **kw: Any) -> queries.Finish:
    item = attempt.settle(
        run, StopReason.NONE, outcome, retry_base=timedelta(seconds=2),
        retry_max=timedelta(hours=1), jitter=0.0, **kw,
    )  # fmt: skip
    assert item is not None
    return item


def test_a_throttled_attempt_waits_as_asked_and_spends_no_attempt() -> None:
    run = _run(attempts=7, throttles=6, max_attempts=1)  # its one counted attempt is this one
    item = _settle(run, Throttled("429", retry_after=5.0))
    assert item.status == RunStatus.PENDING and item.throttled
    assert item.retry_in == timedelta(seconds=5) and item.wait == timedelta(seconds=5)
    paced = _settle(run, Throttled("429", pace=Pace(2.0, "x-ratelimit-reset-requests")))
    assert paced.retry_in == timedelta(seconds=2)
    # No hint: 2 s doubling per throttled attempt, up to a minute (equal jitter, 0 here).
    assert _settle(_run(throttles=0), Throttled("429")).retry_in == timedelta(seconds=1)
    assert _settle(_run(throttles=20), Throttled("429")).retry_in == timedelta(seconds=30)
    # A real failure still counts: the one attempt is spent.
    assert _settle(run, RetryableError("HTTP 500")).status == RunStatus.DEAD


def test_give_up_after_ends_a_run_still_throttled_saying_so() -> None:
    run = _run(throttles=3, running_for=58.0, give_up_seconds=60.0)
    item = _settle(
        run, Throttled("prov: HTTP 429 Too Many Requests (retry after 5s)", retry_after=5.0)
    )
    assert item.status == RunStatus.DEAD and item.throttled
    assert item.error is not None
    assert "give_up_after (1m)" in item.error and "HTTP 429" in item.error
    assert "4 throttled attempt(s)" in item.error and "fallback" in item.error
    assert _settle(run, Throttled("429", retry_after=1.0)).status == RunStatus.PENDING


def test_a_retry_goes_on_to_the_next_fallback_and_a_permanent_error_does_not() -> None:
    run = _run(fallback=("backup", "third:big-model"), max_attempts=3)
    item = _settle(run, Throttled("429", retry_after=30.0))
    assert item.reroute == (1, "backup", None) and item.retry_in == timedelta(0)
    item = _settle(run, RetryableError("HTTP 500"), unavailable={"backup"})
    assert item.reroute == (2, "third", "big-model") and item.retry_in == timedelta(0)
    # from the last place back to the first: it waits as the provider asked
    last = _run(fallback=("backup",), route=1, model=None)
    item = _settle(last, Throttled("429", retry_after=30.0))
    assert item.reroute == (0, P, "m") and item.retry_in == timedelta(seconds=30)
    assert _settle(run, PermanentError("HTTP 401")).status == RunStatus.DEAD
    assert _settle(run, PermanentError("HTTP 401")).reroute is None


def test_fallback_lists_are_checked_naming_the_entry() -> None:
    known = {"a", "b", "c"}
    assert fallback.validate(["b", "c:m:8b"], providers=known, primary="a") == ("b", "c:m:8b")
    assert fallback.split("c:m:8b") == ("c", "m:8b")
    for bad, where in ((["zz"], "fallback[0]"), (["b", "b"], "fallback[1]"), (["a"], "fallback[0]"),
                       ([3], "fallback[0]"), (["b:"], "fallback[0]")):  # fmt: skip
        with pytest.raises(Exception) as caught:
            fallback.validate(bad, providers=known, primary="a")
        assert getattr(caught.value, "field", None) == where, bad


# --- the provider's row: one burst is one event, the ramp ------------------------------------


async def _trip(pool: asyncpg.Pool[Any], at: datetime, started: datetime, **kw: Any) -> Any:
    args: dict[str, Any] = dict(
        started=started, throttled=True, threshold=worker_fleet.BREAKER_FAILURES,
        base=worker_fleet.BREAKER_BASE, throttle_base=worker_fleet.THROTTLE_OPEN,
        cap=worker_fleet.BREAKER_MAX, window=worker_fleet.THROTTLE_WINDOW,
    )  # fmt: skip
    args.update(kw)
    wait = args.pop("wait", None)
    return await queries.provider_trip(pool, at, P, wait, **args)


async def _row(pool: asyncpg.Pool[Any]) -> asyncpg.Record:
    row = await pool.fetchrow("SELECT * FROM provider_buckets WHERE provider = $1", P)
    assert row is not None
    return row


async def test_failures_of_attempts_started_before_the_breaker_opened_do_not_extend_it(
    pool: asyncpg.Pool[Any],
) -> None:
    burst = NOW - timedelta(milliseconds=50)  # eight requests sent together
    first = await _trip(pool, NOW, burst)
    assert first.opened and first.open_until == NOW + timedelta(seconds=5)
    for late in range(1, 8):  # the rest of the burst answers 429 a little later
        at = NOW + timedelta(milliseconds=10 * late)
        assert await _trip(pool, at, burst) is None
        assert await _trip(pool, at, burst, throttled=False) is None
    row = await _row(pool)
    assert row["open_until"] == NOW + timedelta(seconds=5) and row["failures"] == 1
    # The probe after it started later: its 429 counts, and doubles the opening.
    probe = NOW + timedelta(seconds=5)
    again = await _trip(pool, probe + timedelta(milliseconds=5), probe)
    assert again.opened and again.open_until == probe + timedelta(seconds=10, milliseconds=5)
    # A Retry-After is what the breaker waits, whatever the count.
    told = await _trip(pool, probe + timedelta(seconds=11), probe + timedelta(seconds=11), wait=2.0)
    assert told.open_until == probe + timedelta(seconds=13)


async def test_allowed_concurrency_ramps_back_from_one_and_converges(
    pool: asyncpg.Pool[Any],
) -> None:
    """After an opening the fleet may run one request, then a success of a request started
    after the opening adds 1/floor(allowed): one more per round of the whole allowance, so
    from 1 to a limit of 8 takes 1+2+...+7 = 28 successes (measured here), never overshoots
    the limit, and the ramp ends there; a throttled answer starts it at one again."""
    limit = 8
    assert (await _trip(pool, NOW, NOW - timedelta(seconds=1))).opened
    assert (await _row(pool))["ramp"] == 1
    assert (
        await queries.provider_recover(
            pool, P, probe=True, started=NOW - timedelta(seconds=1), max_concurrency=limit
        )
        == 1
    )  # a success of a request sent before the opening does not grow it
    seen = []
    ramp: float | None = 1.0
    successes = 0
    while ramp is not None:
        successes += 1
        ramp = await queries.provider_recover(
            pool, P, probe=False, started=NOW + timedelta(seconds=1), max_concurrency=limit
        )
        if ramp is not None:
            seen.append(int(ramp))
            assert 1 <= ramp < limit
    assert successes == 28
    assert seen == sorted(seen) and set(seen) == set(range(2, limit))
    assert (await _row(pool))["ramp"] is None
    again = await _trip(pool, NOW + timedelta(seconds=9), NOW + timedelta(seconds=8))
    assert again.opened and (await _row(pool))["ramp"] == 1


# --- the provider's row: learning the rate ----------------------------------------------------


async def _successes(
    pool: asyncpg.Pool[Any], sid: int, count: int, started: datetime, finished: datetime
) -> None:
    """``count`` succeeded runs of P whose attempt started at ``started``."""
    await pool.execute(
        "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts, status, attempts,"
        " attempt_id, worker_id, started_at, attempt_started_at, available_at, finished_at)"
        " SELECT $1, $2::timestamptz - g * interval '1 millisecond', 'manual', $3, 1,"
        " 'succeeded', 1, gen_random_uuid(), 'w', $2, $2, $2, $4 FROM generate_series(1, $5) g",
        sid, started, P, finished, count,
    )  # fmt: skip


async def _admit(pool: asyncpg.Pool[Any], at: datetime) -> queries.ProviderRoom:
    """What a claim of P (no limit configured but the learned one) meets at ``at``."""
    claim = await queries.run_claim_limited(
        pool, at, P, 8, "w", timedelta(seconds=30), max_concurrency=8, rate=None, burst=1
    )
    return claim.room


async def test_the_rate_is_learned_from_the_window_a_throttle_ended(
    pool: asyncpg.Pool[Any],
) -> None:
    """docs/providers.md, "Learning the rate": a throttle asking for 2 s after 3 successes
    of requests sent in the 2 s before it (and one sent earlier): when the probe succeeds the
    allowance is 3, claims take one request per 2 / (0.9 x 3) s from an empty bucket, the
    allowance doubles after 3 windows without a throttle, and a later throttle learns the
    smaller of what its window allowed and the allowance in force less one."""
    sid: int = await pool.fetchval(
        "INSERT INTO schedules (name, kind, expression, prompt, provider, enabled, next_fire_at)"
        " VALUES ('learn', 'cron', '0 0 1 1 *', 'hi', $1, true, NULL) RETURNING id",
        P,
    )
    window = timedelta(seconds=2)
    await _successes(pool, sid, 1, NOW - timedelta(seconds=3), NOW - timedelta(seconds=3))
    await _successes(pool, sid, 3, NOW - window + timedelta(milliseconds=100), NOW)
    assert (await _trip(pool, NOW, NOW - timedelta(milliseconds=10), wait=2.0)).opened
    assert (await _admit(pool, NOW + timedelta(seconds=1))).allowed == 0  # open
    probe = NOW + window
    learned = probe + timedelta(milliseconds=100)
    await queries.provider_recover(
        pool, P, probe=True, started=probe, max_concurrency=8, now=learned
    )
    row = await _row(pool)
    assert row["allowance"] == 3 and row["window_seconds"] == 2 and row["learn_until"] is None
    rate = 0.9 * 3 / 2
    early = await _admit(pool, learned + timedelta(seconds=0.9 / rate))
    assert early.allowed == 0 and early.rate == pytest.approx(rate)  # the bucket starts empty
    due = await _admit(pool, learned + timedelta(seconds=1.1 / rate))
    assert due.allowed == 1  # one at a time: a bucket of one request
    doubled = await _admit(pool, learned + 3 * window + timedelta(milliseconds=1))
    assert doubled.rate == pytest.approx(2 * rate)
    # A throttle 18 s later (allowance in force 3 x 2^3 = 24) after 5 successes in its window:
    # the allowance is 5. Another right after its probe, after 9: the 5 in force less one.
    later = learned + timedelta(seconds=18)
    await _successes(pool, sid, 5, later - timedelta(seconds=1), later)
    assert (await _trip(pool, later, later - timedelta(milliseconds=10), wait=2.0)).opened
    relearned = later + window + timedelta(milliseconds=100)
    await queries.provider_recover(
        pool, P, probe=True, started=later + window, max_concurrency=8, now=relearned
    )
    assert (await _row(pool))["allowance"] == 5
    last = relearned + timedelta(seconds=2)
    await _successes(pool, sid, 9, last - timedelta(seconds=1), last)
    assert (await _trip(pool, last, last - timedelta(milliseconds=10), wait=2.0)).opened
    await queries.provider_recover(
        pool, P, probe=True, started=last + window, max_concurrency=8,
        now=last + window + timedelta(milliseconds=100),
    )  # fmt: skip
    assert (await _row(pool))["allowance"] == 4
