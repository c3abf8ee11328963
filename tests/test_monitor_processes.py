"""Monitors end to end with real processes (docs/monitors.md): a real `promptsched run` asks a
scripted OpenAI-compatible server for answers in a schema and notifies a real SMTP server
(aiosmtpd) and a webhook receiver that verifies the Standard Webhooks signature. The script:
a first answer, unchanged, unchanged, changed, invalid JSON then valid (changed again), and on
a second schedule a condition false, then true. Exactly the four expected notifications reach
each receiver, once each, with the changed paths in them; the skipped runs carry their
reasons; the response_format the server received is the shape OpenAI documents."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import standardwebhooks

from promptsched.ops import notify_targets
from promptsched.store import queries
from tests import factories
from tests.fakes import openai_server as fake_server
from tests.fakes.http_sink import HttpSink
from tests.fakes.smtp import FakeSMTP, start_fake_smtp
from tests.helpers import Service, run_cli, wait_until
from tests.test_monitor_rules import STATUS
from tests.test_providers_integration import PROVIDER, provider_env

OK = {"status": "ok", "degraded": False}
DOWN = {"status": "degraded", "degraded": True}


@pytest.fixture
async def smtp() -> AsyncIterator[FakeSMTP]:
    async with start_fake_smtp() as server:
        yield server


async def _monitor(pool: asyncpg.Pool[Any], notify_when: str, notify: dict[str, Any]) -> int:
    sid = await factories.schedule(
        pool, prompt="Read the status page", output_schema=STATUS, notify_when=notify_when,
        notify=notify, max_attempts=1,
    )  # fmt: skip
    await pool.execute("UPDATE schedules SET provider = $2 WHERE id = $1", sid, PROVIDER)
    return sid


async def _step(pool: asyncpg.Pool[Any], sid: int, *answers: str) -> int:
    """One run of the schedule, answered by ``answers`` in turn; its id once it finished and
    every notification it owes is sent."""
    [fake] = _FAKE
    fake.script(*(fake_server.ok(answer) for answer in answers))
    now = await pool.fetchval("SELECT now()")
    rid = await factories.pending_run(pool, sid, now, "manual")
    await queries.run_notify_ready(pool, "test")

    async def settled() -> bool:
        row = await pool.fetchrow(
            "SELECT r.status, (SELECT count(*) FROM outbox o WHERE o.run_id = r.id "
            "AND o.status <> 'sent') AS unsent FROM runs r WHERE r.id = $1", rid,
        )  # fmt: skip
        assert row is not None and row["status"] not in ("dead", "cancelled"), row
        return row["status"] == "succeeded" and row["unsent"] == 0

    await wait_until(settled, timeout=20, what=f"run {rid} finished and its messages sent")
    return rid


_FAKE: list[fake_server.FakeOpenAI] = []


@pytest.mark.slow
async def test_a_monitor_notifies_exactly_when_it_should(
    dsn: str,
    pool: asyncpg.Pool[Any],
    fake: fake_server.FakeOpenAI,
    smtp: FakeSMTP,
    sink: HttpSink,
    tmp_path: Path,
) -> None:
    _FAKE[:] = [fake]
    secret = notify_targets.new_secret()
    notify = {"email": ["ops@example.com"], "webhook": {"url": sink.url, "secret": secret}}
    watch = await _monitor(pool, "changed", notify)
    alarm = await _monitor(pool, "/degraded", notify)
    env = {**provider_env(fake.base_url, timeout="5s"), **smtp.env(),
           "PROMPTSCHED_WEBHOOK_ALLOW": "127.0.0.1/32"}  # fmt: skip
    service = Service(dsn, tmp_path / "service.log", env=env)
    try:
        await service.ready()
        first = await _step(pool, watch, json.dumps(OK))
        same = await _step(pool, watch, json.dumps(OK))
        reordered = await _step(pool, watch, '{"degraded": false,\n  "status": "ok"}')
        changed = await _step(pool, watch, json.dumps(DOWN))
        repaired = await _step(pool, watch, "Everything is fine now!", json.dumps(OK))
        calm = await _step(pool, alarm, json.dumps(OK))
        loud = await _step(pool, alarm, json.dumps(DOWN))
    finally:
        assert service.stop() == 0
    notified = [first, changed, repaired, loud]

    # Exactly the expected messages, once each, at both receivers.
    assert sorted(int(m.message["X-Promptsched-Run"]) for m in smtp.received) == notified
    receiver = standardwebhooks.Webhook(secret)
    payloads = [receiver.verify(r.body, dict(r.headers)) for r in sink.requests]
    assert sorted(p["run"]["id"] for p in payloads) == notified
    assert len({p["id"] for p in payloads}) == 4
    by_run = {p["run"]["id"]: p for p in payloads}
    mail = {int(m.message["X-Promptsched-Run"]): m.message for m in smtp.received}

    # What changed, in each message.
    assert by_run[changed]["changes"] == {"since_run": first, "paths": [
        {"path": "/status", "old": "ok", "new": "degraded"},
        {"path": "/degraded", "old": False, "new": True},
    ]}  # fmt: skip
    assert by_run[changed]["output_json"] == DOWN
    assert by_run[changed]["notify"]["reason"] == f"output changed since run {first}"
    assert by_run[repaired]["changes"]["since_run"] == changed
    assert by_run[first]["changes"] is None
    assert by_run[first]["notify"]["reason"] == "first output: nothing to compare with"
    assert by_run[loud]["notify"]["reason"] == "/degraded is true"
    text = mail[changed].get_body(("plain",)).get_content()
    assert f"Why:      output changed since run {first}" in text
    assert '/status: "ok" → "degraded"' in text and "/degraded: false → true" in text
    assert "CHANGED" in str(mail[changed]["Subject"])
    assert "/degraded is true" in mail[loud].get_body(("plain",)).get_content()

    # The skipped runs say why, in the ledger and on the command line.
    reasons = {
        r["id"]: (r["notify_decision"]["notify"], r["notify_decision"]["reason"])
        for r in await pool.fetch("SELECT id, notify_decision FROM runs")
    }
    assert reasons[same] == reasons[reordered] == (False, f"output unchanged since run {first}")
    assert reasons[calm] == (False, "/degraded is false")
    shown = run_cli("runs", "list", "--schedule", str(alarm), dsn=dsn)
    assert "not notified: /degraded is false" in shown.stdout, shown.stderr
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE run_id = ANY($1)",
                               [same, reordered, calm]) == 0  # fmt: skip

    # The server was asked in OpenAI's structured-outputs shape, and told what was wrong once.
    asked = [r.json for r in fake.requests]
    assert len(asked) == 8  # seven runs, one of them asked twice
    assert all(
        a["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": STATUS, "strict": True},
        } for a in asked
    )  # fmt: skip
    repair = asked[5]["messages"]
    assert repair[1] == {"role": "assistant", "content": "Everything is fine now!"}
    assert "the answer is not JSON" in repair[2]["content"]
