"""The schedules API against real Postgres: create, list, get, patch, delete, controls,
history, and input that is refused without changing anything."""

from __future__ import annotations

import io
import json
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest

from promptsched.clock import FrozenClock
from tests import api_support
from tests.api_support import SCHEDULE, Api

T0 = datetime.fromisoformat("2026-03-02T09:00:00+00:00")


async def _create(api: Api, who: dict[str, str], **fields: Any) -> dict[str, Any]:
    reply = await api.post("/v1/schedules", who, json={**SCHEDULE, **fields})
    assert reply.status == 201, reply.body
    body: dict[str, Any] = reply.body
    return body


async def test_create_returns_the_schedule_and_its_next_five_fire_times(
    pool: asyncpg.Pool[Any],
) -> None:
    clock = FrozenClock(T0 - timedelta(minutes=1))
    async with api_support.client(pool, clock=clock) as api:
        who = await api.token("alice")
        reply = await api.post(
            "/v1/schedules",
            who,
            json={**SCHEDULE, "cron": "30 9 * * 1-5", "timezone": "Europe/Paris"},
        )
    assert reply.status == 201
    assert reply.headers["ETag"] == '"1"'
    body = reply.body
    assert (body["owner"], body["version"], body["enabled"]) == ("alice", 1, True)
    # Monday 2 March 2026, 09:30 in Paris is 08:30 UTC: already past at 08:59 UTC.
    assert body["next_fire_times"] == [
        "2026-03-03T08:30:00+00:00", "2026-03-04T08:30:00+00:00", "2026-03-05T08:30:00+00:00",
        "2026-03-06T08:30:00+00:00", "2026-03-09T08:30:00+00:00",
    ]  # fmt: skip
    assert body["next_fire_at"] == body["next_fire_times"][0]
    change = await pool.fetchrow(
        "SELECT * FROM schedule_changes WHERE schedule_id = $1", body["id"]
    )
    assert (change["action"], change["actor"], change["owner"]) == ("create", "alice", "alice")


async def test_get_list_filter_and_paginate(api: Api, alice: dict[str, str]) -> None:
    ids = [(await _create(api, alice, name=f"report {i}"))["id"] for i in range(5)]
    other = await _create(api, alice, name="Weekly DIGEST")
    await api.post(f"/v1/schedules/{ids[0]}/pause", alice, json={"reason": "holiday"})

    got = await api.get(f"/v1/schedules/{ids[1]}", alice)
    assert got.status == 200 and got.body["name"] == "report 1"
    assert got.headers["ETag"] == '"1"'

    first = await api.get("/v1/schedules?limit=2", alice)
    assert [s["id"] for s in first.body["items"]] == ids[:2]
    cursor = first.body["next_cursor"]
    second = await api.get(f"/v1/schedules?limit=2&cursor={cursor}", alice)
    assert [s["id"] for s in second.body["items"]] == ids[2:4]
    last = await api.get(f"/v1/schedules?limit=2&cursor={second.body['next_cursor']}", alice)
    assert [s["id"] for s in last.body["items"]] == [ids[4], other["id"]]
    assert last.body["next_cursor"] is None

    paused = await api.get("/v1/schedules?enabled=false", alice)
    assert [s["id"] for s in paused.body["items"]] == [ids[0]]
    assert paused.body["items"][0]["pause_reason"] == "holiday"
    enabled = await api.get("/v1/schedules?enabled=true&name=REPORT", alice)
    assert [s["id"] for s in enabled.body["items"]] == ids[1:5]
    named = await api.get("/v1/schedules?name=digest", alice)
    assert [s["id"] for s in named.body["items"]] == [other["id"]]
    percent = await api.get("/v1/schedules?name=%25", alice)  # not a LIKE pattern
    assert percent.body["items"] == []


async def test_patch_honours_if_match_and_version(api: Api, alice: dict[str, str]) -> None:
    sid = (await _create(api, alice))["id"]
    path = f"/v1/schedules/{sid}"
    ok = await api.patch(path, alice, json={"name": "renamed"}, headers={"If-Match": '"1"'})
    assert ok.status == 200 and ok.body["name"] == "renamed"
    assert ok.headers["ETag"] == '"2"'

    stale = await api.patch(path, alice, json={"name": "lost"}, headers={"If-Match": '"1"'})
    assert stale.status == 412
    conflict = await api.patch(path, alice, json={"name": "lost", "version": 1})
    assert conflict.status == 409
    assert conflict.body["error"]["field"] == "version"
    assert "version 2" in conflict.body["error"]["message"]
    garbage = await api.patch(path, alice, json={"name": "lost"}, headers={"If-Match": "nope"})
    assert garbage.status == 412
    disagree = await api.patch(path, alice, json={"version": 1}, headers={"If-Match": '"2"'})
    assert disagree.status == 422 and disagree.body["error"]["field"] == "version"

    edited = await api.patch(
        path, alice, json={"cron": "*/5 * * * *", "version": 2}, headers={"If-Match": 'W/"2"'}
    )
    assert edited.status == 200
    assert (edited.body["kind"], edited.body["expression"]) == ("cron", "*/5 * * * *")
    anything = await api.patch(path, alice, json={"prompt": "new"}, headers={"If-Match": "*"})
    assert anything.status == 200 and anything.body["version"] == 4
    fresh = await api.get(path, alice)
    assert (fresh.body["name"], fresh.body["prompt"]) == ("renamed", "new")


async def test_controls_and_history(
    api: Api, alice: dict[str, str], pool: asyncpg.Pool[Any]
) -> None:
    sid = (await _create(api, alice, cron="0 * * * *"))["id"]
    base = f"/v1/schedules/{sid}"
    until = "2100-01-01T00:00:00+00:00"
    paused = await api.post(f"{base}/pause", alice, json={"until": until, "reason": "migration"})
    assert paused.status == 200
    assert (paused.body["enabled"], paused.body["pause_reason"]) == (False, "migration")
    assert paused.body["paused_until"] == until
    bare = await api.post(f"{base}/pause", alice)  # no body at all
    assert bare.status == 200 and bare.body["paused_until"] is None
    resumed = await api.post(f"{base}/resume", alice)
    assert resumed.status == 200 and resumed.body["enabled"] is True

    run = await api.post(f"{base}/trigger", alice)
    assert run.status == 201
    assert (run.body["origin"], run.body["status"], run.body["attempt_history"]) == (
        "manual", "pending", [])  # fmt: skip

    now = await pool.fetchval("SELECT date_trunc('hour', now())")
    start = (now - timedelta(hours=3)).isoformat()
    filled = await api.post(
        f"{base}/backfill", alice, json={"start": start, "end": now.isoformat()}
    )
    assert filled.status == 201 and filled.body["created"] == 4
    again = await api.post(f"{base}/backfill", alice, json={"start": start, "end": now.isoformat()})
    assert again.body == {"created": 0, "runs": []}
    future = await api.post(
        f"{base}/backfill", alice, json={"start": start, "end": "2100-01-01T00:00:00Z"}
    )
    assert future.status == 422 and future.body["error"]["field"] == "end"

    await api.patch(base, alice, json={"name": "hourly"})
    history = await api.get(f"{base}/history?limit=3", alice)
    actions = [c["action"] for c in history.body["items"]]
    assert actions == ["update", "backfill", "backfill"]
    assert history.body["items"][0]["changes"]["name"] == ["daily digest", "hourly"]
    assert all(c["actor"] == "alice" for c in history.body["items"])
    rest = await api.get(f"{base}/history?cursor={history.body['next_cursor']}", alice)
    assert [c["action"] for c in rest.body["items"]] == [
        "trigger", "resume", "pause", "pause", "create"]  # fmt: skip
    assert rest.body["items"][3]["changes"] == {"until": until, "reason": "migration"}

    deleted = await api.delete(base, alice)
    assert deleted.status == 204
    assert (await api.get(base, alice)).status == 404
    assert (await api.delete(base, alice)).status == 404
    # The history outlives the schedule: "who deleted it?" still has an answer.
    after = await api.get(f"{base}/history", alice)
    assert after.body["items"][0]["action"] == "delete"


async def test_a_webhook_secret_is_shown_once(api: Api, alice: dict[str, str]) -> None:
    hook = {"webhook": {"url": "https://hooks.example.com/p"}, "email": ["ops@example.com"]}
    created = await _create(api, alice, notify=hook)
    secret = created["notify"]["webhook"]["secret"]
    assert secret.startswith("whsec_")
    path = f"/v1/schedules/{created['id']}"
    shown = (await api.get(path, alice)).body["notify"]
    assert shown["webhook"] == {"url": "https://hooks.example.com/p", "secret_set": True}
    assert shown["email"] == ["ops@example.com"]
    kept = await api.patch(path, alice, json={"notify": hook})
    assert "secret" not in kept.body["notify"]["webhook"]
    rotated = await api.patch(
        path, alice, json={"notify": {"webhook": {"url": "https://hooks.example.com/p",
                                                  "secret": "s" * 32}}}
    )  # fmt: skip
    assert rotated.body["notify"]["webhook"]["secret"] == "s" * 32
    history = (await api.get(f"{path}/history", alice)).body["items"]
    assert secret not in str(history) and "s" * 32 not in str(history)
    bad = await api.patch(path, alice, json={"notify": {"webhook": {"url": "http://127.0.0.1/"}}})
    assert bad.status == 422 and bad.body["error"]["field"] == "notify.webhook.url"


async def test_pause_until_must_be_in_the_future(api: Api, alice: dict[str, str]) -> None:
    sid = (await _create(api, alice))["id"]
    reply = await api.post(
        f"/v1/schedules/{sid}/pause", alice, json={"until": "2020-01-01T00:00:00Z"}
    )
    assert reply.status == 422 and reply.body["error"]["field"] == "until"


BAD_CREATES = [
    pytest.param({"prompt": "p", "cron": "* * * * *"}, "name", id="missing-name"),
    pytest.param({**SCHEDULE, "name": ""}, "name", id="empty-name"),
    pytest.param({**SCHEDULE, "name": "x" * 201}, "name", id="long-name"),
    pytest.param({**SCHEDULE, "prompt": "p" * 100_001}, "prompt", id="long-prompt"),
    pytest.param({**SCHEDULE, "prompt": "{{ nope"}, "prompt", id="bad-template"),
    pytest.param({**SCHEDULE, "cron": "61 * * * *"}, "expression", id="bad-cron"),
    pytest.param({**SCHEDULE, "every": "15m"}, "schedule", id="two-kinds"),
    pytest.param({**SCHEDULE, "kind": "every", "expression": "5m"}, "cron",
                 id="kind-and-cron"),
    pytest.param({**SCHEDULE, "timezone": "Europe/Pariss"}, "timezone", id="bad-zone"),
    pytest.param({**SCHEDULE, "provider": "gpt"}, "provider", id="unknown-provider"),
    pytest.param({**SCHEDULE, "misfire": "sometimes"}, "misfire", id="bad-misfire"),
    pytest.param({**SCHEDULE, "max_attempts": 0}, "max_attempts", id="zero-attempts"),
    pytest.param({**SCHEDULE, "max_attempts": "3"}, "max_attempts", id="string-attempts"),
    pytest.param({**SCHEDULE, "timeout": "soon"}, "timeout", id="bad-duration"),
    pytest.param({**SCHEDULE, "enabled": "yes"}, "enabled", id="string-bool"),
    pytest.param({**SCHEDULE, "params": []}, "params", id="params-list"),
    pytest.param({**SCHEDULE, "params": {"k": "a\x00b"}}, "params.k", id="nul-in-params"),
    pytest.param({**SCHEDULE, "name": "a\x00b"}, "name", id="nul-in-name"),
    pytest.param({**SCHEDULE, "params": {"k": "\ud800"}}, "params.k", id="lone-surrogate"),
    pytest.param({**SCHEDULE, "params": {"latency": "fast"}}, "params.latency", id="latency"),
    pytest.param({**SCHEDULE, "promt": "typo"}, "promt", id="unknown-field"),
    pytest.param({**SCHEDULE, "cron": None, "at": "2020-01-01T00:00:00Z"}, "at",
                 id="at-in-the-past"),
    pytest.param({**SCHEDULE, "cron": None, "at": "9999-12-31T23:59:59",
                  "timezone": "America/Los_Angeles"}, "expression", id="at-past-year-9999"),
    pytest.param({**SCHEDULE, "version": 1}, "version", id="version-on-create"),
    pytest.param([SCHEDULE], "body", id="not-an-object"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "field"), BAD_CREATES)
async def test_bad_input_names_the_field_and_changes_nothing(
    api: Api, alice: dict[str, str], pool: asyncpg.Pool[Any], body: Any, field: str
) -> None:
    await _create(api, alice)
    before = await api_support.snapshot(pool)
    reply = await api.post("/v1/schedules", alice, data=json.dumps(body))
    assert reply.status == 422, reply.body
    assert reply.body["error"]["field"] == field
    assert reply.body["error"]["message"]
    assert await api_support.snapshot(pool) == before


MALFORMED = [
    pytest.param(b"{bad", 400, id="not-json"),
    pytest.param(b"", 400, id="empty"),
    pytest.param(b'{"name": NaN}', 400, id="nan"),
    pytest.param(b"[" * 100_000, 400, id="deep-nesting"),
    pytest.param(b'{"params": {"n": 1e400}, "name": "x", "prompt": "p", "cron": "* * * * *"}',
                 422, id="infinite-number"),
    pytest.param(b'{"x": "' + b"a" * (1024 * 1024) + b'"}', 413, id="oversize"),
    pytest.param(b"\xff\xfe", 400, id="not-utf8"),
]  # fmt: skip


@pytest.mark.parametrize(("data", "status"), MALFORMED)
async def test_malformed_bodies(
    api: Api, alice: dict[str, str], pool: asyncpg.Pool[Any], data: bytes, status: int
) -> None:
    before = await api_support.snapshot(pool)
    reply = await api.post("/v1/schedules", alice, data=io.BytesIO(data))
    assert reply.status == status, reply.body
    assert await api_support.snapshot(pool) == before


BAD_PATCHES = [
    pytest.param({"enabled": False}, "enabled", id="enabled-is-not-editable"),
    pytest.param({"name": " "}, "name", id="blank-name"),
    pytest.param({"cron": "nope"}, "expression", id="bad-cron"),
    pytest.param({"max_attempts": 1000}, "max_attempts", id="too-many-attempts"),
    pytest.param({"version": "1"}, "version", id="string-version"),
    pytest.param({"owner": "bob"}, "owner", id="owner-is-not-editable"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "field"), BAD_PATCHES)
async def test_bad_patches_change_nothing(
    api: Api, alice: dict[str, str], pool: asyncpg.Pool[Any], body: Any, field: str
) -> None:
    sid = (await _create(api, alice))["id"]
    before = await api_support.snapshot(pool)
    reply = await api.patch(f"/v1/schedules/{sid}", alice, json=body)
    assert reply.status == 422, reply.body
    assert reply.body["error"]["field"] == field
    assert await api_support.snapshot(pool) == before


BAD_QUERIES = [
    pytest.param("/v1/schedules?limit=0", "limit", id="limit-zero"),
    pytest.param("/v1/schedules?limit=201", "limit", id="limit-over-200"),
    pytest.param("/v1/schedules?limit=ten", "limit", id="limit-text"),
    pytest.param("/v1/schedules?enabled=maybe", "enabled", id="enabled-text"),
    pytest.param("/v1/schedules?cursor=abc", "cursor", id="cursor-text"),
    pytest.param("/v1/schedules?name=%00", "name", id="nul-in-name"),
    pytest.param("/v1/schedules/abc", "id", id="id-text"),
    pytest.param("/v1/schedules/0", "id", id="id-zero"),
    pytest.param("/v1/schedules/99999999999999999999", "id", id="id-over-bigint"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "field"), BAD_QUERIES)
async def test_bad_parameters(api: Api, alice: dict[str, str], path: str, field: str) -> None:
    reply = await api.get(path, alice)
    assert reply.status == 422, reply.body
    assert reply.body["error"]["field"] == field


async def test_a_schedule_at_the_end_of_time_shows_the_slots_it_has(
    api: Api, alice: dict[str, str]
) -> None:
    # the supported range of fire times ends at 2200-01-01T00:00Z (docs/scheduling.md)
    body = await _create(api, alice, cron=None, every="1s from 2199-12-31T23:59:58Z")
    assert body["next_fire_times"] == ["2199-12-31T23:59:58+00:00", "2199-12-31T23:59:59+00:00"]
    beyond = await api.post(
        "/v1/schedules",
        alice,
        json={**SCHEDULE, "cron": None, "every": "1s from 2200-01-01T00:00:00Z"},
    )
    assert beyond.status == 422
    assert beyond.body["error"]["field"] == "expression"
    assert "2200-01-01" in beyond.body["error"]["message"]


async def test_unknown_routes_and_methods_answer_json(api: Api, alice: dict[str, str]) -> None:
    missing = await api.client.get("/v1/nothing", headers=alice)
    assert missing.status == 404
    assert (await missing.json())["error"]["code"] == "not_found"
    wrong = await api.client.put("/v1/schedules", headers=alice)
    assert wrong.status == 405
    assert "POST" in wrong.headers["Allow"]
    assert (await wrong.json())["error"]["code"] == "method_not_allowed"
    assert wrong.headers["X-Request-Id"]
