"""An agent attempt's steps as they happen: appended to the attempt's transcript (so an
attempt lost to a crash keeps what it did) and published as a small progress event through
Postgres NOTIFY, which every API replica streams to its clients. Progress is ephemeral by
design; the transcript is the durable record."""

from __future__ import annotations

import dataclasses
import json
from typing import Any
from uuid import UUID

import asyncpg
import structlog

from promptsched import storable
from promptsched.clock import Clock
from promptsched.executors.base import Step
from promptsched.metrics import Metrics
from promptsched.store import queries

log = structlog.get_logger("transcript")

EVENT_TEXT_CHARS = 200  # keeps every event far below NOTIFY's 8000-byte payload limit


def entry(step: Step) -> dict[str, Any]:
    """The transcript entry of a step (the statement adds ``at``, the database's time)."""
    return {
        "kind": step.kind,
        "step": step.number,
        "tokens": step.tokens,
        "text": step.text,
        **step.detail,
    }


def event(run_id: int, attempt: int, step: Step) -> str:
    """The progress event of a step: small, and the same shape on every replica."""
    return json.dumps(
        {
            "run_id": run_id,
            "attempt": attempt,
            "step": step.number,
            "max_steps": step.max_steps,
            "kind": step.kind,
            "text": step.text[:EVENT_TEXT_CHARS],
            "tokens": step.tokens,
        },
        ensure_ascii=False,
    )


class AttemptLog:
    """``record`` is the ``progress`` callback of one attempt. A failed write is logged and
    counted, never fails the attempt: the transcript explains a run, it does not decide it."""

    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        clock: Clock,
        metrics: Metrics,
        *,
        run_id: int,
        attempt_id: UUID,
        attempt: int,
    ) -> None:
        self.pool = pool
        self.clock = clock
        self.metrics = metrics
        self.run_id = run_id
        self.attempt_id = attempt_id
        self.attempt = attempt

    async def record(self, step: Step) -> None:
        # A step quotes the model and its tools: storable as every text from outside.
        text, detail = storable.clean(step.text), storable.clean(step.detail)
        if text is not step.text or detail is not step.detail:
            step = dataclasses.replace(step, text=text, detail=detail)
        try:
            landed = await queries.attempt_append_step(
                self.pool,
                self.clock.sql_now(),
                self.run_id,
                self.attempt_id,
                entry(step),
                event(self.run_id, self.attempt, step),
            )
        except (OSError, TimeoutError, TypeError, ValueError, asyncpg.PostgresError,
                asyncpg.InterfaceError) as exc:  # fmt: skip
            self.metrics.role_errors.labels("transcript").inc()
            log.warning(
                "attempt.step_not_recorded",
                run_id=self.run_id,
                attempt_id=str(self.attempt_id),
                kind=step.kind,
                error=repr(exc),
            )
            return
        if not landed:  # the attempt is no longer running (lost to the reaper, or finished)
            self.metrics.fenced_writes.labels("transcript").inc()
            log.warning(
                "attempt.step_fenced",
                run_id=self.run_id,
                attempt_id=str(self.attempt_id),
                kind=step.kind,
            )
