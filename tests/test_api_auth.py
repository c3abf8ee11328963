"""Bearer tokens and owner isolation: no token is 401; another owner's resource is 404 and
stays unchanged; an admin token sees and changes every owner's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest

from promptsched.clock import Clock
from promptsched.errors import ValidationError
from promptsched.store import queries
from promptsched.web import auth
from tests import api_support, factories
from tests.api_support import DOCUMENT, SCHEDULE, Api


def _protected() -> list[tuple[str, str]]:
    return [
        (method.upper(), path)
        for path, item in DOCUMENT["paths"].items()
        for method, operation in item.items()
        if operation.get("security") != []
    ]


@pytest.mark.parametrize(
    "header",
    [
        pytest.param({}, id="missing"),
        pytest.param({"Authorization": "Basic YWxpY2U6c2VjcmV0"}, id="basic"),
        pytest.param({"Authorization": "Bearer"}, id="empty"),
        pytest.param({"Authorization": "Bearer pst_" + "x" * 43}, id="unknown"),
        pytest.param({"Authorization": "Bearer a b c"}, id="malformed"),
    ],
)
async def test_every_protected_route_needs_a_valid_token(
    api: Api, pool: asyncpg.Pool[Any], header: dict[str, str]
) -> None:
    await api.token("alice")
    before = await api_support.snapshot(pool)
    for method, path in _protected():
        concrete = path.replace("{id}", "1").replace("{other}", "1").replace("{key}", "k1")
        reply = await api.request(method, concrete, header, data=b"{nonsense")
        assert reply.status == 401, (method, path, reply.body)
        assert reply.headers["WWW-Authenticate"].startswith("Bearer")
        assert reply.body["error"]["code"] == "unauthorized"
    assert await api_support.snapshot(pool) == before


async def test_public_routes_need_no_token(api: Api) -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/v1/openapi.json"):
        assert (await api.get(path)).status == 200, path


async def test_tokens_are_stored_hashed_and_can_be_revoked(
    api: Api, pool: asyncpg.Pool[Any]
) -> None:
    token, row = await auth.create_token(pool, owner="alice", name="ci")
    assert token.startswith("pst_") and len(token) > 40
    stored = await pool.fetchrow("SELECT * FROM api_tokens WHERE id = $1", row["id"])
    assert stored["token_hash"] == auth.token_hash(token) != token
    assert stored["last_used_at"] is None
    who = {"Authorization": f"Bearer {token}"}
    assert (await api.get("/v1/schedules", who)).status == 200
    assert await pool.fetchval("SELECT last_used_at FROM api_tokens WHERE id = $1", row["id"])
    await queries.token_revoke(pool, row["id"], None)
    assert (await api.get("/v1/schedules", who)).status == 401
    with pytest.raises(ValidationError):
        await auth.create_token(pool, owner="not an owner")


@dataclass
class World:
    alice: dict[str, str]
    bob: dict[str, str]
    root: dict[str, str]
    ids: dict[str, int]


@pytest.fixture
async def world(api: Api, pool: asyncpg.Pool[Any]) -> World:
    """Alice's schedule, pending run, dead run and dead notification; Bob's schedule."""
    alice, bob = await api.token("alice"), await api.token("bob")
    root = await api.token("root", admin=True)
    schedule = (await api.post("/v1/schedules", alice, json=SCHEDULE)).body["id"]
    failing = await api.post(
        "/v1/schedules",
        alice,
        json={**SCHEDULE, "name": "failing", "max_attempts": 1, "params": {"fail_attempts": 5}},
    )
    dead = (await api.post(f"/v1/schedules/{failing.body['id']}/trigger", alice)).body["id"]
    done = (await api.post(f"/v1/schedules/{schedule}/trigger", alice)).body["id"]
    await factories.worker_pool(pool, Clock()).run_once()
    run = (await api.post(f"/v1/schedules/{schedule}/trigger", alice)).body["id"]
    await api.post("/v1/schedules", bob, json={**SCHEDULE, "name": "bob's"})
    notification = await pool.fetchval(
        "INSERT INTO outbox (run_id, schedule_id, channel, target, event, status, "
        "idempotency_key) SELECT id, schedule_id, 'email', '[\"a@example.com\"]', 'dead', "
        "'dead', 'k' FROM runs WHERE id = $1 RETURNING id",
        dead,
    )
    ids = {"schedule": schedule, "run": run, "dead": dead, "notification": notification,
           "done": done}  # fmt: skip
    return World(alice, bob, root, ids)


PAST = "2026-01-01T00:00:00Z"
# Every route that addresses one resource: (method, template, resource, body, status).
MATRIX = [
    ("GET", "/v1/schedules/{id}", "schedule", None, 200),
    ("PATCH", "/v1/schedules/{id}", "schedule", {"name": "taken over"}, 200),
    ("DELETE", "/v1/schedules/{id}", "schedule", None, 204),
    ("POST", "/v1/schedules/{id}/pause", "schedule", {"reason": "x"}, 200),
    ("POST", "/v1/schedules/{id}/resume", "schedule", None, 200),
    ("POST", "/v1/schedules/{id}/trigger", "schedule", None, 201),
    ("POST", "/v1/schedules/{id}/backfill", "schedule", {"start": PAST, "end": PAST}, 201),
    ("GET", "/v1/schedules/{id}/history", "schedule", None, 200),
    ("GET", "/v1/schedules/{id}/runs", "schedule", None, 200),
    ("GET", "/v1/schedules/{id}/explain", "schedule", None, 200),
    ("GET", "/v1/runs/{id}", "run", None, 200),
    ("POST", "/v1/runs/{id}/cancel", "run", None, 200),
    ("POST", "/v1/runs/{id}/replay", "dead", None, 201),
    ("GET", "/v1/runs/{id}/events", "dead", None, 200),  # a final run: the stream ends
    ("GET", "/v1/runs/{id}/diff/{other}", "done", None, 200),  # compared with itself
    ("GET", "/v1/runs/{id}/output", "done", None, 200),
    ("POST", "/v1/notifications/{id}/replay", "notification", None, 200),
]


def test_the_matrix_covers_every_route_with_an_id() -> None:
    documented = {(m, p) for m, p in _protected() if "{id}" in p}
    assert {(m, p) for m, p, *_ in MATRIX} == documented


@pytest.mark.parametrize("allowed", ["owner", "admin"])
@pytest.mark.parametrize(("method", "template", "resource", "body", "status"), MATRIX)
async def test_isolation(
    api: Api,
    pool: asyncpg.Pool[Any],
    world: World,
    allowed: str,
    method: str,
    template: str,
    resource: str,
    body: Any,
    status: int,
) -> None:
    path = template.replace("{id}", str(world.ids[resource]))
    path = path.replace("{other}", str(world.ids[resource]))
    if template.endswith("explain"):
        path += f"?at={PAST}"
    before = await api_support.snapshot(pool)
    denied = await api.request(method, path, world.bob, json=body)
    assert denied.status == 404, denied.body  # no hint that it exists
    assert await api_support.snapshot(pool) == before
    who = world.alice if allowed == "owner" else world.root
    reply = await api.request(method, path, who, json=body)
    assert reply.status == status, reply.body


async def test_lists_show_only_the_owners_resources(api: Api, world: World) -> None:
    for path in ("/v1/schedules", "/v1/runs", "/v1/notifications/dead"):
        alices = (await api.get(path, world.alice)).body["items"]
        bobs = (await api.get(path, world.bob)).body["items"]
        everyone = (await api.get(path, world.root)).body["items"]
        assert alices, path
        assert {item["id"] for item in alices} | {item["id"] for item in bobs} == {
            item["id"] for item in everyone
        }
        assert not {item["id"] for item in alices} & {item["id"] for item in bobs}
    bob_schedules = (await api.get("/v1/schedules", world.bob)).body["items"]
    assert [s["owner"] for s in bob_schedules] == ["bob"]
    assert (await api.get("/v1/runs", world.bob)).body["items"] == []


async def test_an_admin_filters_schedules_by_owner_and_nobody_else_widens(
    api: Api, world: World
) -> None:
    only_bob = (await api.get("/v1/schedules?owner=bob", world.root)).body["items"]
    assert [s["owner"] for s in only_bob] == ["bob"]
    only_alice = (await api.get("/v1/schedules?owner=alice", world.root)).body["items"]
    assert only_alice and {s["owner"] for s in only_alice} == {"alice"}
    assert (await api.get("/v1/schedules?owner=alice", world.bob)).body["items"] == []
    own = (await api.get("/v1/schedules?owner=bob", world.bob)).body["items"]
    assert [s["owner"] for s in own] == ["bob"]


async def test_an_admin_change_names_the_admin_and_keeps_the_owner(api: Api, world: World) -> None:
    sid = world.ids["schedule"]
    await api.patch(f"/v1/schedules/{sid}", world.root, json={"name": "fixed by ops"})
    latest = (await api.get(f"/v1/schedules/{sid}/history", world.alice)).body["items"][0]
    assert (latest["actor"], latest["owner"], latest["action"]) == ("root", "alice", "update")
    assert (await api.get(f"/v1/schedules/{sid}", world.alice)).body["owner"] == "alice"
