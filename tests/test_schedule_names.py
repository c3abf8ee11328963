"""Names wherever an id is taken: a schedule's name is unique per owner (migration 0032, a
registry beside the schedules), schedules that shared one before are renamed with a history
row, and the CLI resolves a name to its schedule or refuses an ambiguous one naming the
candidates (real processes)."""

from __future__ import annotations

from typing import Any

import asyncpg

from promptsched.store import sqlfiles
from tests import factories
from tests.api_support import Api
from tests.helpers import run_cli

BODY = {"cron": "0 9 * * 1", "prompt": "p", "timezone": "Europe/Paris"}


async def test_the_migration_renames_later_duplicates_and_says_so(pool: asyncpg.Pool[Any]) -> None:
    # The state before 0032: no registry (nor 0036's guard over it), and names shared
    # within an owner.
    await pool.execute("DROP TRIGGER schedules_name_unique ON schedules")
    await pool.execute("DROP TABLE schedule_names")
    first = await factories.schedule(pool, name="weekly")
    second = await factories.schedule(pool, name="weekly")
    third = await factories.schedule(pool, name="weekly")
    other = await factories.schedule(pool, name="daily")
    await pool.execute("UPDATE schedules SET owner = 'bob' WHERE id = $1", other)
    bobs = await factories.schedule(pool, name="weekly")
    await pool.execute("UPDATE schedules SET owner = 'bob' WHERE id = $1", bobs)
    sql = next(text for _, name, text in sqlfiles.migrations() if name == "schedule_names")
    await pool.execute(sql)
    names = {r["id"]: r["name"] for r in await pool.fetch("SELECT id, name FROM schedules")}
    assert names == {first: "weekly", second: f"weekly #{second}", third: f"weekly #{third}",
                     other: "daily", bobs: "weekly"}  # fmt: skip
    logged = await pool.fetch(
        "SELECT schedule_id, actor, action, changes FROM schedule_changes ORDER BY schedule_id"
    )
    assert [(r["schedule_id"], r["actor"], r["action"], r["changes"]) for r in logged] == [
        (second, "promptsched", "update", {"name": ["weekly", f"weekly #{second}"]}),
        (third, "promptsched", "update", {"name": ["weekly", f"weekly #{third}"]}),
    ]
    registered = await pool.fetch("SELECT owner, name, schedule_id FROM schedule_names")
    assert len(registered) == 5


async def test_a_name_is_unique_per_owner_and_freed_by_rename_and_delete(api: Api) -> None:
    alice, bob = await api.token("alice"), await api.token("bob")
    made = await api.post("/v1/schedules", alice, json={**BODY, "name": "weekly"})
    assert made.status == 201
    taken = await api.post("/v1/schedules", alice, json={**BODY, "name": "weekly"})
    assert taken.status == 422 and taken.body["error"]["field"] == "name"
    assert f"schedule {made.body['id']} is already named 'weekly'" in taken.body["error"]["message"]
    assert (await api.post("/v1/schedules", bob, json={**BODY, "name": "weekly"})).status == 201
    other = await api.post("/v1/schedules", alice, json={**BODY, "name": "monthly"})
    sid, oid = made.body["id"], other.body["id"]
    clash = await api.patch(f"/v1/schedules/{oid}", alice, json={"name": "weekly"})
    assert clash.status == 422 and clash.body["error"]["field"] == "name"
    shown = await api.get(f"/v1/schedules/{oid}", alice)
    assert shown.body["name"] == "monthly"  # nothing changed
    assert (await api.patch(f"/v1/schedules/{sid}", alice, json={"name": "weekly 2"})).status == 200
    renamed = await api.patch(f"/v1/schedules/{oid}", alice, json={"name": "weekly"})
    assert renamed.status == 200  # the rename freed it
    assert (await api.delete(f"/v1/schedules/{oid}", alice)).status == 204
    again = await api.post("/v1/schedules", alice, json={**BODY, "name": "weekly"})
    assert again.status == 201  # the delete freed it


async def test_follow_ups_may_share_a_display_name(api: Api) -> None:
    alice = await api.token("alice")
    for key in ("order-1", "order-2"):
        body = {"key": key, "in": "1h", "prompt": "shipped?", "name": "order check"}
        assert (await api.post("/v1/followups", alice, json=body)).status == 201
    made = await api.post("/v1/schedules", alice, json={**BODY, "name": "order check"})
    assert made.status == 201


async def test_the_cli_takes_a_name_wherever_it_takes_an_id(
    pool: asyncpg.Pool[Any], dsn: str
) -> None:
    weekly = await factories.schedule(pool, name="weekly", expression="0 9 * * 1")
    bobs = await factories.schedule(pool, name="daily", owner="bob")
    alices = await factories.schedule(pool, name="daily", owner="alice")
    done = run_cli("schedules", "trigger", "weekly", dsn=dsn)
    assert done.returncode == 0 and "triggered run" in done.stdout, done.stderr
    assert await pool.fetchval("SELECT schedule_id FROM runs WHERE origin = 'manual'") == weekly
    shown = run_cli("schedules", "show", "weekly", "--json", dsn=dsn)
    assert shown.returncode == 0 and f'"id": {weekly}' in shown.stdout
    listed = run_cli("runs", "list", "--schedule", "weekly", "--json", dsn=dsn)
    assert listed.returncode == 0 and f'"schedule_id": {weekly}' in listed.stdout
    # The operator sees every owner's: a name two owners use is refused with the candidates.
    ambiguous = run_cli("schedules", "pause", "daily", dsn=dsn)
    assert ambiguous.returncode == 2 and not ambiguous.stdout
    assert ambiguous.stderr == (
        f"promptsched: error: 2 schedules are named 'daily': #{bobs} (owner bob), "
        f"#{alices} (owner alice); give the id\n"
    )
    missing = run_cli("schedules", "show", "weakly", dsn=dsn)
    assert missing.returncode == 4 and missing.stderr == (
        "promptsched: error: no schedule is named 'weakly': promptsched schedules list shows "
        "the names\n"
    )
    assert await pool.fetchval("SELECT count(*) FROM schedules WHERE NOT enabled") == 0
