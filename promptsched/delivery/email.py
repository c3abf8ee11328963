"""The email channel: one message per owed notification over SMTP (aiosmtplib), with a
Message-ID that is the same on every re-send so mail clients recognise duplicates. Each message
is ``multipart/alternative``: a plain-text part and an HTML part (``delivery/email_html.py``)."""

from __future__ import annotations

import email.utils
import functools
import ssl
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
    output_text,
    plain,
    rendered,
    report_lines,
    run_link,
    title,
)
from promptsched.human import text
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
    n = notification
    if n.event in REPORTS or n.check is not None:
        return f"[promptsched] {title(n)[:250]}"
    return f"[promptsched] {title(n)[:250]} ({n.slot_text()})"


def _head(n: Notification) -> list[str]:
    """Whose message it is and where the run stands, one fact a line."""
    attempts = text.plural(n.run_attempts, "attempt")
    ended = _RUN_ENDED.get(n.event, str(n.event))
    lines = [f"Schedule: {n.schedule_name} (#{n.schedule_id})"]
    if n.check is not None:
        lines = [f"Follow-up: {n.check.key} (schedule #{n.schedule_id})"]
        if n.check.number is not None:
            lines.append(f"Check:    {n.check.headline(n.timezone).removeprefix('check ')}")
    return [
        *lines,
        f"Slot:     {n.slot_text()}",
        f"Run:      #{n.run_id} ({n.origin}), {ended} after {attempts}",
        f"Finished: {n.finished_text()}",
    ]


# How the run ended, for the Run line (a report is about the run that tipped it).
_RUN_ENDED = {"succeeded": "succeeded", "dead": "failed", "paused": "failed",
              "escalation": "succeeded", "digest": "skipped", "budget": "skipped"}  # fmt: skip


def body(notification: Notification, public_url: str | None = None) -> str:
    """The plain-text part."""
    n = notification
    lines = _head(n)
    link = run_link(public_url, n)
    if link:
        lines.append(f"Details:  {link}")
    lines.append("")
    if n.succeeded:
        monitor = monitor_lines(n)
        output = clip(output_text(n, markdown=False))
        lines += [*monitor, *([""] if monitor else []), "Output:", "", output]
    elif n.event in REPORTS:
        lines += [plain(next_steps(n) or ""), "", *report_lines(n)]
    else:
        lines += [plain(next_steps(n) or ""), "", "Last error:", "",
                  clip(n.error or "(none recorded)")]  # fmt: skip
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


def tls_problem(exc: BaseException, settings: EmailSettings) -> DeliveryError | None:
    """A configuration error when ``PROMPTSCHED_SMTP_TLS`` does not match the server (or its
    certificate is refused), naming what to set; None when ``exc`` is not such a failure.
    Trying again cannot help: the setting must change."""
    where = f"{settings.host}:{settings.port}"
    problem = fix = None
    cause = exc.__cause__ or exc.__context__
    if settings.tls == "starttls" and "STARTTLS" in str(exc) and "not supported" in str(exc):
        problem = (
            f"smtp: the server at {where} does not offer STARTTLS, which "
            "PROMPTSCHED_SMTP_TLS=starttls (the default) requires"
        )
        fix = (
            "set PROMPTSCHED_SMTP_TLS=none for a plain server (a local relay, a test sink), "
            "or tls for implicit TLS (port 465)"
        )
    elif isinstance(cause, ssl.SSLCertVerificationError):
        problem = f"smtp: the certificate of {where} was not accepted ({cause.verify_message})"
        fix = "check PROMPTSCHED_SMTP_HOST: it must be the name on the server's certificate"
    elif settings.tls == "tls" and isinstance(cause, ssl.SSLError):
        problem = (
            f"smtp: the server at {where} does not speak implicit TLS, which "
            "PROMPTSCHED_SMTP_TLS=tls requires"
        )
        fix = (
            "set PROMPTSCHED_SMTP_TLS=starttls (usually port 587) or none, or "
            "PROMPTSCHED_SMTP_PORT to the server's TLS port (465)"
        )
    if problem is None or fix is None:
        return None
    return DeliveryError(f"{problem}: {fix}", retryable=False, fix=fix)


def _client(settings: EmailSettings) -> aiosmtplib.SMTP:
    return aiosmtplib.SMTP(
        hostname=settings.host,
        port=settings.port,
        use_tls=settings.tls == "tls",
        # False, not None: "none" must not upgrade opportunistically either.
        start_tls=settings.tls == "starttls",
        timeout=settings.timeout,
    )


async def check_server(settings: EmailSettings) -> str:
    """Connect as a send would (TLS as set) and log in when a user is set, then quit without
    sending anything; the words for what worked, or a ``DeliveryError`` saying what to set."""
    if not settings.host:
        fix = "set PROMPTSCHED_SMTP_HOST"
        raise DeliveryError(f"SMTP is not configured: {fix}", retryable=False, fix=fix)
    client = _client(settings)
    try:
        await client.connect()
        if settings.username:
            password = settings.password.reveal() if settings.password else ""
            await client.login(settings.username, password)
        await client.quit()
    except Exception as exc:
        raise _redact(settings, _classify(exc, settings)) from None
    login = f", logged in as {settings.username}" if settings.username else ""
    return f"{settings.host}:{settings.port} answered ({settings.tls}{login}); nothing was sent"


def _classify(exc: Exception, settings: EmailSettings) -> DeliveryError:
    """The ``DeliveryError`` of a failed SMTP exchange: a TLS mismatch or a refused login are
    the configuration's (not retried); a 4xx or a broken connection may pass."""
    problem = tls_problem(exc, settings)
    if problem is not None:
        return problem
    if isinstance(exc, aiosmtplib.SMTPRecipientsRefused):
        return _refused(exc)
    if isinstance(exc, aiosmtplib.SMTPAuthenticationError):
        fix = "check PROMPTSCHED_SMTP_USERNAME and PROMPTSCHED_SMTP_PASSWORD"
        return DeliveryError(
            f"smtp: {exc.code} {_one_line(exc.message)} ({fix})", retryable=False, fix=fix
        )
    if isinstance(exc, aiosmtplib.SMTPResponseException):
        return DeliveryError(f"smtp: {exc.code} {_one_line(exc.message)}", retryable=exc.code < 500)
    if isinstance(exc, aiosmtplib.SMTPNotSupported):
        return DeliveryError(f"smtp: {exc}", retryable=False)
    if isinstance(exc, aiosmtplib.SMTPException | OSError):
        fix = "check PROMPTSCHED_SMTP_HOST and PROMPTSCHED_SMTP_PORT, and that the server is up"
        return DeliveryError(f"smtp: {type(exc).__name__}: {exc}", fix=fix)
    raise exc


def _redact(settings: EmailSettings, error: DeliveryError) -> DeliveryError:
    password = settings.password
    if password is None or password.redact(error.message) == error.message:
        return error
    return DeliveryError(password.redact(error.message), retryable=error.retryable, fix=error.fix)


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
        message = await rendered(functools.partial(build_message, settings=settings), notification)
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
        except (aiosmtplib.SMTPException, OSError) as exc:
            raise _redact(settings, _classify(exc, settings)) from None
        if errors:
            refused = ", ".join(f"{rcpt}: {r.code}" for rcpt, r in errors.items())
            return f"delivered, but refused for {refused}"
        return None

    async def aclose(self) -> None:
        return None
