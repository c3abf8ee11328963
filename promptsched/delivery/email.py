"""The email channel: one message per owed notification over SMTP (aiosmtplib), with a
Message-ID that is the same on every re-send so mail clients recognise duplicates. Each message
is ``multipart/alternative``: a plain-text part and an HTML part (``delivery/email_html.py``)."""

from __future__ import annotations

import email.utils
from dataclasses import dataclass
from email.message import EmailMessage
from typing import TYPE_CHECKING

import aiosmtplib

from promptsched.delivery import (
    REPORTS,
    DeliveryError,
    Notification,
    clip,
    email_html,
    monitor_lines,
    next_steps,
    outcome_words,
    output_text,
    report_lines,
    run_link,
)
from promptsched.secret import Secret

if TYPE_CHECKING:
    from promptsched.config import Config

_DEFAULT_PORTS = {"none": 25, "starttls": 587, "tls": 465}


@dataclass(frozen=True, slots=True)
class EmailSettings:
    host: str | None
    port: int
    username: str | None
    password: Secret | None
    tls: str  # none | starttls | tls
    sender: str
    timeout: float
    public_url: str | None = None  # the console, for a link to the run

    @classmethod
    def from_config(cls, config: Config) -> EmailSettings:
        return cls(
            host=config.smtp_host,
            port=config.smtp_port or _DEFAULT_PORTS[config.smtp_tls],
            username=config.smtp_username,
            password=config.smtp_password,
            tls=config.smtp_tls,
            sender=config.smtp_from,
            timeout=config.notifier_timeout.total_seconds(),
            public_url=config.public_url,
        )


def message_id(notification: Notification, sender: str) -> str:
    """``<promptsched-42-succeeded-email@example.com>``: stable per run, event and channel."""
    domain = sender.rsplit("@", 1)[-1].strip(" >") or "promptsched.invalid"
    return f"<{notification.idempotency_key}@{domain}>"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def subject(notification: Notification) -> str:
    name = _one_line(notification.schedule_name)[:150]
    if notification.event in REPORTS:
        return f"[promptsched] {name}: {outcome_words(notification)}"
    return f"[promptsched] {name} {outcome_words(notification)} ({notification.slot_text()})"


def body(notification: Notification, public_url: str | None = None) -> str:
    """The plain-text part."""
    n = notification
    finished = n.finished_at.isoformat() if n.finished_at else "-"
    lines = [
        f"Schedule: {n.schedule_name} (#{n.schedule_id})",
        f"Slot:     {n.slot_text()}",
        f"Run:      #{n.run_id} ({n.origin}), {n.event} after {n.run_attempts} attempt(s)",
        f"Finished: {finished}",
    ]
    link = run_link(public_url, n)
    if link:
        lines.append(f"Details:  {link}")
    lines.append("")
    if n.succeeded:
        monitor = monitor_lines(n)
        output = clip(output_text(n, markdown=False))
        lines += [*monitor, *([""] if monitor else []), "Output:", "", output]
    elif n.event in REPORTS:
        lines += [str(next_steps(n)), "", *report_lines(n)]
    else:
        lines += [str(next_steps(n)), "", "Last error:", "", clip(n.error or "(none recorded)")]
    return "\n".join(lines) + "\n"


def build_message(notification: Notification, settings: EmailSettings) -> EmailMessage:
    message = EmailMessage()
    message["From"] = settings.sender
    message["To"] = ", ".join(notification.target)
    message["Subject"] = subject(notification)
    message["Message-ID"] = message_id(notification, settings.sender)
    message["Date"] = email.utils.formatdate(usegmt=True)
    message["Auto-Submitted"] = "auto-generated"
    message["X-Promptsched-Event"] = notification.event_type
    message["X-Promptsched-Run"] = str(notification.run_id)
    message["X-Promptsched-Schedule"] = str(notification.schedule_id)
    message.set_content(body(notification, settings.public_url))
    message.add_alternative(email_html.html(notification, settings.public_url), subtype="html")
    return message


def _refused(exc: aiosmtplib.SMTPRecipientsRefused) -> DeliveryError:
    codes = [r.code for r in exc.recipients]
    detail = "; ".join(f"{r.recipient}: {r.code} {_one_line(r.message)}" for r in exc.recipients)
    # 4xx is the server's "try again later"; only 5xx for every recipient is final.
    return DeliveryError(f"smtp: every recipient refused: {detail}", retryable=min(codes) < 500)


class EmailSender:
    channel = "email"

    def __init__(self, settings: EmailSettings) -> None:
        self.settings = settings

    async def send(self, notification: Notification) -> str | None:
        settings = self.settings
        if not settings.host:
            raise DeliveryError(
                "SMTP is not configured: set PROMPTSCHED_SMTP_HOST (then replay)", retryable=False
            )
        message = build_message(notification, settings)
        try:
            errors, _reply = await aiosmtplib.send(
                message,
                hostname=settings.host,
                port=settings.port,
                username=settings.username,
                password=settings.password.reveal() if settings.password else None,
                use_tls=settings.tls == "tls",
                # False, not None: "none" must not upgrade opportunistically either.
                start_tls=settings.tls == "starttls",
                timeout=settings.timeout,
            )
        except aiosmtplib.SMTPRecipientsRefused as exc:
            raise self._redacted(_refused(exc)) from None
        except aiosmtplib.SMTPResponseException as exc:
            error = DeliveryError(
                f"smtp: {exc.code} {_one_line(exc.message)}", retryable=exc.code < 500
            )
            raise self._redacted(error) from None
        except aiosmtplib.SMTPNotSupported as exc:
            raise self._redacted(DeliveryError(f"smtp: {exc}", retryable=False)) from None
        except (aiosmtplib.SMTPException, OSError) as exc:
            error = DeliveryError(f"smtp: {type(exc).__name__}: {exc}")
            raise self._redacted(error) from None
        if errors:
            refused = ", ".join(f"{rcpt}: {r.code}" for rcpt, r in errors.items())
            return f"delivered, but refused for {refused}"
        return None

    def _redacted(self, error: DeliveryError) -> DeliveryError:
        password = self.settings.password
        if password is None or password.redact(error.message) == error.message:
            return error
        return DeliveryError(password.redact(error.message), retryable=error.retryable)

    async def aclose(self) -> None:
        return None
