"""Preview (the scheduler's own fire-time code, nothing stored), health, readiness, metrics,
and the error middleware: unexpected errors become a logged 500 with a request id."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from structlog.testing import capture_logs

from promptsched.api import app as api_app
from promptsched.console import routes as console_routes
from promptsched.metrics import Metrics
from tests import api_support
from tests.api_support import Api


async def test_preview_uses_the_schedulers_fire_times_and_stores_nothing(
    api: Api, alice: dict[str, str], pool: asyncpg.Pool[Any]
) -> None:
    before = await api_support.snapshot(pool)
    reply = await api.get(
        "/v1/preview",
        alice,
        params={
            "expression": "30 2 * * *",
            "timezone": "Europe/Berlin",
            "from": "2026-03-28T00:00:00Z",
            "count": "3",
        },
    )
    assert reply.status == 200
    # 02:30 does not exist on 29 March 2026 in Berlin: it fires once, at 03:00 (the gap's end).
    assert [t["local"] for t in reply.body["fire_times"]] == [
        "2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00",
    ]  # fmt: skip
    assert reply.body["fire_times"][1]["utc"] == "2026-03-29T01:00:00+00:00"
    seconds = await api.get(
        "/v1/preview",
        alice,
        params={"expression": "*/20 * * * * *", "from": "2026-01-01T00:00:00Z"},
    )
    assert [t["utc"][11:19] for t in seconds.body["fire_times"]] == [
        "00:00:20", "00:00:40", "00:01:00", "00:01:20", "00:01:40",
    ]  # fmt: skip
    every = await api.get(
        "/v1/preview", alice, params={"expression": "90m", "kind": "every", "count": "1"}
    )
    assert every.status == 200 and every.body["kind"] == "every"
    assert len(every.body["fire_times"]) == 1
    assert await api_support.snapshot(pool) == before


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"expression": "61 * * * *"}, "expression"),
        ({"expression": "* * * * *", "timezone": "Mars/Olympus"}, "timezone"),
        ({"expression": "* * * * *", "count": "101"}, "count"),
        ({"expression": "* * * * *", "from": "noon"}, "from"),
        ({"expression": "* * * * *", "kind": "sometimes"}, "kind"),
        ({}, "expression"),
        ({"expression": "* * * * *", "cnt": "3"}, "cnt"),
    ],
)
async def test_preview_errors_name_the_field(
    api: Api, alice: dict[str, str], params: dict[str, str], field: str
) -> None:
    reply = await api.get("/v1/preview", alice, params=params)
    assert reply.status == 422, reply.body
    assert reply.body["error"]["field"] == field


async def test_health_readiness_and_metrics(pool: asyncpg.Pool[Any]) -> None:
    ready = {"value": True}
    app = api_app.build(pool, Metrics(), lambda: ready["value"], mounts=(console_routes.mount,))
    async with TestClient(TestServer(app)) as client:
        assert (await client.get("/healthz")).status == 200
        assert await (await client.get("/readyz")).json() == {"status": "ready"}
        ready["value"] = False
        draining = await client.get("/readyz")
        assert draining.status == 503 and (await draining.json())["status"] == "draining"
        metrics = await client.get("/metrics")
        assert metrics.status == 200 and "promptsched_" in await metrics.text()
        api_support.check_response(
            "GET", "/metrics", metrics.status, metrics.content_type, await metrics.text()
        )


async def test_an_unexpected_error_is_a_500_with_a_logged_request_id() -> None:
    async def broken(request: web.Request) -> web.Response:
        raise RuntimeError("a bug")

    app = web.Application(middlewares=[api_app.errors])
    app.router.add_get("/broken", broken)
    async with TestClient(TestServer(app)) as client:
        with capture_logs() as logs:
            response = await client.get("/broken", headers={"X-Request-Id": "req-42"})
        body = await response.json()
    assert response.status == 500
    assert body["error"] == {
        "code": "internal", "message": "unexpected server error", "field": None,
        "request_id": "req-42",
    }  # fmt: skip
    assert response.headers["X-Request-Id"] == "req-42"
    [event] = [e for e in logs if e["event"] == "api.unexpected_error"]
    assert (event["request_id"], event["path"]) == ("req-42", "/broken")


async def test_an_unreachable_database_is_a_503(pool: asyncpg.Pool[Any], dsn: str) -> None:
    headers = await api_support.bearer(pool, "alice")
    closed = await asyncpg.create_pool(dsn, min_size=0, max_size=1)
    await closed.close()
    app = api_app.build(closed, Metrics(), lambda: True, mounts=(console_routes.mount,))
    async with TestClient(TestServer(app)) as client:
        with capture_logs():
            response = await client.get("/v1/schedules", headers=headers)
        assert response.status == 503
        assert (await response.json())["error"]["code"] == "unavailable"
