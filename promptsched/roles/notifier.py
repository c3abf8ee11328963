"""The notifier owns delivery: it claims owed notifications from the outbox under a lease,
sends each batch concurrently, and records every outcome conditioned on its claim token.

Delivery is at least once: a crash between "sent" and "marked" re-sends after the claim
expires, with the same Message-ID / Idempotency-Key, so receivers see the same message.
"""

from __future__ import annotations

import os
import random
import signal
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import structlog
from anyio.abc import TaskStatus

from promptsched import storable
from promptsched.clock import Clock
from promptsched.config import NotifierSettings
from promptsched.delivery import DeliveryError, FollowupCheck, Notification, Sender
from promptsched.delivery.chat import DiscordSender, NtfySender, SlackSender
from promptsched.delivery.email import EmailSender, EmailSettings
from promptsched.delivery.webhook import WebhookSender
from promptsched.domain import DeliveryOutcome, OutboxEvent, OutboxStatus, OwedNotification
from promptsched.metrics import Metrics
from promptsched.retry import RetryPolicy, decide
from promptsched.roles.loop import Wakeup, run_forever
from promptsched.secret import Secret
from promptsched.store import queries

if TYPE_CHECKING:
    from promptsched.config import Config

log = structlog.get_logger("notifier")
_DEFAULTS = NotifierSettings()

# Test hook: with config.CRASH_AFTER_SEND_ENV set in the environment of `promptsched run`, the
# notifier SIGKILLs its own process right after a batch was sent and before it is marked sent,
# so a test can show the re-send after a crash deterministically. Never set it in production.


def build_senders(config: Config) -> dict[str, Sender]:
    timeout = config.notifier_timeout.total_seconds()
    allow, public_url = config.webhook_allow, config.public_url
    return {
        "email": EmailSender(EmailSettings.from_config(config)),
        "webhook": WebhookSender(allow=allow, timeout=timeout),
        "slack": SlackSender(allow=allow, timeout=timeout, public_url=public_url),
        "discord": DiscordSender(allow=allow, timeout=timeout, public_url=public_url),
        "ntfy": NtfySender(allow=allow, timeout=timeout, public_url=public_url),
    }


# Owed digests are looked for once after each period ends, and at least this often: a long
# period is not trusted to a monotonic wait of hours (a suspended machine, a clock step).
DIGEST_CHECK_SECONDS = 600.0

# The name each settled status is counted and logged under.
_OUTCOME_NAMES = {
    OutboxStatus.SENT: DeliveryOutcome.SENT,
    OutboxStatus.PENDING: DeliveryOutcome.RETRY,
    OutboxStatus.DEAD: DeliveryOutcome.DEAD,
}


@dataclass(frozen=True, slots=True)
class Outcome:
    status: OutboxStatus  # sent | pending (retry) | dead
    retry_in: timedelta | None = None
    error: str | None = None
    note: str | None = None


def notification(row: OwedNotification) -> Notification:
    secret = row.webhook_secret
    return Notification(
        id=row.id,
        idempotency_key=row.idempotency_key,
        channel=row.channel,
        event=OutboxEvent(row.event),
        target=row.target,
        schedule_id=row.schedule_id,
        schedule_name=row.schedule_name,
        timezone=row.timezone,
        run_id=row.run_id,
        slot=row.slot,
        origin=row.origin,
        run_attempts=row.run_attempts,
        output=row.output,
        error=row.error,
        finished_at=row.finished_at,
        webhook_secret=Secret(secret) if secret else None,
        chat_url=Secret(row.chat_url) if row.chat_url else None,
        details=row.details,
        output_json=row.output_json,
        previous_output=row.previous_output,
        previous_json=row.previous_json,
        check=_check(row),
    )


def _check(row: OwedNotification) -> FollowupCheck | None:
    """Where a follow-up's chain stands after this run (None for a plain schedule's run)."""
    if row.followup_key is None or row.max_checks is None:
        return None
    return FollowupCheck(
        key=row.followup_key, number=row.check_number, max_checks=row.max_checks,
        outcome=row.check_outcome, next_at=row.next_check_at,
    )  # fmt: skip


class Notifier:
    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        clock: Clock,
        metrics: Metrics,
        senders: Mapping[str, Sender],
        settings: NotifierSettings = _DEFAULTS,
    ) -> None:
        self.pool = pool
        self.clock = clock
        self.metrics = metrics
        self.senders = dict(senders)
        self.settings = settings
        self.wakeup = Wakeup()
        self._next_digest_check = 0.0

    def notify(self, _payload: str | None = None) -> None:
        """Notifications were owed (a run finished, a replay): look now."""
        self.wakeup.set()

    async def run_once(self, *, digests: bool = True) -> Counter[str]:
        """Drain mode: take back expired claims, owe the digests of dropped ticks of the last
        whole period (``digests``), then send everything available now. Returns counts by
        outcome (sent, retry, dead, lost, fenced, released; digests_owed)."""
        counts = await self._reclaim()
        if digests:
            result = await queries.outbox_owe_digests(
                self.pool, self.clock.sql_now(), self.settings.digest_period
            )
            # Nothing new to owe before the next period ends (on the database's clock).
            wait = min(max(1.0, result["seconds_to_next"]), DIGEST_CHECK_SECONDS)
            self._next_digest_check = anyio.current_time() + wait
            if result["owed"]:
                counts["digests_owed"] += result["owed"]
                log.info("notification.digests_owed", owed=result["owed"])
        while True:
            rows = await queries.outbox_claim_batch(
                self.pool,
                self.clock.sql_now(),
                self.settings.batch,
                self.settings.lease,
                self.settings.max_attempts,
            )
            if not rows:
                return counts
            counts.update(await self._deliver(rows))

    async def _reclaim(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        rows = await queries.outbox_reclaim_expired(self.pool, self.clock.sql_now(), 1000)
        for row in rows:
            counts[DeliveryOutcome.LOST] += 1
            self.metrics.deliveries.labels(row["channel"], DeliveryOutcome.LOST.label).inc()
            log.warning(
                "notification.lost",
                notification_id=row["id"],
                run_id=row["run_id"],
                channel=row["channel"],
                attempts=row["attempts"],
                status=row["status"],
            )
        return counts

    async def _deliver(self, rows: list[OwedNotification]) -> Counter[str]:
        outcomes: dict[int, Outcome] = {}
        try:
            async with anyio.create_task_group() as tg:
                for row in rows:
                    tg.start_soon(self._send_one, row, outcomes)
        except BaseException:
            # Shutdown: record what was sent, hand the unsent claims back, then stop.
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                await self._settle(rows, outcomes)
            raise
        if self.settings.crash_after_send and any(
            o.status is OutboxStatus.SENT for o in outcomes.values()
        ):
            os.kill(os.getpid(), signal.SIGKILL)  # the test hook (config.CRASH_AFTER_SEND_ENV)
        with anyio.CancelScope(shield=True), anyio.move_on_after(10):
            return await self._settle(rows, outcomes)
        # The database did not answer in time: the claims expire and are sent again.
        return Counter()

    async def _send_one(self, row: OwedNotification, outcomes: dict[int, Outcome]) -> None:
        item = notification(row)
        sender = self.senders.get(item.channel)
        started = anyio.current_time()
        try:
            if sender is None:
                raise DeliveryError(f"no sender for channel {item.channel!r}", retryable=False)
            with anyio.fail_after(self.settings.timeout.total_seconds()):
                note = await sender.send(item)
            outcomes[item.id] = Outcome(OutboxStatus.SENT, note=note)
        except DeliveryError as exc:
            outcomes[item.id] = self._failure(row, exc)
        except TimeoutError:
            seconds = self.settings.timeout.total_seconds()
            outcomes[item.id] = self._failure(row, DeliveryError(f"timed out after {seconds:g}s"))
        except Exception as exc:  # a sender bug must not take the batch down
            log.exception("notification.sender_crashed", notification_id=item.id)
            outcomes[item.id] = self._failure(row, DeliveryError(f"sender crashed: {exc!r}"))
        finally:
            elapsed = anyio.current_time() - started
            self.metrics.delivery_duration.labels(item.channel).observe(elapsed)

    def _failure(self, row: OwedNotification, exc: DeliveryError) -> Outcome:
        decision = decide(
            retryable=exc.retryable,
            retry_after=exc.retry_after,
            attempt=row.attempts,
            policy=RetryPolicy(row.max_attempts, self.settings.retry_base, self.settings.retry_max),
            jitter=random.random(),
        )
        # A receiver's answer (its body, its headers) enters here: storable as any text from
        # outside, or one odd answer would fail the batch's settle for every notification.
        error = storable.clean(exc.message)
        if decision.action == "retry":
            return Outcome(OutboxStatus.PENDING, retry_in=decision.delay, error=error)
        return Outcome(OutboxStatus.DEAD, error=error)

    async def _settle(
        self, rows: list[OwedNotification], outcomes: dict[int, Outcome]
    ) -> Counter[str]:
        released = Outcome(
            OutboxStatus.PENDING, error="released: the notifier stopped while sending"
        )
        chosen = {row.id: outcomes.get(row.id, released) for row in rows}
        landed = await queries.outbox_settle_many(
            self.pool,
            self.clock.sql_now(),
            [row.id for row in rows],
            [row.claim_token for row in rows],
            [outcome.status for outcome in chosen.values()],
            [outcome.retry_in for outcome in chosen.values()],
            [outcome.error for outcome in chosen.values()],
        )
        lags = {row["id"]: row["lag"] for row in landed}
        counts: Counter[str] = Counter()
        for row in rows:
            name = self._record(row, chosen[row.id], row.id in outcomes, lags)
            counts[name] += 1
        return counts

    def _record(
        self, row: OwedNotification, outcome: Outcome, attempted: bool, lags: dict[int, float]
    ) -> DeliveryOutcome:
        """Count and log one transition; returns its outcome."""
        channel = row.channel
        name = _OUTCOME_NAMES[outcome.status]
        if row.id not in lags:
            name = (
                DeliveryOutcome.FENCED
            )  # our claim expired and someone else took the row: we wrote nothing
            self.metrics.fenced_writes.labels("outbox_mark").inc()
        elif not attempted:
            name = DeliveryOutcome.RELEASED
        # "delivered" is the outcome label the alert rules (deploy/alerts.yml) count as success.
        self.metrics.deliveries.labels(channel, name.label).inc()
        if name == DeliveryOutcome.SENT:
            self.metrics.notification_lag.labels(channel).observe(max(0.0, lags[row.id]))
        fields = {
            "notification_id": row.id,
            "run_id": row.run_id,
            "schedule_id": row.schedule_id,
            "channel": channel,
            "run_status": row.event,
            "attempt": row.attempts,
            "idempotency_key": row.idempotency_key,
        }
        if name == DeliveryOutcome.SENT:
            log.info("notification.sent", note=outcome.note, **fields)
        elif name == DeliveryOutcome.RETRY:
            retry_in = round(outcome.retry_in.total_seconds(), 3) if outcome.retry_in else 0
            log.warning("notification.retry", error=outcome.error, retry_in=retry_in, **fields)
        elif name == DeliveryOutcome.DEAD:
            log.error("notification.dead", error=outcome.error, **fields)
        else:
            log.warning(f"notification.{name}", **fields)
        return name

    async def _tick(self) -> float:
        # Owing digests reads a period of finished runs: once per replica after each period
        # ends (the idempotency key makes a repeat, here or on another replica, change nothing).
        await self.run_once(digests=anyio.current_time() >= self._next_digest_check)
        ahead = await queries.outbox_seconds_until_work(self.pool, self.clock.sql_now())
        cap = self.settings.max_sleep.total_seconds()
        # A claim that expires wakes us just after, to take it back.
        return cap if ahead is None else max(0.01, min(cap, ahead + 0.01))

    async def aclose(self) -> None:
        for sender in self.senders.values():
            await sender.aclose()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            await run_forever("notifier", self._tick, self.wakeup, self.metrics)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await self.aclose()
