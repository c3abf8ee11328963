"""How a tool reaches the API's operations: in-process for an authenticated principal (the
service's ``/mcp``, and ``promptsched mcp`` on the database directly), or over HTTP with a
token (``promptsched mcp --url``). Both answer the route's status and JSON, and refuse with the
API's own error (its status, code, message and field)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp
import structlog

from promptsched.api import app as api_app
from promptsched.api import http
from promptsched.ops import lookups
from promptsched.web import auth
from promptsched.web.deps import Deps

log = structlog.get_logger("mcp")

OPERATIONS = {op.operation_id: op for op in api_app.OPERATIONS}
TIMEOUT = aiohttp.ClientTimeout(total=60)


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    data: Any  # the route's JSON; None for 204


class Refused(Exception):
    """The API's error answer, as it words it."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field


class Gateway(Protocol):
    async def call(
        self,
        operation: str,
        params: Mapping[str, Any] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> Answer:
        """The operation's answer; raises ``Refused`` with the API's error."""
        ...


class InProcess:
    """The API's operations called in this process for ``principal``, checked exactly as
    over HTTP (``api.http.invoke``)."""

    def __init__(self, deps: Deps, principal: auth.Principal) -> None:
        self.deps, self.principal = deps, principal

    async def call(
        self,
        operation: str,
        params: Mapping[str, Any] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> Answer:
        op = OPERATIONS[operation]
        try:
            response = await lookups.retry_stale(  # one unit of work, as a request is
                lambda: http.invoke(op, self.deps, self.principal, params or {}, body)
            )
        except Exception as exc:
            request_id = uuid.uuid4().hex
            known = api_app.error_answer(exc, request_id)
            if known is None:  # a bug of ours: logged with its id, never shown
                log.exception("mcp.unexpected_error", request_id=request_id, operation=operation)
                raise Refused(
                    500, "internal", f"unexpected server error (request id {request_id})"
                ) from None
            status, error = known
            raise Refused(status, error["code"], error["message"], error["field"]) from None
        body_bytes = getattr(response, "body", None)
        if response.status == 204 or not isinstance(body_bytes, bytes | bytearray):
            return Answer(response.status, None)
        return Answer(response.status, json.loads(body_bytes))


class OverHttp:
    """The API's operations over ``/v1`` of a service, with a token: as its owner."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url.rstrip("/"), token
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> OverHttp:
        self._session = aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {self.token}"}, timeout=TIMEOUT
        )
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._session is not None:
            await self._session.close()

    async def call(
        self,
        operation: str,
        params: Mapping[str, Any] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> Answer:
        assert self._session is not None, "use the gateway as an async context manager"
        op = OPERATIONS[operation]
        given = dict(params or {})
        path = op.path
        for param in op.params:
            if param.where == "path" and param.name in given:
                path = path.replace(f"{{{param.name}}}", quote(str(given.pop(param.name)), safe=""))
        query = {k: str(v).lower() if isinstance(v, bool) else str(v)
                 for k, v in given.items() if v is not None}  # fmt: skip
        try:
            async with self._session.request(
                op.method, self.url + path, params=query, json=dict(body) if body else None
            ) as response:
                text = await response.text()
                data = _json(text) if response.content_type == "application/json" else None
        except aiohttp.ClientError as exc:
            raise Refused(
                503, "unreachable", f"cannot reach the promptsched service at {self.url} "
                f"({type(exc).__name__}): is it running, and is PROMPTSCHED_URL its address?",
            ) from None  # fmt: skip
        except TimeoutError:
            raise Refused(504, "timeout", f"{self.url} did not answer within 60 s") from None
        if response.status >= 400:
            error = data.get("error") if isinstance(data, dict) else None
            if not isinstance(error, dict):  # not the API's own answer: a proxy, another server
                raise Refused(
                    response.status, "http_error",
                    f"{self.url} answered HTTP {response.status} without an API error: is "
                    "PROMPTSCHED_URL the service's base address (without /v1)?",
                )  # fmt: skip
            raise Refused(
                response.status, str(error.get("code")), str(error.get("message")),
                error.get("field"),
            )  # fmt: skip
        return Answer(response.status, data)


def _json(text: str) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None
