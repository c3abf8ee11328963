"""Request plumbing shared by the handlers: the operation table entry (which also feeds the
OpenAPI document), parameter and body parsing against the schemas, errors, and replies."""

from __future__ import annotations

import difflib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web

from promptsched.errors import ValidationError
from promptsched.ops import schemas, validate
from promptsched.web import auth
from promptsched.web.deps import Deps


class ApiError(Exception):
    """An HTTP error with a JSON body ``{"error": {"code", "message", "field"}}``."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.headers = dict(headers or {})


@dataclass(slots=True)
class Call:
    """One request, authenticated and parsed."""

    request: web.Request | None  # None for an operation invoked in-process (``invoke``)
    deps: Deps
    principal: auth.Principal | None
    params: dict[str, Any]
    body: dict[str, Any]

    @property
    def who(self) -> auth.Principal:
        assert self.principal is not None, "an operation without auth has no principal"
        return self.principal

    @property
    def scope(self) -> str | None:
        """The owner filter for queries: None (every owner) for an admin token."""
        return self.who.scope


Handler = Callable[[Call], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    where: Literal["path", "query", "header"]
    schema: schemas.Schema
    required: bool = False
    description: str = ""


@dataclass(frozen=True, slots=True)
class Reply:
    description: str
    schema: str | None = None  # a component name
    headers: tuple[str, ...] = ()
    media: str = "application/json"


@dataclass(frozen=True, slots=True)
class Operation:
    """One route: registered with aiohttp and documented in OpenAPI from the same entry."""

    method: str
    path: str
    handler: Handler
    operation_id: str
    summary: str
    tag: str
    replies: Mapping[str, Reply]
    params: tuple[Param, ...] = ()
    body: str | None = None  # a component name
    body_required: bool = True
    auth: bool = True
    description: str = ""

    @property
    def body_schema(self) -> str | None:
        """The component the body is checked against. An operation that changes something
        but declares no body takes none (or ``{}``), so a stray field is refused there as it
        is everywhere else, instead of being silently ignored."""
        if self.body is not None:
            return self.body
        return schemas.EMPTY if self.method in _CHANGING else None

    @property
    def needs_body(self) -> bool:
        return self.body is not None and self.body_required


_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


ID_PARAM = Param("id", "path", schemas.ID, required=True)
LIMIT = Param(
    "limit", "query", {"type": "integer", "minimum": 1, "maximum": schemas.MAX_PAGE, "default": 50}
)
CURSOR = Param(
    "cursor",
    "query",
    {"type": "string", "pattern": "^[0-9]{1,18}$"},
    description="next_cursor from the previous page",
)


def json_reply(
    data: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.json_response(data, status=status, headers=headers)


def _coerce(raw: str, param: Param) -> Any:
    """A query or path string as the type its schema names (checked by ``schemas.check``)."""
    kinds = validate.types_of(param.schema)
    if "integer" in kinds:
        text = raw.strip()
        digits = text[1:] if text[:1] in "+-" else text
        if not digits.isascii() or not digits.isdigit() or len(digits) > 19:
            raise ValidationError(param.name, f"must be a whole number, got {raw[:40]!r}")
        return int(text)
    if "boolean" in kinds:
        if raw not in ("true", "false"):
            raise ValidationError(param.name, f"must be true or false, got {raw[:40]!r}")
        return raw == "true"
    validate.check_storable(raw, param.name)
    return raw


def _unknown_query(params: Sequence[Param], request: web.Request) -> None:
    """A parameter the operation does not take is an error, not silently ignored (a typo)."""
    known = [p.name for p in params if p.where == "query"]
    for name in request.query:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValidationError(name[:60] or "query", f"is not a known parameter{hint}")


def parse_params(params: Sequence[Param], request: web.Request) -> dict[str, Any]:
    _unknown_query(params, request)
    found: dict[str, Any] = {}
    for param in params:
        source: Mapping[str, str] = {
            "path": request.match_info,
            "query": request.query,
            "header": request.headers,
        }[param.where]
        raw = source.get(param.name)
        if raw is None:
            if param.required:
                raise ValidationError(param.name, "is required")
            found[param.name] = param.schema.get("default")
            continue
        found[param.name] = validate.check(_coerce(raw, param), param.schema, param.name)
    return found


async def read_body(request: web.Request, component: str, required: bool) -> dict[str, Any]:
    """The JSON body checked against ``component``; 400 when it is not JSON at all."""
    raw = await request.read()  # aiohttp answers 413 past client_max_size
    if not raw.strip():
        if required:
            raise ApiError(400, "malformed_json", "the request needs a JSON object body")
        return {}
    data = validate.parse_json(raw)
    validate.check_storable(data)
    checked: dict[str, Any] = validate.check(data, schemas.COMPONENTS[component])
    return checked


def check_params(params: Sequence[Param], given: Mapping[str, Any]) -> dict[str, Any]:
    """Parameters given as JSON values (an in-process call) checked as ``parse_params`` checks
    them off a request: a string is read as the route reads it, anything else checked as is."""
    known = {p.name for p in params}
    for name in given:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValidationError(name[:60], f"is not a known parameter{hint}")
    found: dict[str, Any] = {}
    for param in params:
        raw = given.get(param.name)
        if raw is None:
            if param.required:
                raise ValidationError(param.name, "is required")
            found[param.name] = param.schema.get("default")
            continue
        value = _coerce(raw, param) if isinstance(raw, str) else raw
        found[param.name] = validate.check(value, param.schema, param.name)
    return found


def check_body(op: Operation, body: Mapping[str, Any] | None) -> dict[str, Any]:
    """A body given as a JSON object (an in-process call) checked as ``read_body`` checks it."""
    component = op.body_schema
    if component is None:
        return {}
    if not body:
        if op.needs_body:
            raise ApiError(400, "malformed_json", "the request needs a JSON object body")
        body = {}
    validate.check_storable(body)
    checked: dict[str, Any] = validate.check(dict(body), schemas.COMPONENTS[component])
    return checked


async def invoke(
    op: Operation,
    deps: Deps,
    principal: auth.Principal | None,
    params: Mapping[str, Any],
    body: Mapping[str, Any] | None = None,
    request: web.Request | None = None,
) -> web.StreamResponse:
    """``op`` called in-process for an already authenticated principal, its parameters and
    body checked exactly as over HTTP (the MCP endpoint answers its tools this way)."""
    if op.auth and principal is None:
        raise ApiError(401, "unauthorized", "a valid bearer token is required")
    found = check_params(op.params, params)
    checked = check_body(op, body)
    return await op.handler(Call(request, deps, principal, found, checked))


def endpoint(op: Operation, deps: Deps) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The aiohttp handler for ``op``: authenticate, parse, then call the operation's handler."""

    async def handle(request: web.Request) -> web.StreamResponse:
        principal = None
        if op.auth:
            principal = await auth.authenticate(request, deps.pool, deps.clock)
            if principal is None:
                raise ApiError(
                    401,
                    "unauthorized",
                    "a valid bearer token is required (Authorization: Bearer TOKEN)",
                    headers={"WWW-Authenticate": 'Bearer realm="promptsched"'},
                )
            wait = deps.rates.take(principal.token_id)
            if wait > 0:
                raise ApiError(
                    429,
                    "rate_limited",
                    f"more than {deps.rates.rate:g} requests a second with this token "
                    f"(PROMPTSCHED_API_RATE, bursts of PROMPTSCHED_API_BURST="
                    f"{deps.rates.burst:.0f}); try again after Retry-After",
                    headers={"Retry-After": deps.rates.retry_after(wait)},
                )
        params = parse_params(op.params, request)
        component = op.body_schema
        body = await read_body(request, component, op.needs_body) if component else {}
        return await op.handler(Call(request, deps, principal, params, body))

    return handle
