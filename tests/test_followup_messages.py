"""A follow-up's messages speak of checks, not runs (docs/followups.md): through the roles
themselves (scheduler, worker, notifier under a frozen clock) and a real SMTP server, each
unresolved check mails "check N of M: not resolved, next check at ...", and the escalation
mail reads as sentences, with the key in its commands, its decision in words and no code marks
in the plain text; a resolved check says so. The webhook provider's request carries the
follow-up's key and vars (end to end in tests/test_followups.py)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from promptsched.clock import FrozenClock
from promptsched.executors import webhook_provider
from promptsched.metrics import Metrics
from promptsched.roles.scheduler import Scheduler
from tests import api_support, factories
from tests.fakes.smtp import FakeSMTP, start_fake_smtp
from tests.test_executors_webhook import make_request
from tests.test_notifier import make_notifier

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
KEY = "order-4711-unshipped"


@pytest.fixture
async def smtp() -> AsyncIterator[FakeSMTP]:
    async with start_fake_smtp() as server:
        yield server


def _prompt(decision: str) -> str:
    """The echo provider answers with the prompt: its last fenced JSON block is the check's
    decision."""
    return f"Has order {{{{ order_id }}}} shipped?\n```json\n{decision}\n```"


async def _check(pool: asyncpg.Pool[Any], at: datetime) -> None:
    """The scheduler's tick and one worker drain at ``at``."""
    await Scheduler(pool, FrozenClock(at), Metrics()).run_once()
    assert await factories.worker_pool(pool, FrozenClock(at), slots=4).run_once() == 1


def _text(mail: Any) -> str:
    return str(mail.message.get_body(preferencelist=("plain",)).get_content()).replace("\r\n", "\n")


def _html(mail: Any) -> str:
    return str(mail.message.get_body(preferencelist=("html",)).get_content())


async def test_checks_and_escalation_are_said_as_checks(
    pool: asyncpg.Pool[Any], smtp: FakeSMTP
) -> None:
    async with api_support.client(pool, clock=FrozenClock(T0)) as api:
        body = {
            "key": KEY, "in": "10s", "prompt": _prompt('{"recheck_in": "4s"}'),
            "vars": {"order_id": "4711"}, "max_checks": 5,
            "notify": {"email": ["ops@example.com"]},
            "escalate": [{"after_checks": 2, "notify": {"email": ["boss@example.com"]}}],
        }  # fmt: skip
        assert (await api.post("/v1/followups", await api.token("shop"), json=body)).status == 201
    await _check(pool, T0 + timedelta(seconds=10))  # check 1: again in 4 s
    await _check(pool, T0 + timedelta(seconds=14))  # check 2: again; escalates
    clock = FrozenClock(T0 + timedelta(seconds=15))
    await make_notifier(pool, clock, smtp).run_once()
    # (a subject folded after "Subject:" reads back with a leading space)
    mails = {(m.rcpt_tos[0], str(m.message["Subject"]).strip()): m for m in smtp.received}
    first = mails[("ops@example.com", f"[promptsched] {KEY}: check 1 of 5: not resolved, "
                   "next check at 2026-03-02 09:00:14 UTC")]  # fmt: skip
    assert "Follow-up: order-4711-unshipped (schedule #1)\n" in _text(first)
    assert "Check:    1 of 5: not resolved, next check at 2026-03-02 09:00:14 UTC\n" in _text(first)
    assert "succeeded" not in str(first.message["Subject"])
    # The run's lines read as the rest: local time, no "UTC (UTC)", no ISO stamp.
    assert "Slot:     2026-03-02 09:00:10 UTC\n" in _text(first)
    assert "Run:      #1 (cadence), succeeded after 1 attempt\n" in _text(first)
    assert "Finished: 2026-03-02 09:00:10 UTC\n" in _text(first)
    assert (
        "ops@example.com",
        f"[promptsched] {KEY}: check 2 of 5: not resolved, next check at 2026-03-02 09:00:18 UTC",
    ) in mails
    escalated = mails[("boss@example.com",
                       f"[promptsched] {KEY}: ESCALATED: not resolved after 2 checks")]  # fmt: skip
    text = _text(escalated)
    assert (
        f"The follow-up {KEY} is still not resolved after 2 checks, so its escalation tells you "
        f"now. Every check and its answer: promptsched followups show {KEY}. To stop checking: "
        f"promptsched followups cancel {KEY}."
    ) in " ".join(text.split())
    assert "Check 2 of 5 (run #2):\n- its decision: check again in 4 s\n" in text
    assert "- next check: 2026-03-02 09:00:18 UTC\n" in text
    for raw in ("recheck_in", "4.0", "`", "'order-4711"):
        assert raw not in text, raw
    assert re.search(rf"<code[^>]*>promptsched followups cancel {KEY}</code>", _html(escalated))
    assert "`" not in _html(escalated)
    assert len(smtp.received) == 3


async def test_a_resolved_check_says_resolved(pool: asyncpg.Pool[Any], smtp: FakeSMTP) -> None:
    async with api_support.client(pool, clock=FrozenClock(T0)) as api:
        body = {"key": KEY, "in": "10s", "prompt": "Shipped on 3 March.", "max_checks": 5,
                "notify": {"email": ["ops@example.com"]}}  # fmt: skip
        assert (await api.post("/v1/followups", await api.token("shop"), json=body)).status == 201
    await _check(pool, T0 + timedelta(seconds=10))
    await make_notifier(pool, FrozenClock(T0 + timedelta(seconds=11)), smtp).run_once()
    [mail] = smtp.received
    assert str(mail.message["Subject"]).strip() == f"[promptsched] {KEY}: check 1 of 5: resolved"


def test_the_webhook_providers_request_carries_the_followups_key_and_vars() -> None:
    request = make_request(followup={"key": KEY, "vars": {"order_id": "4711", "rush": True}})
    payload = webhook_provider.build_payload(request, None)
    assert payload["followup"] == {"key": KEY, "vars": {"order_id": "4711", "rush": True}}
    assert webhook_provider.build_payload(make_request(), None)["followup"] is None
