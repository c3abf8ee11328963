"""Per-owner quotas (docs/deploying.md, "Quotas"): schedules per owner, refused at create over
the API, the CLI and the console; runs per owner per minute, deferred to a later minute and
never lost; API requests per token per second, answered 429 with Retry-After."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
from aiohttp.test_utils import TestClient

from promptsched import config as configuration
from promptsched.api import app as api_app
from promptsched.clock import FrozenClock
from promptsched.config import SchedulerSettings
from promptsched.console import routes as console_routes
from promptsched.metrics import Metrics
from promptsched.roles.scheduler import Scheduler
from promptsched.web.ratelimit import TokenRates
from tests import api_support, console_support, factories
from tests.factories import EPOCH
from tests.helpers import run_cli

QUOTA_SETTING = "PROMPTSCHED_OWNER_MAX_SCHEDULES"


def _app(pool: asyncpg.Pool[Any], **options: Any) -> Any:
    return api_app.build(
        pool, Metrics(), lambda: True, providers=("echo",), mounts=(console_routes.mount,),
        **options,
    )  # fmt: skip


def _body(name: str) -> dict[str, str]:
    return {**api_support.SCHEDULE, "name": name}


# --- schedules per owner ------------------------------------------------------------------


async def test_an_owner_at_its_schedule_quota_is_refused_naming_the_limit(
    pool: asyncpg.Pool[Any],
) -> None:
    async with TestClient(api_support.Server(_app(pool, max_schedules=2))) as client:
        api = api_support.Api(client, pool)
        alice, bob = await api.token("alice"), await api.token("bob")
        for name in ("one", "two"):
            assert (await api.post("/v1/schedules", alice, json=_body(name))).status == 201
        before = await api_support.snapshot(pool)
        refused = await api.post("/v1/schedules", alice, json=_body("three"))
        assert refused.status == 409, refused.body
        error = refused.body["error"]
        assert error["code"] == "quota_exceeded" and error["field"] == "owner"
        assert (
            f"alice has 2 schedules, the most one owner may have ({QUOTA_SETTING}=2)"
            in (error["message"])
        )
        assert await api_support.snapshot(pool) == before  # nothing written
        # Another owner has its own quota; a follow-up is no schedule of the quota.
        assert (await api.post("/v1/schedules", bob, json=_body("one"))).status == 201
        followup = {"key": "order-1", "in": "1h", "prompt": "Shipped?"}
        assert (await api.post("/v1/followups", alice, json=followup)).status == 201
        # Deleting one makes room again.
        first = await pool.fetchval("SELECT min(id) FROM schedules WHERE owner = 'alice'")
        assert (await api.delete(f"/v1/schedules/{first}", alice)).status == 204
        assert (await api.post("/v1/schedules", alice, json=_body("three"))).status == 201


async def test_the_console_refuses_a_schedule_over_the_quota_in_words(
    pool: asyncpg.Pool[Any],
) -> None:
    async with TestClient(api_support.Server(_app(pool, max_schedules=1))) as client:
        ui = console_support.Console(client, pool)
        await ui.login_as("alice")
        form = {
            "name": "first", "kind": "auto", "expression": "30 7 * * 1-5", "timezone": "UTC",
            "prompt": "hello", "provider": "echo", "model": "", "params": "",
            "misfire": "run_once", "overlap": "skip", "max_attempts": "3", "timeout": "5m",
        }  # fmt: skip
        assert (await ui.post("/schedules/new", form)).status == 303
        refused = await ui.post("/schedules/new", {**form, "name": "second"})
        assert refused.status == 422
        assert "alice has 1 schedules, the most one owner may have" in refused.text
        assert f"({QUOTA_SETTING}=1)" in refused.text
        assert await pool.fetchval("SELECT count(*) FROM schedules") == 1


def test_the_cli_refuses_a_schedule_over_the_quota_naming_the_setting(dsn: str) -> None:
    env = {QUOTA_SETTING: "1"}
    add = ("schedules", "add", "--every", "1h", "--prompt", "hi", "--owner", "carol")
    assert run_cli(*add, "--name", "a", dsn=dsn, env=env).returncode == 0
    refused = run_cli(*add, "--name", "b", dsn=dsn, env=env)
    assert refused.returncode != 0
    assert f"owner: carol has 1 schedules, the most one owner may have ({QUOTA_SETTING}=1)" in (
        refused.stderr
    ), refused.stderr
    assert "Traceback" not in refused.stderr
    # 0 turns the quota off.
    assert run_cli(*add, "--name", "b", dsn=dsn, env={QUOTA_SETTING: "0"}).returncode == 0


# --- runs per owner per minute ------------------------------------------------------------


async def test_runs_past_an_owners_minute_are_deferred_to_the_next_minutes_never_lost(
    pool: asyncpg.Pool[Any],
) -> None:
    slot = EPOCH
    busy = [await factories.schedule(pool, expression="0 9 * * *", next_fire_at=slot)
            for _ in range(7)]  # fmt: skip
    quiet = await factories.schedule(pool, expression="0 9 * * *", next_fire_at=slot)
    await pool.execute("UPDATE schedules SET owner = 'busy' WHERE id = ANY ($1)", busy)
    await pool.execute("UPDATE schedules SET owner = 'quiet' WHERE id = $1", quiet)
    # The busy owner made 1 run due earlier in this minute already.
    await pool.execute(
        "INSERT INTO owner_minutes (owner, minute, shard, runs) VALUES ('busy', $1, 99, 1)", EPOCH
    )
    metrics = Metrics()
    settings = SchedulerSettings(owner_runs_per_minute=3)
    scheduler = Scheduler(pool, FrozenClock(slot + timedelta(seconds=30)), metrics, settings)
    counts = await scheduler.run_once()
    assert counts.enqueued == 8 and counts.deferred == 5
    rows = await pool.fetch(
        "SELECT owner, status, available_at FROM runs ORDER BY owner, available_at, schedule_id"
    )
    assert {row["status"] for row in rows} == {"pending"}  # every run is there, pending
    available = [(row["owner"], row["available_at"]) for row in rows]
    minute = timedelta(minutes=1)
    # 1 + 2 of this minute, then 3 a minute; the other owner's run is not held back.
    assert available == [
        *[("busy", slot)] * 2,
        *[("busy", EPOCH + minute)] * 3,
        *[("busy", EPOCH + 2 * minute)] * 2,
        ("quiet", slot),
    ]
    assert metrics.runs_deferred._value.get() == 5
    # The minutes' counts hold what was made due in each.
    counted = await pool.fetch(
        "SELECT minute, sum(runs)::int AS runs FROM owner_minutes WHERE owner = 'busy' "
        "GROUP BY minute ORDER BY minute"
    )
    assert [(row["minute"], row["runs"]) for row in counted] == [
        (EPOCH, 3), (EPOCH + minute, 3), (EPOCH + 2 * minute, 2)
    ]  # fmt: skip


async def test_without_a_runs_quota_nothing_is_counted_or_deferred(
    pool: asyncpg.Pool[Any],
) -> None:
    for _ in range(5):
        await factories.schedule(pool, expression="0 9 * * *", next_fire_at=EPOCH)
    settings = SchedulerSettings(owner_runs_per_minute=0)
    scheduler = Scheduler(pool, FrozenClock(EPOCH), Metrics(), settings)
    counts = await scheduler.run_once()
    assert counts.enqueued == 5 and counts.deferred == 0
    assert await pool.fetchval("SELECT count(*) FROM owner_minutes") == 0
    assert await pool.fetchval("SELECT count(*) FROM runs WHERE available_at <> slot") == 0


# --- API requests per token per second ----------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_token_over_its_request_rate_is_answered_429_with_retry_after(
    pool: asyncpg.Pool[Any],
) -> None:
    clock = _Clock()
    rates = TokenRates(0.5, 3, now=clock)  # 3 at once, then one every 2 s
    async with TestClient(api_support.Server(_app(pool, rates=rates))) as client:
        api = api_support.Api(client, pool)
        alice, bob = await api.token("alice"), await api.token("bob")
        for _ in range(3):
            assert (await api.get("/v1/schedules", alice)).status == 200
        refused = await api.get("/v1/schedules", alice)
        assert refused.status == 429
        assert refused.headers["Retry-After"] == "2"
        assert refused.body["error"]["code"] == "rate_limited"
        assert "PROMPTSCHED_API_RATE" in refused.body["error"]["message"]
        # A write is refused before it is read: nothing is created.
        assert (await api.post("/v1/schedules", alice, json=_body("x"))).status == 429
        assert await pool.fetchval("SELECT count(*) FROM schedules") == 0
        # Another token has its own bucket; a bad token is still a 401, not a 429.
        assert (await api.get("/v1/schedules", bob)).status == 200
        bad = {"Authorization": "Bearer pst_" + "x" * 40}
        assert (await api.get("/v1/schedules", bad)).status == 401
        clock.now += 1.0
        assert (await api.get("/v1/schedules", alice)).headers["Retry-After"] == "1"
        clock.now += 1.0  # two seconds: one request's worth
        assert (await api.get("/v1/schedules", alice)).status == 200
        assert (await api.get("/v1/schedules", alice)).status == 429


def test_the_quotas_defaults_are_the_documented_ones() -> None:
    """docs/deploying.md's quota table against what the configuration applies."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "deploying.md").read_text()
    table = dict(re.findall(r"^\| `(PROMPTSCHED_[A-Z_]+)` \| `?([^`|]+?)`? \|", text, re.M))
    config = configuration.load({})
    assert table[QUOTA_SETTING] == str(config.owner_max_schedules) == "10000"
    assert config.api.max_schedules == 10_000
    assert table["PROMPTSCHED_OWNER_RUNS_PER_MINUTE"] == "20000"
    assert config.scheduler.owner_runs_per_minute == 20_000
    assert table["PROMPTSCHED_API_RATE"] == "50" and config.api.rate == 50.0
    assert "`PROMPTSCHED_API_BURST`, default `200`" in text and config.api.burst == 200
