"""Token and cost accounting (issue 19, part 3): every attempt keeps the usage its provider
reported, whatever its outcome, priced by the server's table; a run keeps the totals; the API
shows both; the token and cost metrics move by exactly those amounts. ``echo`` reports words
as tokens, so the amounts are known in advance."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from promptsched.clock import Clock
from promptsched.errors import ConfigError
from promptsched.metrics import Metrics
from promptsched.prices import Prices
from tests import factories
from tests.api_support import SCHEDULE, Api
from tests.fakes import openai_server as fake_server
from tests.fakes import pages as site
from tests.helpers import Service, wait_until
from tests.test_providers_integration import PROVIDER, provider_env

PRICES = Prices.parse("echo=1000/2000")  # per million tokens: 0.001 a prompt word, 0.002 out


def _sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_a_failed_and_a_winning_attempt_are_both_counted_and_priced(
    pool: asyncpg.Pool[Any], api: Api
) -> None:
    sid = await factories.schedule(pool, prompt="a b c d", params={"fail_attempts": 1})
    await pool.execute("UPDATE schedules SET owner = 'alice' WHERE id = $1", sid)
    now = await pool.fetchval("SELECT now()")
    rid = await factories.pending_run(pool, sid, now, "manual")
    metrics = Metrics()
    worker = factories.worker_pool(pool, Clock(), metrics, prices=PRICES)
    await worker.run_once()  # attempt 1: fails after reading the prompt
    await pool.execute("UPDATE runs SET available_at = now() WHERE id = $1", rid)
    await worker.run_once()  # attempt 2: "echo: a b c d"
    reply = await api.get(f"/v1/runs/{rid}", await api.token("alice"))
    assert reply.status == 200, reply.body
    run = reply.body
    assert run["status"] == "succeeded"
    failed, won = run["attempt_history"]
    assert failed["usage"] == {"prompt_tokens": 4, "completion_tokens": 0, "total_tokens": 4,
                               "cost": pytest.approx(0.004)}  # fmt: skip
    assert won["usage"] == {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9,
                            "cost": pytest.approx(0.014)}  # fmt: skip
    assert run["usage"] == won["usage"]  # the winning attempt's, as before
    assert run["tokens"] == 13 and run["cost"] == pytest.approx(0.018)
    # The schedule's spend this UTC day and month: this run, not one of 40 days ago.
    await pool.execute(
        "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts, status, tokens, "
        "cost) VALUES ($1, now() - interval '40 days', 'manual', 'echo', 3, 'succeeded', 99, 9)",
        sid,
    )
    shown = await api.get(f"/v1/schedules/{sid}", await api.token("alice"))
    assert shown.status == 200, shown.body
    for period in ("day", "month"):
        assert shown.body["spend"][period] == {"tokens": 13, "cost": pytest.approx(0.018)}
    labels = {"provider": "echo", "model": "default"}
    assert _sample(metrics, "promptsched_llm_tokens_total", **labels, kind="prompt") == 8
    assert _sample(metrics, "promptsched_llm_tokens_total", **labels, kind="completion") == 5
    assert _sample(metrics, "promptsched_llm_cost_total", **labels) == pytest.approx(0.018)


async def test_an_unpriced_provider_counts_tokens_and_no_cost(pool: asyncpg.Pool[Any]) -> None:
    sid = await factories.schedule(pool, prompt="one two")
    rid = await factories.pending_run(pool, sid)
    metrics = Metrics()
    await factories.worker_pool(pool, Clock(), metrics).run_once()
    row = await factories.run_row(pool, rid)
    assert (row["tokens"], row["cost"]) == (2 + 3, 0)
    assert "cost" not in row["usage"]
    assert _sample(metrics, "promptsched_llm_cost_total", provider="echo", model="default") == 0


def test_the_price_table_names_what_is_wrong() -> None:
    table = Prices.parse("openai:gpt-4o=2.50/10, openai=0.15/0.60")
    assert table.cost("openai", "gpt-4o", {"prompt_tokens": 1_000_000}) == 2.5
    assert table.cost("openai", "other", {"completion_tokens": 2_000_000}) == 1.2
    assert (
        table.with_default_models({"openai": "gpt-4o"}).cost(
            "openai", None, {"prompt_tokens": 1_000_000}
        )
        == 2.5
    )
    assert table.cost("anthropic", None, {"prompt_tokens": 5}) is None
    for bad in ("openai=2.5", "openai=x/1", "openai=1/1, openai=2/2"):
        with pytest.raises(ConfigError) as caught:
            Prices.parse(bad)
        assert caught.value.field == "PROMPTSCHED_PRICES"


@pytest.mark.slow
async def test_an_agent_run_sums_its_steps_and_a_failed_one_keeps_what_it_spent(
    dsn: str,
    pool: asyncpg.Pool[Any],
    tmp_path: Path,
    fake: fake_server.FakeOpenAI,
    pages: site.Pages,
) -> None:
    look = fake_server.tool_calls(("http_get", {"url": pages.url("/page")}))
    # Two model calls for the first run, then one for the second that blows its token budget.
    fake.script(
        dataclasses.replace(look, usage={"prompt_tokens": 100, "completion_tokens": 20}),
        fake_server.ok("Sunny.", usage={"prompt_tokens": 130, "completion_tokens": 7}),
        dataclasses.replace(look, usage={"prompt_tokens": 400, "completion_tokens": 50}),
    )
    env = {
        **provider_env(fake.base_url, timeout="30s"),
        "PROMPTSCHED_TOOLS_ALLOW": "127.0.0.1/32",
        "PROMPTSCHED_PRICES": f"{PROVIDER}=2/8",
    }
    ids = []
    for name, budget in (("two steps", None), ("over budget", 300)):
        params: dict[str, Any] = {"tools": ["http_get"], "max_steps": 4}
        if budget is not None:
            params["max_tokens_total"] = budget
        sid = await pool.fetchval(
            "INSERT INTO schedules (name, kind, expression, prompt, provider, params, "
            "max_attempts) VALUES ($1, 'cron', '0 0 1 1 *', 'weather?', $2, $3::jsonb, 1) "
            "RETURNING id",
            name, PROVIDER, params,
        )  # fmt: skip
        ids.append(sid)
    service = Service(dsn, tmp_path / "service.log", env=env)
    try:
        await service.ready()
        first_run = await factories.pending_run(pool, ids[0])

        async def finished(rid: int) -> bool:
            status = await pool.fetchval("SELECT status FROM runs WHERE id = $1", rid)
            return status in ("succeeded", "dead")

        await wait_until(lambda: finished(first_run), timeout=30, what="the two-step run")
        second_run = await factories.pending_run(pool, ids[1])
        await wait_until(lambda: finished(second_run), timeout=30, what="the over-budget run")
    finally:
        service.stop()
    won = await pool.fetchrow("SELECT status, tokens, cost, usage FROM runs WHERE id = $1",
                              first_run)  # fmt: skip
    assert won is not None and won["status"] == "succeeded"
    assert (won["usage"]["prompt_tokens"], won["usage"]["completion_tokens"]) == (230, 27)
    assert won["tokens"] == 257 and won["cost"] == pytest.approx((230 * 2 + 27 * 8) / 1e6)
    dead = await pool.fetchrow("SELECT status, tokens, cost FROM runs WHERE id = $1", second_run)
    attempt = await pool.fetchval("SELECT usage FROM run_attempts WHERE run_id = $1", second_run)
    assert dead is not None and dead["status"] == "dead"
    assert (attempt["prompt_tokens"], attempt["completion_tokens"]) == (400, 50)
    assert dead["tokens"] == 450 and dead["cost"] == pytest.approx((400 * 2 + 50 * 8) / 1e6)


@pytest.mark.slow
async def test_an_agent_attempt_that_times_out_keeps_the_usage_of_its_steps(
    dsn: str,
    pool: asyncpg.Pool[Any],
    tmp_path: Path,
    fake: fake_server.FakeOpenAI,
    pages: site.Pages,
) -> None:
    look = fake_server.tool_calls(("http_get", {"url": pages.url("/page")}))
    # Two model steps report their usage, then the third model call never answers.
    fake.script(
        dataclasses.replace(look, usage={"prompt_tokens": 100, "completion_tokens": 20}),
        dataclasses.replace(look, usage={"prompt_tokens": 130, "completion_tokens": 7}),
        fake_server.hang(),
    )
    env = {
        **provider_env(fake.base_url, timeout="30s"),
        "PROMPTSCHED_TOOLS_ALLOW": "127.0.0.1/32",
        "PROMPTSCHED_PRICES": f"{PROVIDER}=2/8",
    }
    sid = await pool.fetchval(
        "INSERT INTO schedules (name, kind, expression, prompt, provider, params, "
        "max_attempts, timeout) VALUES ('slow agent', 'cron', '0 0 1 1 *', 'weather?', $1, "
        "$2::jsonb, 1, interval '2 seconds') RETURNING id",
        PROVIDER, {"tools": ["http_get"], "max_steps": 5},
    )  # fmt: skip
    service = Service(dsn, tmp_path / "service.log", env=env)
    try:
        await service.ready()
        rid = await factories.pending_run(pool, sid)

        async def dead() -> bool:
            status = await pool.fetchval("SELECT status FROM runs WHERE id = $1", rid)
            return status == "dead"

        await wait_until(dead, timeout=30, what="the timed-out run")
    finally:
        service.stop()
    assert len(fake.requests) == 3  # the third step was under way when the time ran out
    attempt = await pool.fetchrow(
        "SELECT status, error, usage FROM run_attempts WHERE run_id = $1", rid
    )
    assert attempt is not None and attempt["status"] == "failed"
    # The agent stops itself just before the schedule's timeout, saying which budget ran out.
    assert attempt["error"] == "agent: time budget of 2s exceeded (the schedule's timeout)"
    usage = attempt["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (100 + 130, 20 + 7)
    assert usage["total_tokens"] == 257
    assert usage["cost"] == pytest.approx((230 * 2 + 27 * 8) / 1e6)
    run = await pool.fetchrow("SELECT tokens, cost FROM runs WHERE id = $1", rid)
    assert run is not None and run["tokens"] == 257
    assert run["cost"] == pytest.approx((230 * 2 + 27 * 8) / 1e6)


def _series(metrics: Metrics) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {
        (sample.name, tuple(sorted(sample.labels.items())))
        for family in metrics.registry.collect()
        for sample in family.samples
    }


async def test_no_schedule_creates_a_series_whatever_model_it_names(
    pool: asyncpg.Pool[Any], api: Api
) -> None:
    # The model label takes the price table's and the providers' models, else "other": a user
    # naming a new model per schedule grows no series (DESIGN: bounded labels).
    metrics = Metrics()
    worker = factories.worker_pool(pool, Clock(), metrics, prices=PRICES)
    before = _series(metrics)
    alice = await api.token("alice")
    models = ["gpt-4o", "x" * 200, "../../etc", "model-1", "model-2", "模型"]
    for n, model in enumerate(models):
        body = {**SCHEDULE, "name": f"s{n}", "model": model, "params": {"fail_attempts": n % 2}}
        created = await api.post("/v1/schedules", alice, json=body)
        assert created.status == 201, created.body
        assert (await api.post(f"/v1/schedules/{created.body['id']}/trigger", alice)).status == 201
    await worker.run_once()
    finished = await pool.fetchval("SELECT count(*) FROM run_attempts WHERE status <> 'running'")
    assert finished == len(models)
    assert _series(metrics) == before
    labels = {"provider": "echo", "model": "other"}
    assert _sample(metrics, "promptsched_llm_tokens_total", **labels, kind="prompt") > 0
    assert _sample(metrics, "promptsched_llm_cost_total", **labels) > 0
