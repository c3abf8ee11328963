"""The schedule's memory (docs/monitors.md): ``previous_output``, ``previous_run_at`` and
``previous_slot`` render from the previous successful run in a plain prompt, an agent run and a
follow-up's check; a first run sees them empty; a long previous output is cut with a marker."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import asyncpg

from promptsched.clock import FrozenClock
from promptsched.executors import template
from promptsched.metrics import Metrics
from promptsched.roles.scheduler import Scheduler
from tests import api_support, factories
from tests.factories import EPOCH, run_row
from tests.fakes import openai_server as fake_server
from tests.fakes import pages as site
from tests.test_agent import agent_workers
from tests.test_providers_integration import fake_run

MEMORY = "at {{ slot }} after {{ previous_slot }} ({{ previous_run_at }}): {{ previous_output }}"


async def test_a_first_run_sees_empty_memory_and_the_next_sees_the_previous_success(
    pool: asyncpg.Pool[Any],
) -> None:
    sid = await factories.schedule(pool, prompt=MEMORY, timezone="Europe/Paris")
    first = await factories.pending_run(pool, sid)
    assert await factories.worker_pool(pool, FrozenClock(EPOCH)).run_once() == 1
    assert (await run_row(pool, first))["output"] == (
        "echo: at 2026-03-02T10:00:00+01:00 after  (): "
    )

    # A failed run in between is not the memory: the last success is.
    failed = await factories.pending_run(pool, sid, EPOCH + timedelta(hours=1))
    await pool.execute("UPDATE runs SET status = 'dead', output = 'no' WHERE id = $1", failed)
    later = EPOCH + timedelta(days=1)
    second = await factories.pending_run(pool, sid, later)
    assert await factories.worker_pool(pool, FrozenClock(later)).run_once() == 1
    assert (await run_row(pool, second))["output"] == (
        "echo: at 2026-03-03T10:00:00+01:00 after 2026-03-02T10:00:00+01:00 "
        "(2026-03-02T10:00:00+01:00): echo: at 2026-03-02T10:00:00+01:00 after  (): "
    )


async def test_a_long_previous_output_is_cut_with_a_marker(pool: asyncpg.Pool[Any]) -> None:
    sid = await factories.schedule(pool, prompt="{{ previous_output }}")
    long = "x" * (template.PREVIOUS_OUTPUT_CHARS - 1) + "yz" + "w" * 4_999
    await pool.execute(
        "INSERT INTO runs (schedule_id, slot, provider, max_attempts, status, output, "
        "finished_at) VALUES ($1, $2, 'echo', 3, 'succeeded', $3, $2)",
        sid, EPOCH - timedelta(days=1), long,
    )  # fmt: skip
    rid = await factories.pending_run(pool, sid)
    assert await factories.worker_pool(pool, FrozenClock(EPOCH)).run_once() == 1
    output = (await run_row(pool, rid))["output"]
    assert output == "echo: " + long[: template.PREVIOUS_OUTPUT_CHARS] + (
        "\n[... 5,000 more characters cut]"
    )
    assert output.endswith("y\n[... 5,000 more characters cut]")

    # Exactly the limit is not cut.
    await pool.execute("UPDATE runs SET output = $1 WHERE id = $2", "q" * 20_000, rid)
    again = await factories.pending_run(pool, sid, EPOCH + timedelta(days=1))
    assert await factories.worker_pool(pool, FrozenClock(EPOCH + timedelta(days=1))).run_once()
    assert (await run_row(pool, again))["output"] == "echo: " + "q" * 20_000


async def test_an_agent_run_sees_its_previous_answer(
    pool: asyncpg.Pool[Any], fake: fake_server.FakeOpenAI, pages: site.Pages
) -> None:
    fake.script(
        fake_server.ok("Prices: basic 10 EUR."),
        fake_server.tool_calls(("http_get", {"url": pages.url("/page")})),
        fake_server.ok("Prices: basic 12 EUR."),
    )
    params = {"tools": ["http_get"], "max_steps": 3}
    prompt = "Last time ({{ previous_slot }}) you said: {{ previous_output }}. What changed?"
    first = await fake_run(pool, prompt=prompt, params=params)
    sid = (await run_row(pool, first))["schedule_id"]
    async with agent_workers(pool, FrozenClock(EPOCH), fake.base_url) as workers:
        assert await workers.run_once() == 1
    later = EPOCH + timedelta(days=1)
    second = await factories.pending_run(pool, sid, later)
    async with agent_workers(pool, FrozenClock(later), fake.base_url) as workers:
        assert await workers.run_once() == 1
    assert (await run_row(pool, second))["output"] == "Prices: basic 12 EUR."
    asked = [r.json["messages"][0]["content"] for r in fake.requests]
    assert asked == [
        "Last time () you said: . What changed?",
        f"Last time ({EPOCH.isoformat()}) you said: Prices: basic 10 EUR.. What changed?",
        f"Last time ({EPOCH.isoformat()}) you said: Prices: basic 10 EUR.. What changed?",
    ]


async def test_a_followups_check_sees_its_previous_checks_output(pool: asyncpg.Pool[Any]) -> None:
    t0 = EPOCH
    prompt = (
        "Order {{ order }}: before {{ previous_slot }}: [{{ previous_output }}]\n"
        '```json\n{"recheck_in": "1h"}\n```'
    )
    body = {"key": "order-9", "in": "1m", "prompt": prompt, "vars": {"order": 9}, "max_checks": 2}
    async with api_support.client(pool, clock=FrozenClock(t0)) as api:
        who = await api.token("shop")
        placed = await api.post("/v1/followups", who, json=body)
        assert placed.status == 201, placed.body
        # Its schedule is a monitor too: each check's answer compared with the last told.
        sid = await pool.fetchval("SELECT schedule_id FROM followups")
        edited = await api.patch(f"/v1/schedules/{sid}", who, json={"notify_when": "changed"})
        assert edited.status == 200, edited.body
    due = t0 + timedelta(minutes=1)
    assert (await Scheduler(pool, FrozenClock(due), Metrics()).run_once()).enqueued == 1
    assert await factories.worker_pool(pool, FrozenClock(due)).run_once() == 1
    recheck = due + timedelta(hours=1)
    assert await factories.worker_pool(pool, FrozenClock(recheck)).run_once() == 1
    first, second = await pool.fetch("SELECT origin, slot, output FROM runs ORDER BY id")
    assert second["origin"] == "check" and second["slot"] == recheck
    assert first["output"].startswith("echo: Order 9: before : []\n")
    assert second["output"].startswith(
        f"echo: Order 9: before {due.isoformat()}: [{first['output']}]\n"
    )
    decisions = [r["notify_decision"]["reason"] for r in await pool.fetch(
        "SELECT notify_decision FROM runs ORDER BY id")]  # fmt: skip
    assert decisions[0] == "first output: nothing to compare with"
    assert decisions[1].startswith("output changed since run")  # it quotes the first
