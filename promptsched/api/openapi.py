"""The OpenAPI 3.1 document, built from the operation table the app registers and the schemas
the validator checks requests against, so it cannot drift from the handlers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from promptsched.api.http import Operation, Param, Reply
from promptsched.ops import schemas

_ERROR = "Error"
_HEADERS = {
    "ETag": {"description": "the schedule's version, for If-Match", "schema": {"type": "string"}},
    "WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}},
    "Retry-After": {
        "description": "whole seconds until the token may ask again",
        "schema": {"type": "string"},
    },
}


def _replies(op: Operation) -> dict[str, Reply]:
    replies = dict(op.replies)
    if op.auth:
        replies.setdefault(
            "401", Reply("missing, unknown or revoked token", _ERROR, headers=("WWW-Authenticate",))
        )
        replies.setdefault(
            "429",
            Reply(
                "the token asked more often than PROMPTSCHED_API_RATE allows",
                _ERROR,
                headers=("Retry-After",),
            ),
        )
    if op.params or op.body_schema:
        replies.setdefault("422", Reply("a field is invalid; the error names it", _ERROR))
    if op.body_schema:
        replies.setdefault("400", Reply("the body is not JSON", _ERROR))
        replies.setdefault("413", Reply("the body is too large", _ERROR))
    replies.setdefault("5XX", Reply("server error (with a request id to quote)", _ERROR))
    return dict(sorted(replies.items()))


def _response(reply: Reply) -> dict[str, Any]:
    out: dict[str, Any] = {"description": reply.description}
    if reply.schema is not None:
        out["content"] = {reply.media: {"schema": schemas.ref(reply.schema)}}
    if reply.headers:
        out["headers"] = {name: _HEADERS[name] for name in reply.headers}
    return out


def _parameter(param: Param) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": param.name,
        "in": param.where,
        "required": param.required or param.where == "path",
        "schema": param.schema,
    }
    if param.description:
        out["description"] = param.description
    return out


def _operation(op: Operation) -> dict[str, Any]:
    out: dict[str, Any] = {
        "operationId": op.operation_id,
        "summary": op.summary,
        "tags": [op.tag],
        "responses": {code: _response(reply) for code, reply in _replies(op).items()},
    }
    if op.description:
        out["description"] = op.description
    if op.params:
        out["parameters"] = [_parameter(p) for p in op.params]
    if op.body_schema:
        out["requestBody"] = {
            "required": op.needs_body,
            "content": {"application/json": {"schema": schemas.ref(op.body_schema)}},
        }
    if not op.auth:
        out["security"] = []
    return out


def document(operations: Sequence[Operation]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "promptsched",
            "version": "1",
            "description": "A durable scheduler for LLM prompts. Every /v1 route but this "
            "document needs `Authorization: Bearer TOKEN` (promptsched tokens create).",
        },
        "paths": paths,
        "components": {
            "schemas": schemas.COMPONENTS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }
