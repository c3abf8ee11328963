"""A real SMTP server (aiosmtpd) on 127.0.0.1, port 0, in the test's own event loop: it records
every message it accepts and can be told to refuse the next N deliveries, or all of them, with
a temporary (4xx) or permanent (5xx) reply. Tests wait on ``wait_for`` instead of sleeping."""

from __future__ import annotations

import asyncio
import email
import email.policy
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any

from aiosmtpd.smtp import SMTP, AuthResult, LoginPassword

TEMPORARY = "451 4.3.0 Mailbox busy, try again later"
PERMANENT = "550 5.1.1 No such user here"


@dataclass
class Received:
    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage

    @property
    def message_id(self) -> str:
        return str(self.message["Message-ID"])


@dataclass
class FakeSMTP:
    host: str = "127.0.0.1"
    port: int = 0
    received: list[Received] = field(default_factory=list)
    refusals: int = 0
    _refuse_next: int = 0
    _refuse_always: bool = False
    _reply: str = TEMPORARY
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def refuse_next(self, count: int, reply: str = TEMPORARY) -> None:
        """Refuse the next ``count`` messages at DATA with ``reply``, then accept again."""
        self._refuse_next, self._reply = count, reply

    def refuse_always(self, reply: str = TEMPORARY) -> None:
        self._refuse_always, self._reply = True, reply

    def accept(self) -> None:
        self._refuse_next, self._refuse_always = 0, False

    def message_ids(self) -> list[str]:
        return [item.message_id for item in self.received]

    def env(self) -> dict[str, str]:
        """The settings a ``promptsched run`` process needs to send here."""
        return {
            "PROMPTSCHED_SMTP_HOST": self.host,
            "PROMPTSCHED_SMTP_PORT": str(self.port),
            "PROMPTSCHED_SMTP_TLS": "none",
            "PROMPTSCHED_SMTP_FROM": "promptsched@example.test",
        }

    async def wait_for(self, predicate: Callable[[FakeSMTP], bool]) -> None:
        """Return once ``predicate(self)`` holds; re-checked after every DATA command."""
        while not predicate(self):
            changed = self._changed
            await changed.wait()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        try:
            if self._refuse_always or self._refuse_next > 0:
                self._refuse_next = max(0, self._refuse_next - 1)
                self.refusals += 1
                return self._reply
            message = email.message_from_bytes(envelope.content, policy=email.policy.default)
            self.received.append(Received(envelope.mail_from, list(envelope.rcpt_tos), message))
            return "250 2.0.0 OK: queued"
        finally:
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()


def _authenticator(login: str, password: str) -> Any:
    def check(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
        ok = isinstance(data, LoginPassword) and (data.login, data.password) == (
            login.encode(),
            password.encode(),
        )
        return AuthResult(success=ok, handled=False)

    return check


@asynccontextmanager
async def start_fake_smtp(credentials: tuple[str, str] | None = None) -> AsyncIterator[FakeSMTP]:
    """With ``credentials``, AUTH (over plain text, as in a test) is required."""
    fake = FakeSMTP()
    loop = asyncio.get_running_loop()
    options: dict[str, Any] = {}
    if credentials is not None:
        options = {
            "authenticator": _authenticator(*credentials),
            "auth_required": True,
            "auth_require_tls": False,
        }
    # hostname given so aiosmtpd does not look up the machine's FQDN (slow without DNS).
    server = await loop.create_server(
        lambda: SMTP(fake, hostname="fake-smtp", **options), fake.host, 0
    )
    fake.port = server.sockets[0].getsockname()[1]
    try:
        yield fake
    finally:
        server.close()
        await server.wait_closed()
