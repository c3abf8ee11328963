"""The breaker's opening, with the real clock (the database's): logged once per opening with
the provider, the reason and until when, and this replica's state and gauge say open at once,
before its next claim. The advice of a run that gave up names the provider's own variables."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from structlog.testing import capture_logs

from promptsched import errors
from promptsched.clock import Clock
from promptsched.domain import ClaimedRun
from promptsched.metrics import Metrics
from promptsched.roles.worker import attempt
from promptsched.roles.worker.inflight import InFlight
from tests import factories
from tests.fakes import openai_server as fake_server
from tests.test_providers_integration import PROVIDER, fake_schedule, fake_workers

CLOSED, OPEN = 0, 2


def _breaker(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value(
        "promptsched_provider_breaker_state", {"provider": PROVIDER}
    )


async def test_an_opening_is_logged_once_and_this_replica_follows_at_once(
    pool: asyncpg.Pool[Any], fake: fake_server.FakeOpenAI
) -> None:
    metrics = Metrics()
    sid = await fake_schedule(pool, max_attempts=5)
    now = datetime.now(UTC)
    for i in range(3):
        await factories.pending_run(pool, sid, now - timedelta(seconds=10 + i))
    async with fake_workers(pool, Clock(), fake.base_url, metrics=metrics) as workers:
        fleet = workers.fleet
        claim = await fleet.claim(PROVIDER, 3, "it-worker", timedelta(seconds=30))
        assert len(claim) == 3
        assert _breaker(metrics) == CLOSED
        throttled = errors.Throttled("fake: HTTP 429 Too Many Requests", retry_after=30.0)
        with capture_logs() as lines:
            # three attempts of one burst meet the same 429: one opening
            for row in claim:
                flight = InFlight(row.id, row.attempt_id, PROVIDER, None)
                await fleet.report(row, flight, throttled, {})
            # this replica knows before any further claim
            assert _breaker(metrics) == OPEN
            assert PROVIDER in fleet.unavailable()
        opened = [line for line in lines if line["event"] == "provider.breaker_opened"]
        assert len(opened) == 1, lines
        until = datetime.fromisoformat(opened[0]["until"])
        assert opened[0]["provider"] == PROVIDER
        assert opened[0]["reason"] == "throttled"
        assert abs((until - now).total_seconds() - 30) < 10
        stored = await pool.fetchval(
            "SELECT open_until FROM provider_buckets WHERE provider = $1", PROVIDER
        )
        assert stored == until


def test_the_give_up_advice_names_the_providers_own_variables() -> None:
    run = ClaimedRun(
        id=1, schedule_id=1, slot=datetime(2026, 3, 2, tzinfo=UTC), attempt_id=None,  # type: ignore[arg-type]
        attempts=14, releases=0, max_attempts=3, name="n", prompt="p", model="m", params=None,
        timezone="UTC", enabled=True, timeout_seconds=60.0, start_lag=0.0, throttles=13,
        schedule_provider="openai", give_up_seconds=3600.0, running_for=3588.0,
    )  # fmt: skip
    said = attempt.gave_up(run, errors.Throttled("my-proxy: HTTP 429"), "my-proxy")
    assert (
        "PROMPTSCHED_PROVIDER_MY_PROXY_RATE or PROMPTSCHED_PROVIDER_MY_PROXY_MAX_CONCURRENCY"
        in (said)
    )
    assert "<NAME>" not in said
