"""CLI: preview (the scheduler's own fire-time code) and dead notifications, as scripts use them."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from tests import factories
from tests.helpers import run_cli


def test_preview_follows_the_dst_rules_in_local_and_utc_time() -> None:
    done = run_cli(
        "preview",
        "30 2 * * *",
        "--tz",
        "America/New_York",
        "--from",
        "2026-03-07T00:00:00Z",
        "--count",
        "3",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    fires = json.loads(done.stdout)["fire_times"]
    # 02:30 does not exist on 2026-03-08 in New York: it fires once, at 03:00 EDT.
    assert [f["local"] for f in fires] == [
        "2026-03-07T02:30:00-05:00",
        "2026-03-08T03:00:00-04:00",
        "2026-03-09T02:30:00-04:00",
    ]
    assert fires[1]["utc"] == "2026-03-08T07:00:00+00:00"


def test_preview_accepts_every_kind_of_expression() -> None:
    for expression in (
        "@hourly",
        "every 15m",
        "at 2030-12-01T09:00",
        "RRULE:FREQ=MONTHLY;BYMONTHDAY=-1",
        "*/10 * * * * *",
    ):
        done = run_cli("preview", expression, "--from", "2026-01-01T00:00:00Z", "--json")
        assert done.returncode == 0, (expression, done.stderr)
        assert json.loads(done.stdout)["fire_times"], expression


def test_preview_rejects_bad_input_naming_the_field() -> None:
    for args, field in (
        (("0 0 30 2 *",), "expression"),
        (("* * * * *", "--tz", "Mars/Olympus"), "timezone"),
        (("* * * * *", "--count", "0"), "--count"),
    ):
        done = run_cli("preview", *args)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"promptsched: error: {field}:"), done.stderr
        assert "Traceback" not in done.stderr


async def test_dead_notifications_are_listed_and_replayed(
    dsn: str, pool: asyncpg.Pool[Any]
) -> None:
    sid = await factories.schedule(pool)
    rid = await factories.pending_run(pool, sid)
    nid = await pool.fetchval(
        "INSERT INTO outbox (run_id, schedule_id, channel, target, event, status, attempts, "
        "max_attempts, last_error, idempotency_key) VALUES ($1, $2, 'email', '[\"a@b.c\"]', "
        "'succeeded', 'dead', 10, 10, 'SMTP 550 refused', 'k-1') RETURNING id",
        rid,
        sid,
    )
    listed = run_cli("notifications", "dead", "--json", dsn=dsn)
    assert listed.returncode == 0, listed.stderr
    assert [(n["id"], n["last_error"]) for n in json.loads(listed.stdout)] == [
        (nid, "SMTP 550 refused")
    ]
    replayed = run_cli("notifications", "replay", str(nid), dsn=dsn)
    assert replayed.returncode == 0, replayed.stderr
    assert await pool.fetchval("SELECT status FROM outbox WHERE id = $1", nid) == "pending"
    again = run_cli("notifications", "replay", str(nid), dsn=dsn)
    assert again.returncode == 1 and "only dead notifications" in again.stderr  # a conflict
    missing = run_cli("notifications", "replay", "999999", dsn=dsn)
    assert missing.returncode == 4, missing.stderr


async def test_every_database_command_takes_database_url(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Any
) -> None:
    """--database-url works before or after the subcommand, on migrate and the read commands,
    and no embedded data directory is touched (PROMPTSCHED_DATA_DIR points at an empty one)."""
    sid = await factories.schedule(pool)
    await factories.pending_run(pool, sid)
    empty = tmp_path / "no-db-here"
    for args in (
        ("migrate", "--database-url", dsn, "--data-dir", str(empty)),
        ("--database-url", dsn, "--data-dir", str(empty), "runs", "list", "--json"),
        ("schedules", "list", "--json", "--database-url", dsn, "--data-dir", str(empty)),
        ("notifications", "dead", "--json", "--database-url", dsn, "--data-dir", str(empty)),
    ):
        done = run_cli(*args)
        assert done.returncode == 0, (args, done.stderr)
    runs = json.loads(run_cli("runs", "list", "--json", "--database-url", dsn).stdout)
    assert [r["schedule_id"] for r in runs] == [sid]
    assert not empty.exists()
