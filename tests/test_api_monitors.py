"""Monitors through the API: output_schema and notify_when are saved, shown and changed, and
bad ones are refused at save time with a 4xx naming the field, nothing stored."""

from __future__ import annotations

from typing import Any

import pytest

from tests import api_support
from tests.api_support import SCHEDULE, Api
from tests.test_monitor_rules import STATUS


async def test_a_monitor_is_saved_shown_and_changed(api: Api, alice: dict[str, str]) -> None:
    created = await api.post(
        "/v1/schedules", alice,
        json={**SCHEDULE, "output_schema": STATUS, "notify_when": "/degraded"},
    )  # fmt: skip
    assert created.status == 201, created.body
    assert (created.body["output_schema"], created.body["notify_when"]) == (STATUS, "/degraded")
    sid = created.body["id"]
    patched = await api.patch(f"/v1/schedules/{sid}", alice, json={"notify_when": "changed"})
    assert patched.status == 200 and patched.body["notify_when"] == "changed"
    assert patched.body["output_schema"] == STATUS
    plain = await api.post("/v1/schedules", alice, json={**SCHEDULE, "name": "plain"})
    assert (plain.body["output_schema"], plain.body["notify_when"]) == (None, "always")
    # Dropping the schema of a schedule whose condition reads it is refused.
    dropped = await api.patch(
        f"/v1/schedules/{sid}", alice, json={"output_schema": None, "notify_when": "/degraded"}
    )
    assert dropped.status == 422 and dropped.body["error"]["field"] == "notify_when"


def _deep(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


BAD = [
    pytest.param({"output_schema": {**STATUS, "description": "x" * 20_000}}, "output_schema",
                 "is too large", id="too-large"),
    pytest.param({"output_schema": _deep(13)}, "output_schema", "nests deeper", id="too-deep"),
    pytest.param({"output_schema": {"type": "object", "required": "status"}}, "output_schema",
                 "is not a valid JSON Schema: at /required", id="invalid"),
    pytest.param({"output_schema": {"type": "string"}}, "output_schema", "at its root",
                 id="not-an-object"),
    pytest.param({"output_schema": ["x"]}, "output_schema", "must be an object", id="array"),
    pytest.param({"notify_when": "/degraded"}, "notify_when", "set an output_schema",
                 id="condition-without-schema"),
    pytest.param({"notify_when": "if degraded"}, "notify_when", "is not a condition",
                 id="bad-condition"),
    pytest.param({"output_schema": STATUS, "params": {"response_format": "json_object"}},
                 "params.response_format", "the output_schema sets", id="both-formats"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "field", "message"), BAD)
async def test_a_bad_monitor_is_refused_at_save_time_naming_the_field(
    pool: Any, fields: dict[str, Any], field: str, message: str
) -> None:
    async with api_support.client(pool) as api:
        who = await api.token("alice")
        before = await api_support.snapshot(pool)
        reply = await api.post("/v1/schedules", who, json={**SCHEDULE, **fields})
        assert reply.status == 422, reply.body
        assert reply.body["error"]["field"] == field
        assert message in reply.body["error"]["message"]
        assert await api_support.snapshot(pool) == before
