"""The outbox and the notifier against real Postgres, a real SMTP server and a real HTTP sink:
each finished run is delivered once per channel, retried, dead-lettered, replayed, and re-sent
as the same message after a crash. Time moves by a frozen clock, never by sleeping."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from promptsched import netguard
from promptsched.clock import FrozenClock
from promptsched.config import NotifierSettings, ReaperSettings
from promptsched.config import load as load_config
from promptsched.delivery import DeliveryError, Notification
from promptsched.delivery.email import EmailSender, EmailSettings
from promptsched.delivery.webhook import WebhookSender
from promptsched.errors import ValidationError
from promptsched.metrics import Metrics
from promptsched.ops import notifications, notify_targets
from promptsched.roles.notifier import Notifier
from promptsched.roles.reaper import Reaper
from promptsched.secret import Secret
from promptsched.store import queries, sqlfiles
from tests import factories
from tests.factories import EPOCH
from tests.fakes.http_sink import HttpSink
from tests.fakes.smtp import PERMANENT, FakeSMTP, start_fake_smtp
from tests.helpers import Service, wait_until

LOOPBACK = netguard.Allowlist.parse("127.0.0.1/32", variable=netguard.WEBHOOK_ALLOW)

SENDER = "promptsched@example.test"


@pytest.fixture
async def smtp() -> AsyncIterator[FakeSMTP]:
    async with start_fake_smtp() as server:
        yield server


async def notified_schedule(
    pool: asyncpg.Pool[Any],
    *,
    email: list[str] | None = None,
    webhook: str | None = None,
    on_success: bool = True,
    on_failure: bool = True,
    **schedule: Any,
) -> int:
    """A schedule (tests.factories) whose ``notify`` went through the real validation."""
    sid = await factories.schedule(pool, **schedule)
    raw: dict[str, Any] = {"on_success": on_success, "on_failure": on_failure}
    if email:
        raw["email"] = email
    if webhook:
        raw["webhook"] = {"url": webhook}
    notify = notify_targets.validate_targets(raw, allow=LOOPBACK)
    await pool.execute("UPDATE schedules SET notify = $2 WHERE id = $1", sid, notify)
    return sid


def make_notifier(
    pool: asyncpg.Pool[Any],
    clock: FrozenClock,
    smtp: FakeSMTP,
    *,
    allow: netguard.Allowlist | None = None,
    max_attempts: int = 5,
    metrics: Metrics | None = None,
) -> Notifier:
    settings = EmailSettings(
        host=smtp.host,
        port=smtp.port,
        username=None,
        password=None,
        tls="none",
        sender=SENDER,
        timeout=5.0,
    )
    senders = {
        "email": EmailSender(settings),
        "webhook": WebhookSender(allow=LOOPBACK if allow is None else allow, timeout=5.0),
    }
    return Notifier(
        pool,
        clock,
        metrics or Metrics(),
        senders,
        NotifierSettings(
            lease=timedelta(seconds=60),
            timeout=timedelta(seconds=5),
            max_attempts=max_attempts,
            retry_base=timedelta(seconds=10),
            retry_max=timedelta(minutes=5),
        ),
    )


async def finished_run(pool: asyncpg.Pool[Any], clock: FrozenClock, **notify: Any) -> int:
    """A run of a ``notified_schedule`` (``notify`` its arguments) that the worker executed
    once; its id."""
    rid = await factories.pending_run(pool, await notified_schedule(pool, **notify))
    await factories.worker_pool(pool, clock).run_once()
    return rid


async def outbox(pool: asyncpg.Pool[Any], run_id: int | None = None) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT * FROM outbox WHERE $1::bigint IS NULL OR run_id = $1 ORDER BY id", run_id
    )


async def advance_to_next_retry(pool: asyncpg.Pool[Any], clock: FrozenClock) -> None:
    due = await pool.fetchval("SELECT min(available_at) FROM outbox WHERE status = 'pending'")
    assert due is not None and due > clock.instant, "a retry waits for its backoff"
    clock.set(due)


async def test_one_successful_run_sends_one_email_and_one_webhook(
    pool: asyncpg.Pool[Any], smtp: FakeSMTP, sink: HttpSink
) -> None:
    clock = FrozenClock(EPOCH)
    metrics = Metrics()
    sid = await notified_schedule(
        pool,
        email=["ops@example.com", "bob@example.org"],
        webhook=sink.url,
        timezone="Europe/Paris",
        prompt="weekly report",
    )
    rid = await factories.pending_run(pool, sid)
    assert await factories.worker_pool(pool, clock).run_once() == 1
    # Owed in the same statement that finished the run; nothing sent yet.
    owed = await outbox(pool, rid)
    assert [(row["channel"], row["event"], row["status"]) for row in owed] == [
        ("email", "succeeded", "pending"),
        ("webhook", "succeeded", "pending"),
    ]
    assert all("secret" not in row["target"] for row in owed), "the secret stays on the schedule"
    notifier = make_notifier(pool, clock, smtp, metrics=metrics)
    try:
        assert (await notifier.run_once())["sent"] == 2
        assert sum((await notifier.run_once()).values()) == 0  # nothing twice
    finally:
        await notifier.aclose()
    [mail] = smtp.received
    assert mail.rcpt_tos == ["ops@example.com", "bob@example.org"]
    assert mail.message_id == f"<promptsched-{rid}-succeeded-email@example.test>"
    subject = str(mail.message["Subject"])
    assert subject == "[promptsched] test succeeded (2026-03-02 10:00 CET (Europe/Paris))"
    text = mail.message.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    assert "Slot:     2026-03-02 10:00 CET (Europe/Paris)" in text
    assert "echo: weekly report" in text
    [hook] = sink.requests
    assert hook.headers["Idempotency-Key"] == f"promptsched-{rid}-succeeded-webhook"
    assert hook.json()["output"] == "echo: weekly report"
    rows = await outbox(pool, rid)
    assert [(row["status"], row["attempts"], row["sent_at"]) for row in rows] == [
        ("sent", 1, EPOCH),
        ("sent", 1, EPOCH),
    ]
    assert metrics.deliveries.labels("email", "delivered")._value.get() == 1
    assert metrics.deliveries.labels("webhook", "delivered")._value.get() == 1


async def test_a_run_that_succeeds_on_its_third_attempt_notifies_once(
    pool: asyncpg.Pool[Any], smtp: FakeSMTP, sink: HttpSink
) -> None:
    clock = FrozenClock(EPOCH)
    sid = await notified_schedule(
        pool, email=["ops@example.com"], webhook=sink.url, params={"fail_attempts": 2}
    )
    rid = await factories.pending_run(pool, sid)
    workers = factories.worker_pool(pool, clock)
    notifier = make_notifier(pool, clock, smtp)
    try:
        for _attempt in range(3):
            assert await workers.run_once() == 1
            await notifier.run_once()  # between attempts there is nothing to deliver
            due = await pool.fetchval("SELECT available_at FROM runs WHERE id = $1", rid)
            clock.set(max(clock.instant, due))
    finally:
        await notifier.aclose()
    run = await pool.fetchrow("SELECT status, attempts FROM runs WHERE id = $1", rid)
    assert (run["status"], run["attempts"]) == ("succeeded", 3)
    assert len(smtp.received) == 1 and len(sink.requests) == 1
    assert [row["status"] for row in await outbox(pool)] == ["sent", "sent"]


async def test_smtp_refusals_are_retried_with_backoff_then_delivered_once(
    pool: asyncpg.Pool[Any], smtp: FakeSMTP
) -> None:
    clock = FrozenClock(EPOCH)
    rid = await finished_run(pool, clock, email=["a@b.co"])
    smtp.refuse_next(2)
    notifier = make_notifier(pool, clock, smtp)
    try:
        assert (await notifier.run_once())["retry"] == 1
        first_delay = (await outbox(pool, rid))[0]["available_at"] - clock.instant
        assert (await notifier.run_once())["retry"] == 0  # not before its backoff
        await advance_to_next_retry(pool, clock)
        assert (await notifier.run_once())["retry"] == 1
        second_delay = (await outbox(pool, rid))[0]["available_at"] - clock.instant
        await advance_to_next_retry(pool, clock)
        assert (await notifier.run_once())["sent"] == 1
    finally:
        await notifier.aclose()
    # Equal-jitter exponential backoff from 10s: [5s, 10s], then [10s, 20s].
    assert timedelta(seconds=5) <= first_delay <= timedelta(seconds=10)
    assert timedelta(seconds=10) <= second_delay <= timedelta(seconds=20)
    assert smtp.refusals == 2 and len(smtp.received) == 1
    [row] = await outbox(pool, rid)
    assert (row["status"], row["attempts"]) == ("sent", 3)
    assert "451" in row["last_error"]


async def test_smtp_refusing_always_ends_dead_listed_and_replayable(
    pool: asyncpg.Pool[Any], smtp: FakeSMTP
) -> None:
    clock = FrozenClock(EPOCH)
    sid = await notified_schedule(pool, email=["old@example.com"])
    rid = await factories.pending_run(pool, sid)
    await factories.worker_pool(pool, clock).run_once()
    smtp.refuse_always()
    metrics = Metrics()
    notifier = make_notifier(pool, clock, smtp, max_attempts=3, metrics=metrics)
    try:
        assert (await notifier.run_once())["retry"] == 1
        await advance_to_next_retry(pool, clock)
        assert (await notifier.run_once())["retry"] == 1
        await advance_to_next_retry(pool, clock)
        assert (await notifier.run_once())["dead"] == 1
        [row] = await outbox(pool, rid)
        assert (row["status"], row["attempts"], row["max_attempts"]) == ("dead", 3, 3)
        assert row["last_error"].startswith("smtp: 451 4.3.0")
        [listed] = await notifications.list_dead_notifications(pool, "default")
        assert (listed["id"], listed["run_id"], listed["channel"]) == (row["id"], rid, "email")
        assert await notifications.list_dead_notifications(pool, "someone-else") == []
        assert metrics.deliveries.labels("email", "dead")._value.get() == 1
        # The owner fixes the address and replays: the same message goes to the new address.
        smtp.accept()
        fixed = notify_targets.validate_targets({"email": ["new@example.com"]}, allow=LOOPBACK)
        await pool.execute("UPDATE schedules SET notify = $2 WHERE id = $1", sid, fixed)
        assert await notifications.replay_notification(pool, row["id"], "someone-else") is None
        replayed = await notifications.replay_notification(pool, row["id"], "default", clock=clock)
        assert replayed is not None
        assert (replayed["status"], replayed["attempts"]) == ("pending", 0)
        assert (await notifier.run_once())["sent"] == 1
    finally:
        await notifier.aclose()
    [mail] = smtp.received
    assert mail.rcpt_tos == ["new@example.com"]
    assert mail.message_id == f"<promptsched-{rid}-succeeded-email@example.test>"
    assert await notifications.list_dead_notifications(pool, None) == []
    with pytest.raises(ValidationError, match="is sent; only dead notifications"):
        await notifications.replay_notification(pool, row["id"], "default")
    assert await notifications.replay_notification(pool, 999_999, None) is None


async def test_a_permanent_smtp_refusal_is_dead_at_once(
    pool: asyncpg.Pool[Any], smtp: FakeSMTP
) -> None:
    clock = FrozenClock(EPOCH)
    rid = await finished_run(pool, clock, email=["x@y.co"])
    smtp.refuse_always(PERMANENT)
    notifier = make_notifier(pool, clock, smtp)
    try:
        assert (await notifier.run_once())["dead"] == 1
    finally:
        await notifier.aclose()
    [row] = await outbox(pool, rid)
    assert (row["status"], row["attempts"]) == ("dead", 1)
    assert row["last_error"].startswith("smtp: 550 5.1.1")


@pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS")
async def test_smtp_credentials_are_used_and_a_refused_password_never_shows() -> None:
    password = "correct horse battery staple"
    async with start_fake_smtp(credentials=("mailer", password)) as server:
        config = load_config(
            {
                **server.env(),
                "PROMPTSCHED_SMTP_USERNAME": "mailer",
                "PROMPTSCHED_SMTP_PASSWORD": password,
            }
        )
        assert password not in repr(config)
        good = EmailSender(EmailSettings.from_config(config))
        item = _email_notification()
        assert await good.send(item) is None
        assert len(server.received) == 1
        wrong = replace(config, smtp_password=Secret(password + "!"))
        with pytest.raises(DeliveryError) as caught:
            await EmailSender(EmailSettings.from_config(wrong)).send(item)
    assert caught.value.retryable is False and caught.value.message.startswith("smtp: 535")
    assert password not in caught.value.message


def _email_notification() -> Notification:
    return Notification(
        id=1,
        idempotency_key="promptsched-1-succeeded-email",
        channel="email",
        event="succeeded",
        target=["ops@example.com"],
        schedule_id=1,
        schedule_name="digest",
        timezone="UTC",
        run_id=1,
        slot=EPOCH,
        origin="cadence",
        run_attempts=1,
        output="hello",
        error=None,
        finished_at=EPOCH,
    )


@pytest.mark.parametrize("on_failure", [True, False], ids=["on_failure", "success_only"])
async def test_a_dead_run_notifies_its_error_only_when_on_failure_is_set(
    pool: asyncpg.Pool[Any], smtp: FakeSMTP, sink: HttpSink, on_failure: bool
) -> None:
    clock = FrozenClock(EPOCH)
    sid = await notified_schedule(
        pool,
        email=["ops@example.com"],
        webhook=sink.url,
        on_failure=on_failure,
        params={"fail_attempts": 1, "fail_permanent": "true"},
    )
    rid = await factories.pending_run(pool, sid)
    await factories.worker_pool(pool, clock).run_once()
    assert await pool.fetchval("SELECT status FROM runs WHERE id = $1", rid) == "dead"
    notifier = make_notifier(pool, clock, smtp)
    try:
        await notifier.run_once()
    finally:
        await notifier.aclose()
    rows = await outbox(pool, rid)
    if not on_failure:
        assert rows == [] and smtp.received == [] and sink.requests == []
        return
    assert [(row["event"], row["status"]) for row in rows] == [("dead", "sent")] * 2
    [mail] = smtp.received
    assert "FAILED" in str(mail.message["Subject"])
    text = mail.message.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    assert "echo: injected failure on attempt 1" in text
    [hook] = sink.requests
    assert (hook.json()["event"], hook.json()["error"]) == (
        "run.dead",
        "echo: injected failure on attempt 1",
    )


async def test_success_notifications_can_be_switched_off(
    pool: asyncpg.Pool[Any], smtp: FakeSMTP
) -> None:
    clock = FrozenClock(EPOCH)
    sid = await notified_schedule(pool, email=["ops@example.com"], on_success=False)
    rid = await factories.pending_run(pool, sid)
    await factories.worker_pool(pool, clock).run_once()
    assert await pool.fetchval("SELECT status FROM runs WHERE id = $1", rid) == "succeeded"
    assert await outbox(pool, rid) == []


async def test_a_run_the_reaper_declares_dead_owes_a_failure_notification(
    pool: asyncpg.Pool[Any],
) -> None:
    clock = FrozenClock(EPOCH)
    sid = await notified_schedule(pool, email=["ops@example.com"], max_attempts=1)
    rid = await factories.pending_run(pool, sid)
    await queries.run_claim_batch(pool, clock.sql_now(), "echo", 1, "w", timedelta(seconds=30))
    clock.advance(timedelta(seconds=31))
    assert (
        await Reaper(pool, clock, Metrics(), ReaperSettings(deadline_grace=timedelta(0))).run_once()
    )["dead"] == 1
    [row] = await outbox(pool, rid)
    assert (row["event"], row["status"], row["channel"]) == ("dead", "pending", "email")


async def test_skipped_and_retried_runs_owe_nothing(pool: asyncpg.Pool[Any]) -> None:
    clock = FrozenClock(EPOCH)
    sid = await notified_schedule(pool, email=["ops@example.com"], params={"fail_attempts": 1})
    retried = await factories.pending_run(pool, sid)
    await factories.worker_pool(pool, clock).run_once()
    assert await pool.fetchval("SELECT status FROM runs WHERE id = $1", retried) == "pending"
    await pool.execute("UPDATE schedules SET enabled = false WHERE id = $1", sid)
    clock.advance(timedelta(hours=1))
    await factories.worker_pool(pool, clock).run_once()
    assert await pool.fetchval("SELECT status FROM runs WHERE id = $1", retried) == "skipped"
    assert await outbox(pool) == []


async def test_a_webhook_allowed_at_save_is_refused_at_send_when_the_config_changed(
    pool: asyncpg.Pool[Any], smtp: FakeSMTP, sink: HttpSink
) -> None:
    clock = FrozenClock(EPOCH)
    rid = await finished_run(pool, clock, webhook=sink.url)
    notifier = make_notifier(pool, clock, smtp, allow=netguard.NO_WEBHOOK_ALLOW)
    try:
        assert (await notifier.run_once())["dead"] == 1
    finally:
        await notifier.aclose()
    [row] = await outbox(pool, rid)
    assert row["status"] == "dead" and row["attempts"] == 1
    assert "127.0.0.1 is loopback and not in PROMPTSCHED_WEBHOOK_ALLOW" in row["last_error"]
    assert sink.requests == []


async def test_an_expired_claim_is_taken_back_and_the_late_writer_is_fenced(
    pool: asyncpg.Pool[Any], smtp: FakeSMTP
) -> None:
    clock = FrozenClock(EPOCH)
    rid = await finished_run(pool, clock, email=["a@b.co"])
    # A notifier claims, then freezes past its lease.
    [stale] = await queries.outbox_claim_batch(pool, clock.sql_now(), 10, timedelta(seconds=60), 5)
    clock.advance(timedelta(seconds=61))
    notifier = make_notifier(pool, clock, smtp)
    try:
        counts = await notifier.run_once()
    finally:
        await notifier.aclose()
    assert (counts["lost"], counts["sent"]) == (1, 1)
    [row] = await outbox(pool, rid)
    assert (row["status"], row["attempts"]) == ("sent", 2)
    # The frozen notifier wakes up and reports a failure: its claim is gone, nothing changes.
    landed = await queries.outbox_settle_many(
        pool,
        clock.sql_now(),
        [stale.id],
        [stale.claim_token],
        ["pending"],
        [timedelta(seconds=5)],
        ["too late"],
    )
    assert landed == []
    assert (await outbox(pool, rid))[0]["status"] == "sent"


async def test_the_claim_query_walks_its_index(pool: asyncpg.Pool[Any]) -> None:
    sid = await factories.schedule(pool)
    await pool.execute(
        "INSERT INTO runs (schedule_id, slot, provider, max_attempts, status) "
        "SELECT $1, now() - g * interval '1 minute', 'echo', 3, 'succeeded' "
        "FROM generate_series(1, 20000) g",
        sid,
    )
    await pool.execute(
        "INSERT INTO outbox (run_id, schedule_id, channel, target, event, status, "
        "idempotency_key) SELECT id, schedule_id, 'email', '[]', 'succeeded', "
        "CASE WHEN id % 50 = 0 THEN 'pending' ELSE 'sent' END, 'k' || id FROM runs"
    )
    await pool.execute("ANALYZE")
    sql = "EXPLAIN " + sqlfiles.queries()["outbox_claim_batch"]
    plan = "\n".join(row[0] for row in await pool.fetch(sql, None, 20, timedelta(seconds=60), 5))
    assert "outbox_claim_idx" in plan and "Seq Scan on outbox" not in plan, plan


async def crash_between_send_and_mark(
    dsn: str,
    pool: asyncpg.Pool[Any],
    tmp_path: Path,
    sid: int,
    env: dict[str, str],
    sent_once: Callable[[], bool],
) -> int:
    """Owe a run of ``sid`` to a real service whose notifier SIGKILLs itself right after
    sending (``sent_once``: the receivers got each message once by then), then let a second
    service re-send after the claims expire; the run's id, once every row is sent."""
    env = {**env, "PROMPTSCHED_NOTIFIER_LEASE": "1s", "PROMPTSCHED_NOTIFIER_TIMEOUT": "900ms"}
    first = Service(
        dsn, tmp_path / "first.log", env={**env, "PROMPTSCHED_TEST_CRASH_AFTER_SEND": "1"}
    )
    second: Service | None = None
    try:
        await first.ready()
        rid = await factories.pending_run(pool, sid, await pool.fetchval("SELECT now()"), "manual")

        async def died() -> bool:
            return first.process.poll() is not None

        await wait_until(died, timeout=20, what="the notifier to kill its process after sending")
        assert first.process.returncode == -signal.SIGKILL
        # Sent, never marked: both claims are still open.
        assert [row["status"] for row in await outbox(pool, rid)] == ["sending", "sending"]
        assert sent_once()
        second = Service(dsn, tmp_path / "second.log", env=env)
        await second.ready()

        async def all_sent() -> bool:
            return [row["status"] for row in await outbox(pool, rid)] == ["sent", "sent"]

        await wait_until(all_sent, timeout=20, what="the re-send after the claims expired")
    finally:
        first.stop()
        if second is not None:
            second.stop()
    # Nothing else was duplicated: one attempt of one run, two sends per owed row.
    assert [row["attempts"] for row in await outbox(pool, rid)] == [2, 2]
    assert await pool.fetchval("SELECT count(*) FROM run_attempts WHERE run_id = $1", rid) == 1
    assert await pool.fetchval("SELECT count(*) FROM runs WHERE schedule_id = $1", sid) == 1
    return rid


@pytest.mark.slow
async def test_a_crash_between_send_and_mark_resends_the_same_message_once(
    dsn: str, pool: asyncpg.Pool[Any], smtp: FakeSMTP, sink: HttpSink, tmp_path: Path
) -> None:
    sid = await notified_schedule(pool, email=["ops@example.com"], webhook=sink.url)
    env = {**smtp.env(), "PROMPTSCHED_WEBHOOK_ALLOW": "127.0.0.1/32"}
    rid = await crash_between_send_and_mark(
        dsn, pool, tmp_path, sid, env, lambda: len(smtp.received) == len(sink.requests) == 1
    )
    assert smtp.message_ids() == [f"<promptsched-{rid}-succeeded-email@example.test>"] * 2
    assert sink.header_values("Idempotency-Key") == [f"promptsched-{rid}-succeeded-webhook"] * 2
    assert [row["channel"] for row in await outbox(pool, rid)] == ["email", "webhook"]


async def test_pause_after_consecutive_dead_runs_tells_the_owner(
    pool: asyncpg.Pool[Any], smtp: FakeSMTP, sink: HttpSink
) -> None:
    clock = FrozenClock(EPOCH)
    sid = await notified_schedule(
        pool,
        email=["ops@example.com"],
        webhook=sink.url,
        params={"fail_attempts": 9},
        max_attempts=1,
    )
    await pool.execute("UPDATE schedules SET pause_after_failures = 2 WHERE id = $1", sid)
    workers = factories.worker_pool(pool, clock)
    first = await factories.pending_run(pool, sid, EPOCH - timedelta(minutes=2), "manual")
    await workers.run_once()
    second = await factories.pending_run(pool, sid, EPOCH - timedelta(minutes=1), "manual")
    await workers.run_once()
    assert await pool.fetchval("SELECT enabled FROM schedules WHERE id = $1", sid) is False
    notifier = make_notifier(pool, clock, smtp)
    try:
        await notifier.run_once()
    finally:
        await notifier.aclose()
    events = [(r["run_id"], r["event"], r["status"]) for r in await outbox(pool)]
    assert sorted(events) == sorted(
        [(first, "dead", "sent")] * 2
        + [(second, "dead", "sent")] * 2
        + [(second, "paused", "sent")] * 2
    )
    subjects = [str(m.message["Subject"]) for m in smtp.received]
    assert sum("PAUSED" in s for s in subjects) == 1
    hooks = [r.json() for r in sink.requests]
    paused = [h for h in hooks if h["event"] == "schedule.paused"]
    assert len(paused) == 1 and paused[0]["run"]["status"] == "dead"
