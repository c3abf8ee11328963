"""Delivery of owed notifications: the message every channel sends, the sender protocol, and
the error that says whether trying again can help.

A message is made from an output of up to a provider's 10 MB without holding the event loop:
each channel cuts the output to a prefix before its Markdown is read (what the message can
show, and a little more), the comparison of two answers is bounded (``monitor.changes``), and
the whole message is made in a worker thread with a deadline (``rendered``)."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import structlog

from promptsched import budgets, offload
from promptsched.domain import OutboxEvent
from promptsched.errors import PromptschedError
from promptsched.human import followups as human_followups
from promptsched.human import text, times
from promptsched.monitor import changes
from promptsched.secret import Secret

# Outputs beyond this are cut (with a note) so one huge answer cannot clog a mailbox.
MAX_TEXT_CHARS = 100_000
# Seconds for making one message in a worker thread (its wait for the thread included); past
# it the message is made again in plain form (``Notification.plain``) and sent.
RENDER_DEADLINE = offload.RENDER_DEADLINE
T = TypeVar("T")
log = structlog.get_logger("delivery")


@dataclass(frozen=True, slots=True)
class FollowupCheck:
    """Where a follow-up's chain stands after one of its runs: its key, the check's number
    (None when the run was not recorded as a check, e.g. it ended after a cancel), the
    outcome the ledger wrote and the next check's instant."""

    key: str
    number: int | None
    max_checks: int
    outcome: str | None = None
    next_at: datetime | None = None

    def headline(self, where: str) -> str:
        """``check 2 of 5: not resolved, next check at 2026-03-02 15:00 UTC``."""
        if self.number is None:
            return f"follow-up {self.key}"
        return human_followups.check_headline(
            number=self.number, max_checks=self.max_checks, outcome=self.outcome,
            next_at=self.next_at, where=where,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Notification:
    """One owed message: what happened to one run, for one channel."""

    id: int
    idempotency_key: str
    channel: str
    # succeeded | dead | paused (the schedule, after consecutive dead runs) | digest (the ticks
    # the schedule dropped in a period; ``details`` says how many, by reason) | budget (a budget
    # of the schedule or its owner is reached; ``details`` says which, once per period)
    event: OutboxEvent
    target: Any  # email: a list of addresses; webhook: {"url": ...}
    schedule_id: int
    schedule_name: str
    timezone: str
    run_id: int
    slot: datetime
    origin: str
    run_attempts: int
    output: str | None
    error: str | None
    finished_at: datetime | None
    webhook_secret: Secret | None = None
    chat_url: Secret | None = None  # slack | discord | ntfy: the URL (a credential)
    # digest: {"dropped": {reason: slots}, "total", "period_start", ...}; budget: the verdict
    # {"scope", "period", "unit", "limit", "spent", "period_start", "key"}; succeeded: a
    # monitor's decision {"notify", "reason", "when", "since"} (docs/monitors.md)
    details: Any = None
    output_json: Any = None  # a monitor's structured answer
    previous_output: str | None = None  # a `changed` monitor: the run it was compared with
    previous_json: Any = None
    check: FollowupCheck | None = None  # a follow-up's run: where its chain stands
    # Made without reading the output's Markdown or comparing answers: the message's rendering
    # did not finish within RENDER_DEADLINE (``rendered``), so it is sent as plain text.
    plain: bool = False

    @property
    def succeeded(self) -> bool:
        return self.event == OutboxEvent.SUCCEEDED

    @property
    def event_type(self) -> str:
        """``run.succeeded``, ``run.dead``, ``schedule.paused``, ``schedule.digest`` or
        ``schedule.budget``."""
        if self.event == OutboxEvent.ESCALATION:
            return "followup.escalation"
        if self.event == OutboxEvent.PAUSED or self.event in REPORTS:
            return f"schedule.{self.event}"
        return f"run.{self.event}"

    def local_slot(self) -> datetime:
        """The slot in the schedule's time zone (UTC if the zone is unknown here)."""
        try:
            return self.slot.astimezone(ZoneInfo(self.timezone))
        except (ZoneInfoNotFoundError, ValueError):
            return self.slot.astimezone(UTC)

    def slot_text(self) -> str:
        """``2026-03-02 10:00 CET (Europe/Paris)``, ``2026-03-02 10:00 UTC``: how people read
        the slot."""
        return times.local(self.slot, self.timezone) + times.zone_words(self.timezone)

    def finished_text(self) -> str:
        """``2026-03-02 10:00:03 CET, 3 s after its slot``; "-" for a run not finished."""
        if self.finished_at is None:
            return "-"
        shown = times.local(self.finished_at, self.timezone)
        late = self.finished_at - self.slot
        return f"{shown}, {times.span(late)} after its slot" if late.total_seconds() >= 1 else shown

    @property
    def key(self) -> str:
        """The follow-up's key for a follow-up's message, else the schedule's name."""
        return self.check.key if self.check is not None else self.schedule_name


# The events that report on a schedule rather than one run: their facts are report_lines.
REPORTS = (OutboxEvent.DIGEST, OutboxEvent.BUDGET, OutboxEvent.ESCALATION)


def outcome_words(notification: Notification) -> str:
    """How the run ended, as a headline says it."""
    if notification.event == OutboxEvent.BUDGET:
        return "reached its BUDGET"
    if notification.event == OutboxEvent.ESCALATION:
        details = notification.details if isinstance(notification.details, dict) else {}
        return f"ESCALATED: not resolved after {_checks(details.get('after_checks'))}"
    check = notification.check
    if check is not None and check.number is not None:
        if notification.event == OutboxEvent.DEAD:
            return f"check {check.number} of {check.max_checks} FAILED"
        if notification.succeeded:
            return check.headline(notification.timezone)
    if notification.event == OutboxEvent.DIGEST:
        total = (notification.details or {}).get("total", 0)
        return f"DROPPED {total} tick{'s' if total != 1 else ''}"
    found = decision(notification)
    if found is not None and found.get("when") == "changed" and "since" in found:
        return "CHANGED"
    return {
        OutboxEvent.SUCCEEDED: "succeeded",
        OutboxEvent.PAUSED: "PAUSED after repeated failures",
    }.get(notification.event, "FAILED")


def title(notification: Notification) -> str:
    """``nightly report FAILED``, ``order-4711-unshipped: check 2 of 5: not resolved, ...``:
    the name (a follow-up's key) and how it ended, on one line."""
    name = " ".join(notification.key.split())
    joiner = ": " if notification.event in REPORTS or notification.check is not None else " "
    return f"{name}{joiner}{outcome_words(notification)}"


def next_steps(notification: Notification) -> str | None:
    """What the owner can do now (failure and pause messages), None for a success."""
    n = notification
    if n.event == OutboxEvent.PAUSED:
        return (
            "The schedule kept failing and has been paused: it will not run again until it is "
            f"resumed. Fix the cause (the error below), then `promptsched schedules resume "
            f"{n.schedule_id}` (or Resume in the console)."
        )
    if n.event == OutboxEvent.DIGEST:
        return (
            "These slots of the schedule did not run. If that is not what you want, change the "
            f"policy named by each reason (`promptsched schedules edit {n.schedule_id}`, or Edit "
            "in the console): overlap, misfire and catch-up window, or the budget."
        )
    if n.event == OutboxEvent.ESCALATION:
        details = n.details if isinstance(n.details, dict) else {}
        key = str(details.get("key") or n.key)
        return (
            f"The follow-up {key} is still not resolved after "
            f"{_checks(details.get('after_checks'))}, so its escalation tells you now. Every "
            f"check and its answer: `promptsched followups show {key}`. To stop checking: "
            f"`promptsched followups cancel {key}`."
        )
    if n.event == OutboxEvent.BUDGET:
        return (
            "Runs that would start while a budget is reached are not sent: they are skipped "
            "with reason budget until the period ends, or until the budget is raised "
            f"(`promptsched schedules edit {n.schedule_id} --budget ...` for the schedule's, "
            "`promptsched budget set ...` for the owner's, or the console). You hear this once "
            "per period."
        )
    if n.event == OutboxEvent.DEAD:
        return (
            "The run failed and will not be retried. Fix the cause (the error below), then "
            f"`promptsched runs replay {n.run_id}` to run it again (or Replay in the console)."
        )
    return None


# Why a slot was dropped, in words, by skip reason (any other reason is shown as it is).
REASON_WORDS = {
    "overlap": "an earlier run was still going (overlap policy)",
    "misfire": "found late, e.g. after downtime (misfire policy)",
    "catchup_window": "older than the catch-up window",
    "budget": "the budget was used up",
}


def digest_lines(notification: Notification) -> list[str]:
    """The digest's facts: the period, then one line per reason with its count."""
    details = notification.details if isinstance(notification.details, dict) else {}
    zone = notification.local_slot().tzinfo
    period = []
    for key in ("period_start", "period_end"):
        value = details.get(key)
        try:
            instant = datetime.fromisoformat(str(value)).astimezone(zone)
            period.append(instant.strftime("%Y-%m-%d %H:%M %Z"))
        except ValueError:
            period.append(str(value))
    found = details.get("dropped")
    dropped: dict[str, int] = found if isinstance(found, dict) else {}
    lines = [f"Between {period[0]} and {period[1]} ({notification.timezone}):"]
    for reason, count in sorted(dropped.items(), key=lambda item: (-int(item[1]), item[0])):
        why = REASON_WORDS.get(reason)
        lines.append(
            f"- {reason}: {count} slot{'s' if count != 1 else ''}" + (f" ({why})" if why else "")
        )
    return lines


def budget_lines(notification: Notification) -> list[str]:
    """The budget notice's facts: what was reached, and when runs start again."""
    details = notification.details if isinstance(notification.details, dict) else {}
    scope = "Owner" if details.get("scope") == "owner" else "Schedule"
    try:
        start = datetime.fromisoformat(str(details.get("period_start"))).astimezone(UTC)
        month = start.month % 12 + 1
        resume = (
            start + timedelta(days=1)
            if details.get("period") == "day"
            else start.replace(year=start.year + (start.month == 12), month=month)
        )
        again = f"runs start again at {resume.strftime('%Y-%m-%d %H:%M')} UTC"
    except ValueError:
        again = "runs start again when the period ends"
    return [f"{scope} budget:", f"- {budgets.reached(details)}", f"- {again}"]


def report_lines(notification: Notification) -> list[str]:
    """A report's facts (digest or budget): a heading line, then one line per fact."""
    if notification.event == OutboxEvent.BUDGET:
        return budget_lines(notification)
    if notification.event == OutboxEvent.ESCALATION:
        return escalation_lines(notification)
    return digest_lines(notification)


def _checks(count: Any) -> str:
    return text.plural(count, "check") if isinstance(count, int) else "its checks"


def escalation_lines(notification: Notification) -> list[str]:
    """The escalation's facts: the check that tipped it, what it answered, what comes next."""
    n = notification
    details = n.details if isinstance(n.details, dict) else {}
    number = details.get("after_checks", "?")
    of = f" of {n.check.max_checks}" if n.check is not None else ""
    asked = human_followups.decision_words(details.get("decision"), n.timezone, final=True)
    lines = [f"Check {number}{of} (run #{n.run_id}):", f"- its decision: {asked}"]
    if n.check is not None and n.check.next_at is not None:
        lines.append(f"- next check: {times.local(n.check.next_at, n.timezone)}")
    answer = text.clip(answer_text(n.output or ""), 500)
    if answer:
        lines.append(f"- its answer: {answer}")
    return lines


_FENCED_JSON = re.compile(r"```json\s*\{.*?\}\s*```", re.S)
_DECISION_KEYS = ("recheck_in", "recheck_at")


def answer_text(output: str) -> str:
    """What a check answered besides its decision (the decision line says that): a JSON
    answer's other fields in words, or the text without its fenced JSON decision."""
    try:
        data = json.loads(output)
    except ValueError:
        return _FENCED_JSON.sub("", output).strip()
    if isinstance(data, dict):
        rest = {k: v for k, v in data.items() if k not in _DECISION_KEYS and k != "usage"}
        return text.words(rest) if rest else ""
    return output.strip()


def plain(markdown: str) -> str:
    """A sentence of next steps for plain text: the commands without their code marks."""
    return markdown.replace("`", "")


def decision(notification: Notification) -> dict[str, Any] | None:
    """A monitor's decision to notify of this success (why, and the run it was compared
    with), or None for a schedule that notifies on every success."""
    details = notification.details
    if notification.succeeded and isinstance(details, dict) and "reason" in details:
        return details
    return None


def what_changed(notification: Notification) -> list[changes.Change] | list[str] | None:
    """A `changed` monitor's difference from the run it was compared with: the JSON paths with
    their old and new values, or a unified diff of the text (at most ``changes.MAX_*``); None
    when it was not compared (a first output, another condition, or that run is gone)."""
    found = decision(notification)
    n = notification
    if found is None or found.get("when") != "changed" or "since" not in found or n.plain:
        return None
    if n.output_json is not None and n.previous_json is not None:
        return changes.json_changes(n.previous_json, n.output_json, limit=changes.MAX_PATHS)
    if n.previous_output is None:
        return None
    lines = changes.text_diff(
        n.previous_output, n.output or "",
        old_name=f"run {found['since']}", new_name=f"run {n.run_id}",
    )  # fmt: skip
    return lines[: changes.MAX_DIFF_LINES]


def changes_json(notification: Notification) -> dict[str, Any] | None:
    """``what_changed`` for a webhook: ``{"since_run", "paths": [{path, old, new}]}`` or
    ``{"since_run", "diff": "..."}``."""
    found = what_changed(notification)
    decided = decision(notification)
    if found is None or decided is None:
        return None
    since = decided.get("since")
    if notification.output_json is not None:
        paths = [c.json() for c in found if isinstance(c, changes.Change)]
        return {"since_run": since, "paths": paths}
    return {"since_run": since, "diff": "\n".join(str(line) for line in found)}


def output_text(
    notification: Notification, *, markdown: bool = True, limit: int = MAX_TEXT_CHARS
) -> str:
    """The output as a message shows it: a structured answer as a readable list (Markdown, or
    plain text; made only as far as ``limit`` characters), else the text."""
    if notification.output_json is not None:
        return changes.readable_text(notification.output_json, bold=markdown, limit=limit)
    return notification.output or ""


async def rendered(build: Callable[[Notification], T], notification: Notification) -> T:
    """``build(notification)`` (a channel's message, made from the output) in a worker thread
    with a deadline (``offload``), so no output holds the event loop; past the deadline the
    message is made again in plain form, which reads no Markdown and compares nothing."""
    try:
        return await offload.run(
            functools.partial(build, notification),
            field=None, deadline=RENDER_DEADLINE, lane="render",
        )  # fmt: skip
    except TimeoutError:
        log.warning(
            "notification.rendered_plain", notification_id=notification.id,
            run_id=notification.run_id, channel=notification.channel, seconds=RENDER_DEADLINE,
        )  # fmt: skip
        return build(dataclasses.replace(notification, plain=True))


def monitor_markdown(notification: Notification) -> str:
    """A monitor's why and what changed, in Markdown, before the output; '' otherwise."""
    found = decision(notification)
    if found is None:
        return ""
    parts = [f"**Why:** {found['reason']}"]
    differences = what_changed(notification)
    if differences:
        if isinstance(differences[0], changes.Change):
            items = [f"- `{_line(c)}`" for c in differences]
            parts.append("**What changed:**\n\n" + "\n".join(items))
        else:
            fence = "`" * 3
            body = "\n".join(str(line) for line in differences).replace(fence, "'" * 3)
            parts.append(f"**What changed:**\n\n{fence}diff\n{body}\n{fence}")
    return "\n\n".join([*parts, "**Output:**"]) + "\n\n"


def _line(change: changes.Change | str) -> str:
    return change.line() if isinstance(change, changes.Change) else change


def monitor_lines(notification: Notification) -> list[str]:
    """A monitor's why and what changed as plain-text lines (the email's text part)."""
    found = decision(notification)
    if found is None:
        return []
    lines = [f"Why:      {found['reason']}"]
    differences = what_changed(notification)
    if differences:
        lines += ["", "What changed:", ""]
        lines += [f"  {_line(c)}" for c in differences]
    return lines


def run_link(public_url: str | None, notification: Notification) -> str | None:
    """The run's page in the console (``PROMPTSCHED_PUBLIC_URL``), or None without one."""
    if not public_url:
        return None
    return f"{public_url.rstrip('/')}/runs/{notification.run_id}"


def clip(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters cut]"


class DeliveryError(PromptschedError):
    """A send failed. ``retryable`` (the same sense as ``ExecutorError.retryable``) is False when
    trying again gives the same answer (the notification goes dead at once); ``retry_after``
    (seconds) is the receiver's own wish; ``fix`` what to change when the configuration is
    the cause (the message says it too)."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = True,
        retry_after: float | None = None,
        fix: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.retry_after = retry_after
        self.fix = fix


class Sender(Protocol):
    """One channel. ``send`` returns an optional note for the log (e.g. recipients refused
    while others accepted), raises ``DeliveryError``, and aborts promptly when cancelled."""

    channel: str

    async def send(self, notification: Notification) -> str | None: ...

    async def aclose(self) -> None: ...
