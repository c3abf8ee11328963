"""Isolation of failure (docs/reliability.md): nothing a provider returns fails another run's
write. Answers no Postgres text or jsonb can hold (a NUL, a lone surrogate, bytes that are not
UTF-8) are stored cleaned and counted; a final write Postgres still refuses ends its own run
with the true reason while the rest of its batch lands; no provider is called twice for one
answer. Real service processes against a scripted webhook provider shared by two owners, and
the finalizer against the real database."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

from promptsched import netguard, retry, storable
from promptsched.clock import Clock, FrozenClock
from promptsched.config import NotifierSettings
from promptsched.delivery.webhook import WebhookSender
from promptsched.domain import AttemptStatus, RunStatus
from promptsched.executors import http_client
from promptsched.executors.base import Step
from promptsched.metrics import Metrics
from promptsched.ops import notify_targets
from promptsched.roles.notifier import Notifier
from promptsched.roles.scheduler import Scheduler
from promptsched.roles.worker.finalizer import Finalizer, Outcome, Refused
from promptsched.roles.worker.transcript import AttemptLog
from promptsched.store import queries
from tests import api_support, factories
from tests.api_support import Api
from tests.console_support import console
from tests.fakes.http_sink import HttpSink, Reply
from tests.fakes.openai_server import Behaviour, FakeOpenAI, RecordedRequest, raw, start_fake_openai
from tests.helpers import Service, run_cli, wait_until

BOB_SCHEDULES = 8
FINE = b'{"output": "fine", "usage": {"prompt_tokens": 2, "completion_tokens": 1}}'
# Alice's answers, each as its provider sent it: the body, its content type, what the run
# must store, and how many characters had to be replaced.
POISONS: dict[str, tuple[bytes, str, str, int]] = {
    "nul": (
        b'{"output": "a NUL \\u0000 here", "usage": {"prompt_tokens": 1, "odd\\u0000key": 2}}',
        "application/json",
        "a NUL \ufffd here",
        2,  # one in the output, one in a key of its usage (jsonb holds neither)
    ),
    "surrogate": (
        b'{"output": "a lone \\ud800 surrogate"}',
        "application/json",
        "a lone \ufffd surrogate",
        1,
    ),
    "bytes": (
        b"not UTF-8: \xff\xfe, and a raw NUL: \x00.",
        "text/plain; charset=utf-8",
        "not UTF-8: \ufffd\ufffd, and a raw NUL: \ufffd.",
        3,
    ),
}
# A number the provider reports that no bigint holds: the run's token total refuses it.
OVERFLOW = (
    b'{"output": "fine", "usage": {"prompt_tokens": 1, "completion_tokens": 1, '
    b'"total_tokens": 100000000000000000000}}'
)


def _env(fake: FakeOpenAI) -> dict[str, str]:
    return {
        "PROMPTSCHED_PROVIDERS": "hook",
        "PROMPTSCHED_PROVIDER_HOOK_KIND": "webhook",
        "PROMPTSCHED_PROVIDER_HOOK_BASE_URL": fake.webhook_url,
        "PROMPTSCHED_PROVIDER_HOOK_MAX_CONCURRENCY": "32",
        "PROMPTSCHED_WEBHOOK_ALLOW": "127.0.0.1/32",
        "PROMPTSCHED_WORKERS": "32",
    }


async def _schedule(pool: asyncpg.Pool[Any], owner: str, prompt: str, at: datetime) -> int:
    """One slot, at ``at``, on the shared provider, with two attempts."""
    sid = await factories.schedule(
        pool, kind="at", expression=at.isoformat(), prompt=prompt, max_attempts=2, next_fire_at=at,
        name=f"{owner} {prompt}",
    )  # fmt: skip
    await pool.execute(
        "UPDATE schedules SET owner = $2, provider = 'hook' WHERE id = $1", sid, owner
    )
    await queries.schedule_notify_changed(pool, sid)
    return sid


async def _one_slot_each(
    dsn: str,
    pool: asyncpg.Pool[Any],
    fake: FakeOpenAI,
    tmp_path: Path,
    answers: dict[str, tuple[bytes, str]],
) -> tuple[dict[str, asyncpg.Record], dict[int, list[RecordedRequest]], Service]:
    """Bob's schedules and Alice's (one per entry of ``answers``, by prompt) all due in the
    same second on one provider, which holds every request until all of them arrived and
    then answers them together, so their final writes queue up as one batch. Returns each
    schedule's run by prompt, the provider's requests by run, and the stopped service."""
    group = BOB_SCHEDULES + len(answers)

    def route(request: RecordedRequest) -> Behaviour:
        body, content_type = answers.get(request.json["prompt"], (FINE, "application/json"))
        return raw(body, content_type, group=group)

    fake.route = route
    svc = Service(dsn, tmp_path / "svc.log", env=_env(fake))
    try:
        await svc.ready()
        at = await pool.fetchval("SELECT date_trunc('second', now()) + interval '2 seconds'")
        ids = [await _schedule(pool, "bob", f"bob {i}", at) for i in range(BOB_SCHEDULES)]
        ids += [await _schedule(pool, "alice", prompt, at) for prompt in answers]

        async def finished() -> bool:
            done = await pool.fetchval(
                "SELECT count(*) FROM runs WHERE schedule_id = ANY($1) "
                "AND status IN ('succeeded', 'dead')",
                ids,
            )
            return bool(done == len(ids))

        await wait_until(finished, timeout=45, what="every schedule's one run to finish")
    finally:
        assert svc.stop() == 0
    rows = await pool.fetch(
        "SELECT s.prompt, r.* FROM runs r JOIN schedules s ON s.id = r.schedule_id "
        "WHERE s.id = ANY($1)",
        ids,
    )
    assert len(rows) == len(ids)
    calls: dict[int, list[RecordedRequest]] = {}
    for request in fake.requests:
        calls.setdefault(request.json["run_id"], []).append(request)
    return {row["prompt"]: row for row in rows}, calls, svc


async def _bob_unharmed(
    pool: asyncpg.Pool[Any], runs: dict[str, asyncpg.Record], calls: dict[int, list[Any]]
) -> None:
    bob = [row for prompt, row in runs.items() if prompt.startswith("bob ")]
    assert len(bob) == BOB_SCHEDULES
    harmed = [
        (row["prompt"], row["status"], row["attempts"], row["error"])
        for row in bob
        if (row["status"], row["attempts"], row["output"], row["error"])
        != ("succeeded", 1, "fine", None)
    ]
    assert harmed == [], f"another owner's runs were harmed: {harmed}"
    assert all(len(calls[row["id"]]) == 1 for row in bob)
    lost = await pool.fetchval(
        "SELECT count(*) FROM ended_attempts WHERE run_id = ANY($1)", [row["id"] for row in bob]
    )
    assert lost == 0


@pytest.mark.slow
async def test_answers_postgres_cannot_hold_are_stored_cleaned_and_harm_no_other_owner(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    answers = {prompt: (body, kind) for prompt, (body, kind, _, _) in POISONS.items()}
    async with start_fake_openai() as fake:
        runs, calls, svc = await _one_slot_each(dsn, pool, fake, tmp_path, answers)
    await _bob_unharmed(pool, runs, calls)
    for prompt, (_, _, stored, count) in POISONS.items():
        row = runs[prompt]
        got = (row["status"], row["attempts"], row["output"], row["cleaned_chars"], row["error"])
        assert got == ("succeeded", 1, stored, count, None), prompt
        assert len(calls[row["id"]]) == 1, f"{prompt}: the provider was called again"
    assert runs["nul"]["usage"] == {"prompt_tokens": 1, "odd\ufffdkey": 2, "total_tokens": 1}
    # Cleaned where they entered: no write needed isolating.
    assert svc.has_event("finalizer.batch_refused") is None
    # The count is shown where the run is shown.
    shown = run_cli("runs", "show", str(runs["bytes"]["id"]), dsn=dsn)
    assert shown.returncode == 0, shown.stderr
    assert "3 characters could not be stored as sent" in shown.stdout


@pytest.mark.slow
async def test_a_write_postgres_refuses_fails_alone_with_its_true_reason(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    async with start_fake_openai() as fake:
        runs, calls, svc = await _one_slot_each(
            dsn, pool, fake, tmp_path, {"overflow": (OVERFLOW, "application/json")}
        )
    await _bob_unharmed(pool, runs, calls)
    row = runs["overflow"]
    assert (row["status"], row["attempts"], row["output"]) == ("dead", 1, None)
    assert row["error"].startswith("could not store the attempt's result, the database refused")
    assert "out of range" in row["error"] and "lease" not in row["error"]
    assert len(calls[row["id"]]) == 1, "the provider was called again for one answer"
    assert svc.has_event("finalizer.write_refused", run_id=row["id"]) is not None
    # Its attempt is recorded with the reason, so the run's history says what happened.
    ended = await pool.fetchrow(
        "SELECT status, error FROM ended_attempts WHERE run_id = $1", row["id"]
    )
    assert ended is not None and ended["status"] == "failed" and "out of range" in ended["error"]


async def test_the_finalizer_writes_a_batch_without_the_one_write_postgres_refuses(
    pool: asyncpg.Pool[Any],
) -> None:
    # Twelve attempts of two owners' schedules end in one batch; the seventh reports a token
    # count no bigint holds, so Postgres refuses the whole statement.
    alice, bob = await factories.schedule(pool), await factories.schedule(pool)
    for sid in (alice, bob):
        for hour in range(6):
            await factories.pending_run(pool, sid, factories.EPOCH.replace(hour=hour))
    claimed = await queries.run_claim_batch(pool, None, "echo", 12, "w", timedelta(seconds=30))
    assert len(claimed) == 12
    poisoned = claimed[6].id
    batch = [
        queries.Finish(
            run.id,
            run.attempt_id,
            RunStatus.SUCCEEDED,
            AttemptStatus.SUCCEEDED,
            output=f"answer {run.id}",
            usage={"total_tokens": 10**20 if run.id == poisoned else 3},
        )  # fmt: skip
        for run in claimed
    ]
    fates: dict[int, Outcome] = {}
    finalizer = Finalizer(pool, Clock(), "w")

    def reporter(run_id: int) -> Callable[[Outcome], None]:
        return lambda fate: fates.__setitem__(run_id, fate)

    for item in batch:  # all queued before the writer starts: one batch
        finalizer.submit(item, reporter(item.run_id))

    async def all_known() -> bool:
        return len(fates) == len(batch)

    async with anyio.create_task_group() as tg:
        await tg.start(finalizer.run)
        await wait_until(all_known, timeout=10, what="every write's fate")
        tg.cancel_scope.cancel()
    refused = fates.pop(poisoned)
    assert isinstance(refused, Refused) and refused.landed
    assert fates == {run.id: True for run in claimed if run.id != poisoned}
    rows = await pool.fetch("SELECT id, status, output, tokens, error FROM runs ORDER BY id")
    for row in rows:
        if row["id"] == poisoned:
            assert (row["status"], row["output"], row["tokens"]) == ("dead", None, 0)
            assert "out of range for type bigint" in row["error"]
        else:
            assert (row["status"], row["output"], row["tokens"], row["error"]) == (
                "succeeded", f"answer {row['id']}", 3, None,
            )  # fmt: skip
    assert await pool.fetchval("SELECT count(*) FROM runs WHERE lease_expires_at IS NOT NULL") == 0


async def test_a_transcript_step_quoting_unstorable_text_is_stored_cleaned_and_counted(
    pool: asyncpg.Pool[Any],
) -> None:
    rid = await factories.pending_run(pool, await factories.schedule(pool))
    [claimed] = await queries.run_claim_batch(pool, None, "echo", 1, "w", timedelta(seconds=30))
    record = AttemptLog(
        pool, Clock(), Metrics(), run_id=rid, attempt_id=claimed.attempt_id, attempt=1
    ).record
    step = Step(
        kind="tool_result", number=1, max_steps=4, tokens=3, text="fetched \x00 page",
        detail={"result": "lone \udc80 byte", "odd\x00key": [1.5, math.nan]},
    )  # fmt: skip
    with storable.counting() as tally:
        await record(step)
    transcript = await pool.fetchval(
        "SELECT transcript FROM run_attempts WHERE attempt_id = $1", claimed.attempt_id
    )
    assert len(transcript) == 1
    assert transcript[0]["text"] == "fetched \ufffd page"
    assert transcript[0]["result"] == "lone \ufffd byte"
    assert transcript[0]["odd\ufffdkey"] == [1.5, None]
    assert tally.count == 4


def test_clean_replaces_what_postgres_cannot_hold_and_keeps_clean_values_as_they_are() -> None:
    clean = {"output": "fine", "usage": {"prompt_tokens": 3}, "list": [1, 2.5, None, True]}
    with storable.counting() as tally:
        assert storable.clean(clean) is clean
        assert storable.clean("plain text é 😀") == "plain text é 😀"
        assert tally.count == 0
        dirty = {"a\x00": ("x\ud800", {"deep": [math.inf, "\udfff\x00"]})}
        assert storable.clean(dirty) == {"a\ufffd": ["x\ufffd", {"deep": [None, "\ufffd\ufffd"]}]}
        assert tally.count == 5
        assert storable.decode(b"ok \xc3\xa9 \xff", "utf-8") == "ok é \ufffd"
        assert storable.decode(b"caf\xe9", "latin-1") == "café"
        assert storable.decode(b"\xff", "no-such-charset") == "\ufffd"
        assert tally.count == 7
    # Nested as deep as a JSON parser allows, without recursion.
    deep: Any = "\x00"
    for _ in range(5000):
        deep = [deep]
    cleaned = storable.clean(deep)
    for _ in range(5000):
        cleaned = cleaned[0]
    assert cleaned == "\ufffd"
    # Every cleaned value can be stored: text and JSON both encode.
    json.dumps(storable.clean(dirty)).encode()


async def test_a_receivers_unstorable_answer_fails_no_other_notification(
    pool: asyncpg.Pool[Any], sink: HttpSink
) -> None:
    # Two owners' webhooks in one notifier batch: the first receiver answers 500 with a NUL in
    # its body, which the retry's error quotes; the other's notification is sent all the same.
    allow = netguard.Allowlist.parse("127.0.0.1/32", variable=netguard.WEBHOOK_ALLOW)
    clock = FrozenClock(factories.EPOCH)
    for owner in ("alice", "bob"):
        sid = await factories.schedule(pool, name=owner)
        notify = notify_targets.validate_targets({"webhook": {"url": sink.url}}, allow=allow)
        await pool.execute("UPDATE schedules SET notify = $2 WHERE id = $1", sid, notify)
        await factories.pending_run(pool, sid)
    assert await factories.worker_pool(pool, clock).run_once() == 2
    sink.script(Reply(500, body="receiver broke: \x00 here"), Reply(200))
    notifier = Notifier(
        pool, clock, Metrics(), {"webhook": WebhookSender(allow=allow, timeout=5.0)},
        NotifierSettings(lease=timedelta(seconds=60), timeout=timedelta(seconds=5),
                         max_attempts=3, retry_base=timedelta(seconds=10),
                         retry_max=timedelta(minutes=1)),
    )  # fmt: skip
    try:
        assert await notifier.run_once() == {"sent": 1, "retry": 1}
    finally:
        await notifier.aclose()
    rows = await pool.fetch("SELECT status, last_error FROM outbox ORDER BY status")
    assert [(row["status"], row["last_error"]) for row in rows] == [
        ("pending", "webhook: HTTP 500: receiver broke: \ufffd here"),
        ("sent", None),
    ]


def test_a_providers_reply_is_read_storable_where_it_enters() -> None:
    # The HTTP providers (openai, webhook and those to come) read every body through this.
    body = b'{"choices": [{"message": {"content": "x\\u0000y \\ud800"}}], "k\\u0000": 1}'
    reply = http_client.HttpReply(200, {}, body, "utf-8")
    with storable.counting() as tally:
        assert reply.json("p") == {"choices": [{"message": {"content": "x\ufffdy \ufffd"}}],
                                   "k\ufffd": 1}  # fmt: skip
        assert http_client.HttpReply(200, {}, b"a\xffb", None).text() == "a\ufffdb"
        assert http_client.body_excerpt(b"oops \x00 \xfe") == "oops \ufffd \ufffd"
    assert tally.count == 6


async def test_the_count_is_shown_where_a_run_is_shown(
    api: Api, alice: dict[str, str], pool: asyncpg.Pool[Any]
) -> None:
    made = await api.post(
        "/v1/schedules", alice, json={"name": "n", "cron": "0 9 * * *", "prompt": "p"}
    )
    trigger = await api.post(f"/v1/schedules/{made.body['id']}/trigger", alice)
    run_id = trigger.body["id"]
    await factories.worker_pool(pool, Clock()).run_once()
    assert (await api.get(f"/v1/runs/{run_id}", alice)).body["cleaned_chars"] is None
    # What the worker writes for an answer it had to clean (the service's test above).
    await pool.execute("UPDATE runs SET cleaned_chars = 3 WHERE id = $1", run_id)
    assert (await api.get(f"/v1/runs/{run_id}", alice)).body["cleaned_chars"] == 3
    async with console(pool) as ui:
        await ui.login_as("alice")
        page = await ui.get(f"/runs/{run_id}")
    assert page.status == 200
    assert "3 characters could not be stored as sent" in page.text


def test_a_retry_after_no_run_could_wait_for_is_read_as_a_day() -> None:
    # A header is the provider's to write: 10^20 seconds, or a date 8,000 years away, would
    # overflow the attempt's own arithmetic (a crash, then an attempt more) or its row.
    now = datetime(2026, 3, 2, tzinfo=UTC)
    for header in ("100000000000000000000", "Fri, 31 Dec 9999 23:59:59 GMT"):
        error = http_client.classify_status(429, {"Retry-After": header}, "", provider="p")
        assert error.retry_after == retry.MAX_RETRY_AFTER == 86_400
        assert "(retry after 1d)" in error.message
    assert http_client.parse_retry_after("120", now) == 120


async def test_a_receiver_asking_for_a_wait_no_clock_holds_delays_no_other_notification(
    pool: asyncpg.Pool[Any], sink: HttpSink
) -> None:
    # One owner's webhook answers 503 with a Retry-After of 10^20 seconds; the notification of
    # another owner in the same batch is sent, and this one waits a day, not forever (the wait
    # once overflowed and failed the whole batch, whose claims then expired: sent twice).
    allow = netguard.Allowlist.parse("127.0.0.1/32", variable=netguard.WEBHOOK_ALLOW)
    clock = FrozenClock(factories.EPOCH)
    for owner in ("alice", "bob"):
        sid = await factories.schedule(pool, name=owner)
        notify = notify_targets.validate_targets({"webhook": {"url": sink.url}}, allow=allow)
        await pool.execute("UPDATE schedules SET notify = $2 WHERE id = $1", sid, notify)
        await factories.pending_run(pool, sid)
    assert await factories.worker_pool(pool, clock).run_once() == 2
    sink.script(Reply(503, {"Retry-After": "100000000000000000000"}), Reply(200))
    notifier = Notifier(
        pool, clock, Metrics(), {"webhook": WebhookSender(allow=allow, timeout=5.0)},
        NotifierSettings(lease=timedelta(seconds=60), timeout=timedelta(seconds=5),
                         max_attempts=3, retry_base=timedelta(seconds=10),
                         retry_max=timedelta(minutes=1)),
    )  # fmt: skip
    try:
        assert await notifier.run_once() == {"sent": 1, "retry": 1}
    finally:
        await notifier.aclose()
    rows = await pool.fetch("SELECT status, available_at FROM outbox ORDER BY status")
    assert [row["status"] for row in rows] == ["pending", "sent"]
    assert rows[0]["available_at"] - factories.EPOCH == timedelta(days=1)


async def test_a_followups_decision_spelling_a_nul_is_recorded_cleaned(
    pool: asyncpg.Pool[Any],
) -> None:
    # The answer is storable text, but the JSON the decision is read from spells a NUL with
    # an escape: the decision's error quotes it, and the check's record would refuse it.
    at = datetime.fromisoformat("2026-03-02T09:00:20+00:00")
    slot = datetime.fromisoformat("2026-03-02T09:15:00+00:00")
    prompt = 'Has it shipped?\n```json\n{"recheck_in": "\\u0000 soon"}\n```'
    async with api_support.client(pool, clock=FrozenClock(at)) as api:
        who = await api.token("shop")
        body = {"key": "k", "at": (at + timedelta(minutes=1)).isoformat(), "prompt": prompt}
        assert (await api.post("/v1/followups", who, json=body)).status == 201
        assert (await Scheduler(pool, FrozenClock(slot), Metrics()).run_once()).enqueued == 1
        assert await factories.worker_pool(pool, FrozenClock(slot)).run_once() == 1
        shown = (await api.get("/v1/followups/k", who)).body
    [check] = shown["checks"]
    assert (shown["ended_reason"], check["outcome"]) == ("invalid", "invalid")
    assert check["decision"]["recheck_in"] == "\ufffd soon"
