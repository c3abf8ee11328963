"""The per-provider Limiter: concurrency and rate with an injected clock, wake-ups, and 200
concurrent attempts against a real server that counts requests in flight."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import anyio
import pytest

from promptsched.executors import openai
from promptsched.executors.base import ExecutionRequest
from promptsched.executors.limiter import Limiter
from promptsched.executors.settings import ProviderSettings
from tests.fakes import openai_server as fake_server


class FakeClock:
    """A monotonic clock tests move by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_concurrency_cap_and_idempotent_release() -> None:
    limiter = Limiter(max_concurrency=2)
    first, second = limiter.try_acquire(), limiter.try_acquire()
    assert first is not None and second is not None
    assert limiter.available() == 0
    assert limiter.try_acquire() is None
    assert limiter.seconds_until_available() == math.inf

    first.release()
    first.release()  # a second release must not free a permit it does not hold
    assert limiter.available() == 1
    assert limiter.in_use == 1
    with second:
        pass
    assert limiter.available() == 2
    assert limiter.seconds_until_available() == 0.0


def test_rate_tokens_refill_with_the_injected_clock() -> None:
    clock = FakeClock()
    limiter = Limiter(max_concurrency=10, rate_per_second=2, clock=clock)

    assert limiter.available() == 2  # a burst of one second's worth
    permits = [limiter.try_acquire(), limiter.try_acquire()]
    assert all(permits)
    assert limiter.available() == 0
    assert limiter.try_acquire() is None
    assert limiter.seconds_until_available() == pytest.approx(0.5)

    clock.advance(0.25)
    assert limiter.available() == 0
    assert limiter.seconds_until_available() == pytest.approx(0.25)
    clock.advance(0.25)
    assert limiter.available() == 1
    clock.advance(60)
    assert limiter.available() == 2  # the bucket never holds more than the burst


def test_releasing_a_permit_does_not_refund_a_rate_token() -> None:
    clock = FakeClock()
    limiter = Limiter(max_concurrency=5, rate_per_second=1, clock=clock)
    permit = limiter.try_acquire()
    assert permit is not None
    permit.release()
    assert limiter.available() == 0
    clock.advance(1)
    assert limiter.available() == 1


def test_available_is_the_minimum_of_concurrency_and_rate() -> None:
    clock = FakeClock()
    limiter = Limiter(max_concurrency=3, rate_per_second=10, clock=clock)
    assert limiter.available() == 3
    held = [limiter.try_acquire() for _ in range(3)]
    assert limiter.available() == 0
    assert limiter.seconds_until_available() == math.inf  # only a release can help
    for permit in held:
        assert permit is not None
        permit.release()
    assert limiter.available() == 3  # 7 tokens left, 3 free slots


def test_slow_rates_and_tiny_steps_add_up_to_whole_tokens() -> None:
    clock = FakeClock()
    limiter = Limiter(max_concurrency=5, rate_per_second=0.5, clock=clock)
    assert limiter.try_acquire() is not None
    assert limiter.try_acquire() is None
    for _ in range(20):
        clock.advance(0.1)  # 20 x 0.1 s at 0.5/s is exactly one token despite float error
    assert limiter.available() == 1


def test_a_clock_going_backwards_never_takes_tokens_away() -> None:
    clock = FakeClock()
    limiter = Limiter(max_concurrency=5, rate_per_second=1, burst=3, clock=clock)
    assert limiter.available() == 3
    clock.advance(-100)
    assert limiter.available() == 3


@pytest.mark.parametrize(
    "make",
    [
        lambda: Limiter(0),
        lambda: Limiter(1, rate_per_second=0),
        lambda: Limiter(1, rate_per_second=-1),
        lambda: Limiter(1, rate_per_second=1, burst=0),
    ],
)
def test_invalid_limits_are_rejected(make: Callable[[], Limiter]) -> None:
    with pytest.raises(ValueError):
        make()


async def test_wait_available_wakes_on_release() -> None:
    limiter = Limiter(max_concurrency=1)
    held = limiter.try_acquire()
    assert held is not None
    woke: list[int] = []

    async def waiter() -> None:
        await limiter.wait_available(timeout=30)
        woke.append(limiter.available())

    with anyio.fail_after(5):  # far below the waiter's own 30 s: only the release can wake it
        async with anyio.create_task_group() as group:
            group.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert woke == []
            held.release()
    assert woke == [1]


async def test_wait_available_returns_at_once_when_a_permit_is_free() -> None:
    limiter = Limiter(max_concurrency=1)
    with anyio.fail_after(1):
        await limiter.wait_available(timeout=30)


async def test_wait_available_gives_up_after_its_timeout() -> None:
    limiter = Limiter(max_concurrency=1)
    assert limiter.try_acquire() is not None
    started = time.monotonic()
    await limiter.wait_available(timeout=0.05)
    assert 0.05 <= time.monotonic() - started < 2
    assert limiter.available() == 0


async def test_wait_available_waits_only_until_the_next_rate_token() -> None:
    limiter = Limiter(max_concurrency=50, rate_per_second=20)  # real clock: a token every 50ms
    while limiter.try_acquire() is not None:
        pass
    assert limiter.in_use == 20  # the burst is spent; 30 slots are still free
    started = time.monotonic()
    await limiter.wait_available(timeout=10)
    assert time.monotonic() - started < 2
    assert limiter.try_acquire() is not None


async def test_200_attempts_never_exceed_8_in_flight_at_the_server() -> None:
    limiter = Limiter(max_concurrency=8)
    done: list[str] = []
    holding = 0
    max_holding = 0
    async with fake_server.start_fake_openai(default=fake_server.gather(8)) as fake:
        settings = ProviderSettings(
            name="openai",
            kind="openai",
            base_url=fake.base_url,
            default_model="m",
            request_timeout=timedelta(seconds=30),
            max_concurrency=8,
        )
        executor = openai.OpenAIExecutor(settings)

        async def attempt(run_id: int) -> None:
            nonlocal holding, max_holding
            with await limiter.acquire():
                holding += 1
                max_holding = max(max_holding, holding)
                result = await executor.execute(
                    ExecutionRequest(
                        run_id=run_id,
                        schedule_id=1,
                        schedule_name="rush",
                        attempt_id=uuid.uuid4(),
                        attempt=1,
                        slot=datetime(2024, 1, 1, tzinfo=UTC),
                        timezone="UTC",
                        prompt=f"run {run_id}",
                    )
                )
                holding -= 1
            done.append(result.output)

        try:
            with anyio.fail_after(60):
                async with anyio.create_task_group() as group:
                    for run_id in range(200):
                        group.start_soon(attempt, run_id)
        finally:
            await executor.aclose()

    assert len(done) == 200
    assert len(fake.requests) == 200
    assert max_holding == 8
    assert fake.max_in_flight == 8  # full use of the limit, never more
    assert limiter.in_use == 0
