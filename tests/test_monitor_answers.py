"""Answers in a schema and the notification decision, through a real WorkerPool and Postgres
against the scripted OpenAI-compatible fake (docs/monitors.md): the response_format sent, an
invalid answer asked again once with its problem then dead naming the path, the json_object
fallback, the webhook provider's schema and second chance, and the decisions each finish
records (a condition, and `changed` against the schedule's memory) with the outbox rows they
owe."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import asyncpg

from promptsched import netguard
from promptsched.clock import FrozenClock
from promptsched.executors.settings import parse_providers
from promptsched.executors.webhook_provider import WebhookExecutor
from tests import factories
from tests.factories import EPOCH, run_row
from tests.fakes import openai_server as fake_server
from tests.test_executors_webhook import make_request
from tests.test_monitor_rules import STATUS
from tests.test_providers_integration import fake_run, fake_workers

OK = '{"status": "ok", "degraded": false}'
BAD = '{"status": "fine", "degraded": false}'
EMAIL = {"email": ["ops@example.com"]}


async def test_the_schema_is_asked_for_and_a_bad_answer_is_asked_again_once(
    pool: asyncpg.Pool[Any], fake: fake_server.FakeOpenAI
) -> None:
    fake.script(fake_server.ok("All good!"), fake_server.ok(OK))
    rid = await fake_run(pool, prompt="Read the status page", output_schema=STATUS)
    async with fake_workers(pool, FrozenClock(EPOCH), fake.base_url) as workers:
        assert await workers.run_once() == 1
    run = await run_row(pool, rid)
    assert (run["status"], run["output"]) == ("succeeded", OK)
    assert run["output_json"] == {"status": "ok", "degraded": False}
    assert run["usage"]["total_tokens"] == 20  # both asks
    first, second = (r.json for r in fake.requests)
    # The shape OpenAI documents for structured outputs.
    assert first["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": STATUS, "strict": True},
    }
    assert first["messages"] == [{"role": "user", "content": "Read the status page"}]
    assert second["messages"][:2] == [
        *first["messages"],
        {"role": "assistant", "content": "All good!"},
    ]
    assert second["messages"][2]["role"] == "user"
    assert "the answer is not JSON" in second["messages"][2]["content"]
    assert second["response_format"] == first["response_format"]


async def test_two_bad_answers_end_the_run_dead_naming_the_path(
    pool: asyncpg.Pool[Any], fake: fake_server.FakeOpenAI
) -> None:
    fake.script(fake_server.ok(BAD), fake_server.ok(BAD))
    rid = await fake_run(pool, prompt="Read", output_schema=STATUS, max_attempts=3)
    async with fake_workers(pool, FrozenClock(EPOCH), fake.base_url) as workers:
        assert await workers.run_once() == 1
    run = await run_row(pool, rid)
    assert (run["status"], run["attempts"]) == ("dead", 1)  # permanent: no further attempt
    assert run["error"] == (
        "fake: the answer does not match the output_schema at /status: 'fine' is not one of "
        "['ok', 'degraded'] (asked twice)"
    )
    assert "at /status" in fake.requests[1].json["messages"][-1]["content"]
    assert run["output_json"] is None and run["notify_decision"] is None


async def test_the_json_object_fallback_and_a_schema_strict_mode_cannot_take(
    pool: asyncpg.Pool[Any], fake: fake_server.FakeOpenAI
) -> None:
    loose = {**STATUS, "required": ["status"]}  # not every property required: not strict
    fake.script(fake_server.ok(OK), fake_server.ok(f"```json\n{OK}\n```"))
    first = await fake_run(pool, prompt="A", output_schema=loose)
    async with fake_workers(pool, FrozenClock(EPOCH), fake.base_url) as workers:
        assert await workers.run_once() == 1
    second = await fake_run(pool, prompt="B", output_schema=STATUS)
    async with fake_workers(
        pool, FrozenClock(EPOCH), fake.base_url, structured_output="json_object"
    ) as workers:
        assert await workers.run_once() == 1
    assert (await run_row(pool, first))["status"] == "succeeded"
    assert (await run_row(pool, second))["output_json"] == json.loads(OK)
    loose_request, fallback = (r.json for r in fake.requests)
    assert loose_request["response_format"]["json_schema"]["strict"] is False
    assert fallback["response_format"] == {"type": "json_object"}
    system, user = fallback["messages"]
    assert system["role"] == "system" and "JSON Schema" in system["content"]
    assert json.loads(system["content"].split(": ", 1)[1]) == STATUS
    assert user == {"role": "user", "content": "B"}


async def test_the_webhook_provider_gets_the_schema_and_a_second_chance(
    pool: asyncpg.Pool[Any], fake: fake_server.FakeOpenAI
) -> None:
    settings = parse_providers({
        "PROMPTSCHED_PROVIDERS": "hook", "PROMPTSCHED_PROVIDER_HOOK_KIND": "webhook",
        "PROMPTSCHED_PROVIDER_HOOK_BASE_URL": fake.webhook_url,
    })["hook"]  # fmt: skip
    fake.script(
        fake_server.ok("not json"), fake_server.reply(json.dumps({"output": json.loads(OK)}))
    )
    executor = WebhookExecutor(
        settings, allow=netguard.Allowlist.parse("127.0.0.1", variable=netguard.WEBHOOK_ALLOW)
    )
    try:
        result = await executor.execute(make_request(output_schema=STATUS))
    finally:
        await executor.aclose()
    assert result.data == json.loads(OK)
    first, second = (r.json for r in fake.requests)
    assert first["output_schema"] == STATUS and "validation_error" not in first
    assert second["validation_error"].startswith("the answer is not JSON")
    assert second["previous_output"] == "not json"


async def _decisions(pool: asyncpg.Pool[Any], sid: int) -> list[tuple[Any, ...]]:
    rows = await pool.fetch(
        "SELECT r.id, r.notify_decision, (SELECT count(*) FROM outbox o WHERE o.run_id = r.id) "
        "AS owed FROM runs r WHERE r.schedule_id = $1 ORDER BY r.id", sid,
    )  # fmt: skip
    return [(r["id"], r["notify_decision"], r["owed"]) for r in rows]


async def _run(pool: asyncpg.Pool[Any], sid: int, hours: int, prompt: str) -> int:
    await pool.execute("UPDATE schedules SET prompt = $2 WHERE id = $1", sid, prompt)
    at = EPOCH + timedelta(hours=hours)
    rid = await factories.pending_run(pool, sid, at)
    assert await factories.worker_pool(pool, FrozenClock(at)).run_once() == 1
    return rid


async def test_a_condition_decides_in_the_finish_and_only_true_owes_a_message(
    pool: asyncpg.Pool[Any],
) -> None:
    sid = await factories.schedule(
        pool, output_schema=STATUS, notify_when="/degraded", notify=EMAIL
    )
    quiet = await _run(pool, sid, 0, OK)
    loud = await _run(pool, sid, 1, '{"status": "degraded", "degraded": true}')
    reason_of = {"when": "/degraded"}
    assert await _decisions(pool, sid) == [
        (quiet, {"notify": False, "reason": "/degraded is false", **reason_of}, 0),
        (loud, {"notify": True, "reason": "/degraded is true", **reason_of}, 1),
    ]
    details = await pool.fetchval("SELECT details FROM outbox WHERE run_id = $1", loud)
    assert details == {"notify": True, "reason": "/degraded is true", "when": "/degraded"}


async def test_changed_compares_with_the_schedules_memory_in_the_finish(
    pool: asyncpg.Pool[Any],
) -> None:
    sid = await factories.schedule(pool, notify_when="changed", notify=EMAIL)
    a = await _run(pool, sid, 0, "All good.")
    b = await _run(pool, sid, 1, "All   good.\n")  # the same after normalisation
    c = await _run(pool, sid, 2, "All good.")
    d = await _run(pool, sid, 3, "Degraded: eu-west.")
    e = await _run(pool, sid, 4, "All good.")
    seen = await _decisions(pool, sid)
    assert [(r, d["notify"], d["reason"], d.get("since"), owed) for r, d, owed in seen] == [
        (a, True, "first output: nothing to compare with", None, 1),
        (b, False, f"output unchanged since run {a}", a, 0),
        (c, False, f"output unchanged since run {a}", a, 0),
        (d, True, f"output changed since run {a}", a, 1),
        (e, True, f"output changed since run {d}", d, 1),
    ]
    memory = await pool.fetchrow("SELECT run_id FROM monitor_memory WHERE schedule_id = $1", sid)
    assert memory["run_id"] == e


async def test_changed_at_a_pointer_ignores_the_rest(pool: asyncpg.Pool[Any]) -> None:
    schema = {"type": "object", "properties": {"status": {"type": "string"},
                                               "checked": {"type": "string"}}}  # fmt: skip
    sid = await factories.schedule(pool, output_schema=schema, notify_when="changed /status")
    a = await _run(pool, sid, 0, '{"status": "ok", "checked": "09:00"}')
    b = await _run(pool, sid, 1, '{"status": "ok", "checked": "10:00"}')
    c = await _run(pool, sid, 2, '{"checked": "11:00"}')
    seen = [(r, d["reason"]) for r, d, _ in await _decisions(pool, sid)]
    assert seen == [
        (a, "first /status: nothing to compare with"),
        (b, f"/status unchanged since run {a}"),
        (c, f"/status changed since run {a}"),
    ]


CODE = {
    "type": "object",
    "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"}},
    "required": ["code"],
    "additionalProperties": False,
}


async def test_a_pattern_that_backtracks_ends_the_run_dead_and_a_plain_one_still_checks(
    pool: asyncpg.Pool[Any], fake: fake_server.FakeOpenAI
) -> None:
    hostile = {**CODE, "properties": {"code": {"type": "string", "pattern": "^(a+)+$"}}}
    # ``re`` alone would take minutes on this answer (tests/test_output_patterns.py).
    fake.script(
        fake_server.ok(json.dumps({"code": "a" * 32 + "!"})),
        fake_server.ok('{"code": "abc-1"}'),
        fake_server.ok('{"code": "ABC-12"}'),
    )
    slow = await fake_run(pool, prompt="Slow", output_schema=hostile, max_attempts=3)
    async with fake_workers(pool, FrozenClock(EPOCH), fake.base_url, timeout="20s") as workers:
        assert await workers.run_once() == 1
        plain = await fake_run(pool, prompt="Plain", output_schema=CODE)
        assert await workers.run_once() == 1
    dead = await run_row(pool, slow)
    assert (dead["status"], dead["attempts"]) == ("dead", 1)  # permanent: asked once, no retry
    assert dead["error"].startswith(
        "fake: the output_schema's patterns took longer than 0.5 s on this answer: simplify "
        "the pattern at /properties/code/pattern"
    )
    spent = await pool.fetchval("SELECT usage FROM ended_attempts WHERE run_id = $1", slow)
    assert spent["total_tokens"] == 10  # the answer's tokens are still counted
    done = await run_row(pool, plain)
    assert (done["status"], done["output_json"]) == ("succeeded", {"code": "ABC-12"})
    again = fake.requests[2].json["messages"][-1]["content"]
    assert "at /code: 'abc-1' does not match '^[A-Z]{3}-[0-9]+$'" in again
