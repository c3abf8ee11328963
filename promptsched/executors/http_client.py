"""The HTTP plumbing of the HTTP providers: one POST, and how it ends (statuses, ``Retry-After``,
transport failures and bodies) mapped onto the executor error tree.

| outcome                                   | error            |
| ----------------------------------------- | ---------------- |
| timeout, connection refused/reset/dropped | RetryableError   |
| 429; 503 with ``Retry-After``             | Throttled        |
| a kind's own "not now" statuses           | Throttled        |
| other 5xx, 408 (``Retry-After`` honoured) | RetryableError   |
| 3xx (not followed), other 4xx             | PermanentError   |
| unparsable or incomplete 2xx body         | PermanentError   |

Each kind of provider says "not now" the same way, with a few words of its own
(``Pushback``): statuses it always means as throttling (Anthropic's 529 "overloaded" and 503)
and a wait its error body may name when no ``Retry-After`` does (Gemini's ``RetryInfo``).

A request that a server closed a REUSED connection under, before any byte of an answer (the
keep-alive race, ``http_pool.closed_unanswered``), is first sent once more on a new
connection, within the same request timeout; only if that fails too is it one of the above.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from typing import Any

import aiohttp
import structlog

from promptsched import storable
from promptsched.durations import format_duration
from promptsched.errors import ExecutorError, PermanentError, RetryableError, Throttled
from promptsched.executors import http_pool, ratelimit
from promptsched.retry import MAX_RETRY_AFTER
from promptsched.secret import Secret

log = structlog.get_logger("http")

# A provider's sessions (``http_pool.LazySession``: a resend on a new connection is possible),
# or one plain aiohttp session (a probe's: every request is sent once).
Session = aiohttp.ClientSession | http_pool.LazySession

EXCERPT_CHARS = 300
MAX_RESPONSE_BYTES = 10 * 1024 * 1024
_RETRYABLE_4XX = frozenset({408, 429})
_SECONDS = re.compile(r"\d+(?:\.\d+)?")
_REASONS = {529: "Overloaded"}  # Anthropic's own status, not in the HTTP registry
_HINTS = {
    401: " (check the provider's API key)",
    403: " (check the provider's API key and its permissions)",
    404: " (check the provider's base_url and the model name)",
}


def seconds_text(seconds: float) -> str:
    """``12s``, ``300ms``, ``2m``: the duration syntax users write."""
    return format_duration(timedelta(seconds=seconds))


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delay-seconds or an HTTP-date), relative
    to ``now`` (aware). ``None`` when absent or unreadable; a date in the past gives 0; at most
    MAX_RETRY_AFTER (a header is the provider's to write: no wait it asks for may be more than
    a run can be stored waiting for)."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if _SECONDS.fullmatch(text):
        return min(float(text), MAX_RETRY_AFTER)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000" parses naive; HTTP-dates are always GMT
        when = when.replace(tzinfo=UTC)
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return min(max(0.0, (when - now).total_seconds()), MAX_RETRY_AFTER)


def _reference_now(headers: Mapping[str, str], now: datetime | None) -> datetime:
    # An HTTP-date Retry-After is best read against the response's own Date header: both come
    # from the server's clock, so our clock's skew does not matter.
    date = headers.get("date")
    if date:
        try:
            parsed = email.utils.parsedate_to_datetime(date)
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
        except (TypeError, ValueError, IndexError):
            pass
    return now if now is not None else datetime.now(UTC)


def _json_message(text: str) -> str | None:
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    error = data.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    for key in ("error", "message", "detail"):
        if isinstance(data.get(key), str):
            return str(data[key])
    return None


def body_excerpt(body: bytes | str, limit: int = EXCERPT_CHARS) -> str:
    """A short one-line excerpt of an error body (the ``error.message`` of a JSON error)."""
    text = storable.decode(body) if isinstance(body, bytes) else storable.clean(body)
    text = _json_message(text) or text
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class Pushback:
    """What a kind of provider says "not now" with, beyond the rules every provider shares:
    ``throttled``, statuses that are always throttling (with or without ``Retry-After``), and
    ``body_delay``, the wait an error body names (its text in, seconds out, or None), read
    when no ``Retry-After`` header says one."""

    throttled: frozenset[int] = frozenset()
    body_delay: Callable[[str], float | None] | None = None


SHARED = Pushback()  # the openai and webhook kinds: the shared rules only


def classify_status(
    status: int,
    headers: Mapping[str, str],
    body_excerpt: str,
    *,
    provider: str = "http",
    now: datetime | None = None,
    pushback: Pushback = SHARED,
    body_delay: float | None = None,
) -> ExecutorError:
    """The error for a non-2xx response. 5xx, 408 and 429 are retryable (with ``retry_after``
    from ``Retry-After``, else ``body_delay``, and the pacing its rate-limit headers ask
    for); a 429, a 503 with ``Retry-After``, and the statuses of ``pushback.throttled`` are
    throttling (``Throttled``); anything else is permanent.

    An HTTP-date ``Retry-After`` is measured from the response's ``Date`` header, else from
    ``now``, else from the local wall clock.
    """
    lowered = {key.lower(): value for key, value in headers.items()}
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = _REASONS.get(status, "")
    label = f"{provider}: HTTP {status} {reason}".rstrip()
    detail = f": {body_excerpt}" if body_excerpt else ""
    if status >= 500 or status in _RETRYABLE_4XX:
        retry_after = parse_retry_after(lowered.get("retry-after"), _reference_now(lowered, now))
        if retry_after is None and body_delay is not None:
            retry_after = min(body_delay, MAX_RETRY_AFTER)
        if retry_after is not None:
            label += f" (retry after {seconds_text(retry_after)})"
        pace = ratelimit.pace_of(lowered, now)
        throttled = (
            status == 429
            or status in pushback.throttled
            or (status == 503 and retry_after is not None)
        )
        kind = Throttled if throttled else RetryableError
        return kind(label + detail, retry_after=retry_after, pace=pace)
    if 300 <= status < 400:
        location = lowered.get("location", "?")
        return PermanentError(
            f"{label}: redirect to {location} not followed (set base_url to the final URL)"
        )
    return PermanentError(label + _HINTS.get(status, "") + detail)


def invalid_response(provider: str, detail: str) -> PermanentError:
    return PermanentError(f"{provider}: invalid response: {detail}")


def classify_exception(
    exc: BaseException, *, provider: str, connect_timeout: float
) -> ExecutorError | None:
    """The error for a transport failure, or ``None`` if ``exc`` is not one (re-raise it)."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return RetryableError(
            f"{provider}: connection timed out after {seconds_text(connect_timeout)}"
        )
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return RetryableError(f"{provider}: timed out: {exc}")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return RetryableError(f"{provider}: connection lost while reading the response ({exc})")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return RetryableError(f"{provider}: server closed the connection before answering")
    if isinstance(exc, aiohttp.ClientConnectorError):
        reason = exc.os_error.strerror or str(exc.os_error) or type(exc.os_error).__name__
        return RetryableError(f"{provider}: cannot connect to {exc.host}:{exc.port}: {reason}")
    if isinstance(exc, aiohttp.InvalidURL):
        return PermanentError(f"{provider}: invalid URL {exc}")
    if isinstance(exc, aiohttp.ClientResponseError):
        return invalid_response(provider, exc.message)
    if isinstance(exc, aiohttp.ClientError | OSError):
        return RetryableError(f"{provider}: connection error: {str(exc) or type(exc).__name__}")
    return None


def redact_error(error: ExecutorError, secret: Secret | None) -> ExecutorError:
    """``error`` with the secret masked out of its message (a server may echo the key back)."""
    if secret is None or secret.redact(error.message) == error.message:
        return error
    return type(error)(
        secret.redact(error.message), retry_after=error.retry_after, usage=error.usage,
        pace=error.pace,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class HttpReply:
    """A 2xx response, fully read."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    charset: str | None

    def text(self) -> str:
        """The body as storable text (``storable.decode``): what a provider sent enters here."""
        return storable.decode(self.body, self.charset)

    def json(self, provider: str) -> Any:
        """The body's JSON, its strings storable (a ``\\u0000`` or a lone ``\\ud800`` escape
        is read as any other character would be, then cleaned)."""
        try:
            return storable.clean(json.loads(self.text()))
        except ValueError as exc:
            raise invalid_response(provider, f"body is not JSON ({exc})") from None


def request_headers(
    configured: Mapping[str, str],
    api_key: Secret | None,
    *,
    user_agent: str = "promptsched",
    key_header: str | None = None,
) -> dict[str, str]:
    """Configured headers plus ``User-Agent`` and, with a key, ``Authorization: Bearer`` (or
    the key alone in ``key_header``: Anthropic's ``x-api-key``, Gemini's ``x-goog-api-key``).

    The result holds the revealed key: build it per request and never log it.
    """
    headers = {"User-Agent": user_agent, **configured}
    if api_key:
        if key_header is None:
            headers["Authorization"] = f"Bearer {api_key.reveal()}"
        else:
            headers[key_header] = api_key.reveal()
    return headers


async def _read_limited(response: aiohttp.ClientResponse, provider: str) -> bytes:
    length = response.content_length
    if length is not None and length <= MAX_RESPONSE_BYTES:
        # The usual answer: its length is known and within bounds (aiohttp reads exactly
        # that much), so one read rather than a loop over chunks.
        return await response.read()
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise invalid_response(provider, f"body larger than {MAX_RESPONSE_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _exchange(
    session: aiohttp.ClientSession,
    url: str,
    data: bytes | None,
    headers: Mapping[str, str],
    provider: str,
    pushback: Pushback,
    wire: http_pool.Wire | None = None,
) -> HttpReply:
    method = "GET" if data is None else "POST"
    async with session.request(
        method, url, data=data, headers=headers, allow_redirects=False
    ) as response:
        if wire is not None:
            wire.answered = True  # its status line and headers arrived
        body = await _read_limited(response, provider)
        if not 200 <= response.status < 300:
            delay = None
            if pushback.body_delay is not None:
                delay = pushback.body_delay(storable.decode(body, response.charset))
            raise classify_status(
                response.status, response.headers, body_excerpt(body), provider=provider,
                pushback=pushback, body_delay=delay,
            )  # fmt: skip
        return HttpReply(response.status, response.headers, body, response.charset)


async def _send(
    session: Session,
    url: str,
    data: bytes | None,
    headers: Mapping[str, str],
    provider: str,
    pushback: Pushback,
) -> HttpReply:
    """One exchange; on a provider's sessions, once more on a new connection when a reused one
    was closed under it before any answer (the server may have read the request, never
    answered it: the same as what a retried attempt would send, without spending one)."""
    if isinstance(session, aiohttp.ClientSession):
        return await _exchange(session, url, data, headers, provider, pushback)
    with http_pool.sending() as wire:
        try:
            return await _exchange(session.get(), url, data, headers, provider, pushback, wire)
        except (aiohttp.ClientError, OSError) as exc:
            if not http_pool.closed_unanswered(exc, wire):
                raise
            # Never the headers or the URL: they may hold the API key.
            log.debug("http_resent_on_new_connection", provider=provider, error=type(exc).__name__)
    return await _exchange(session.fresh(), url, data, headers, provider, pushback)


async def post_json(
    session: Session,
    url: str,
    payload: Mapping[str, Any],
    *,
    headers: Mapping[str, str],
    provider: str,
    request_timeout: float,
    connect_timeout: float,
    pushback: Pushback = SHARED,
) -> HttpReply:
    """POST ``payload`` as JSON and return the 2xx reply, or raise a classified error
    (``pushback``: the provider kind's own ways of saying "not now").

    ``request_timeout`` bounds the whole exchange (connect, send, read the body). Cancellation
    from outside (a fenced attempt) propagates untouched and aborts the connection.
    """
    try:
        data = json.dumps(payload, ensure_ascii=False).encode()
    except (TypeError, ValueError) as exc:
        raise PermanentError(f"{provider}: request is not JSON-serializable: {exc}") from None
    all_headers = {"Content-Type": "application/json", **headers}
    return await _request(
        session, url, data, all_headers, provider, request_timeout, connect_timeout, pushback
    )


async def get(
    session: Session,
    url: str,
    *,
    headers: Mapping[str, str],
    provider: str,
    request_timeout: float,
    connect_timeout: float,
    pushback: Pushback = SHARED,
) -> HttpReply:
    """GET ``url`` and return the 2xx reply, or raise a classified error (as ``post_json``)."""
    return await _request(
        session, url, None, headers, provider, request_timeout, connect_timeout, pushback
    )


async def _request(
    session: Session,
    url: str,
    data: bytes | None,
    headers: Mapping[str, str],
    provider: str,
    request_timeout: float,
    connect_timeout: float,
    pushback: Pushback,
) -> HttpReply:
    try:
        # asyncio's timeout, not anyio's fail_after: the same TimeoutError for a fraction of
        # the cost (a cancel scope was a tenth of an attempt's CPU at thousands in flight).
        async with asyncio.timeout(request_timeout):
            return await _send(session, url, data, headers, provider, pushback)
    except ExecutorError:
        raise
    except aiohttp.ClientError as exc:  # before TimeoutError: aiohttp's timeouts subclass it
        raise _transport_error(exc, provider, connect_timeout) from None
    except TimeoutError:
        message = f"{provider}: request timed out after {seconds_text(request_timeout)}"
        raise RetryableError(message) from None
    except OSError as exc:
        raise _transport_error(exc, provider, connect_timeout) from None


def _transport_error(exc: BaseException, provider: str, connect_timeout: float) -> ExecutorError:
    error = classify_exception(exc, provider=provider, connect_timeout=connect_timeout)
    return error or RetryableError(f"{provider}: {type(exc).__name__}: {exc}")
