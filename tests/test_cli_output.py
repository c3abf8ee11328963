"""Golden output of the human listings, each from a real ``promptsched`` process with its
"now" pinned (PROMPTSCHED_CLI_NOW): times in the schedule's zone with their distance from now,
schedule names beside ids, words instead of booleans, and an ellipsis on every cut cell.
``--json`` of the same commands stays the API's JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from tests import factories
from tests.helpers import run_cli

NOW = datetime(2026, 11, 23, 7, 57, tzinfo=UTC)  # 08:57 in Paris, 02:57 in New York
PINNED = {"PROMPTSCHED_CLI_NOW": NOW.isoformat()}
LONG_ERROR = "the provider answered 400: " + "the prompt is longer than the model allows " * 4


def _cli(dsn: str, *args: str) -> str:
    done = run_cli(*args, dsn=dsn, env=PINNED)
    assert done.returncode == 0, done.stderr
    # Direct mode with no service running says what it checks input against (ops/fleet.py).
    said = [line for line in done.stderr.splitlines() if "no replica is running" not in line]
    assert args[:2] == ("tokens", "create") or not said, done.stderr
    return done.stdout


async def _schedules(pool: asyncpg.Pool[Any]) -> dict[str, int]:
    """Five schedules in three zones: enabled, paused until tomorrow, a one-shot that fired
    (done), and one whose rule is longer than its column."""
    made = {
        "brief": await factories.schedule(
            pool, name="brief", timezone="Europe/Paris", next_fire_at=NOW + timedelta(minutes=3)
        ),
        "nightly report for the New York office": await factories.schedule(
            pool, name="nightly report for the New York office", expression="30 2 * * *",
            timezone="America/New_York", next_fire_at=datetime(2026, 11, 24, 7, 30, tzinfo=UTC),
        ),
        "every other minute": await factories.schedule(
            pool, name="every other minute", kind="rrule",
            expression="FREQ=MINUTELY;INTERVAL=2", timezone="Europe/Paris",
            next_fire_at=datetime(2026, 11, 23, 7, 58, tzinfo=UTC),
        ),
        "once": await factories.schedule(
            pool, name="once", kind="at", expression="2026-11-23T07:00:00Z", next_fire_at=None
        ),
        "holiday": await factories.schedule(
            pool, name="holiday", expression="15,45 * * * * *", next_fire_at=NOW
        ),
    }  # fmt: skip
    await pool.execute(
        "UPDATE schedules SET created_at = $1, updated_at = $1", datetime(2026, 11, 2, tzinfo=UTC)
    )
    await pool.execute(
        "UPDATE schedules SET enabled = false, paused_until = $2, pause_reason = 'holiday' "
        "WHERE id = $1",
        made["holiday"],
        datetime(2026, 11, 24, 7, 0, 20, tzinfo=UTC),
    )
    return made


async def _runs(pool: asyncpg.Pool[Any], made: dict[str, int]) -> None:
    """A succeeded run of `brief` (Paris), a skipped one standing for two more slots (New
    York), and a dead one whose error is longer than its column."""
    ok = await factories.pending_run(pool, made["brief"], datetime(2026, 11, 22, 8, tzinfo=UTC))
    skipped = await factories.pending_run(
        pool, made["nightly report for the New York office"],
        datetime(2026, 11, 23, 7, 30, tzinfo=UTC),
    )  # fmt: skip
    dead = await factories.pending_run(pool, made["brief"], datetime(2026, 11, 23, 7, 56, 30,
                                                                      tzinfo=UTC))  # fmt: skip
    await pool.execute("UPDATE runs SET created_at = slot")
    await pool.execute(
        "UPDATE runs SET status = 'succeeded', attempts = 1, output = 'fine', "
        "started_at = slot, finished_at = slot + interval '2 seconds' WHERE id = $1",
        ok,
    )
    await pool.execute(
        "UPDATE runs SET status = 'skipped', skip_reason = 'overlap', missed_slots = 2, "
        "finished_at = slot WHERE id = $1",
        skipped,
    )
    await pool.execute(
        "UPDATE runs SET status = 'dead', attempts = 3, error = $2, started_at = slot, "
        "finished_at = slot + interval '20 seconds', deadline_at = slot + interval '5 minutes' "
        "WHERE id = $1",
        dead,
        LONG_ERROR,
    )


RUNS_LIST = """\
ID  SCHEDULE              SLOT                                       ORIGIN   STATUS     ATT  DETAIL
3   #1 brief              2026-11-23 08:56:30 CET (30 s ago)         cadence  dead       3    the provider answered 400: the prompt is longer than the model allows the promp…
2   #2 nightly report f…  2026-11-23 02:30:00 EST (27 min ago)       cadence  skipped    0    skipped: an earlier run was still unfinished (overlap policy); it stands for 2…
1   #1 brief              2026-11-22 09:00:00 CET (23 h 57 min ago)  cadence  succeeded  1    -
"""


async def test_runs_list_shows_zones_names_and_cut_text(pool: asyncpg.Pool[Any], dsn: str) -> None:
    await _runs(pool, await _schedules(pool))
    assert _cli(dsn, "runs", "list") == RUNS_LIST
    data = json.loads(_cli(dsn, "runs", "list", "--json"))
    assert data[0]["error"] == LONG_ERROR and data[0]["slot"] == "2026-11-23T07:56:30+00:00"


async def _followups(pool: asyncpg.Pool[Any], dsn: str) -> None:
    """Placed from the CLI at the pinned now: one still active after an unresolved check,
    one resolved by its second check."""
    _cli(dsn, "followups", "add", "--key", "order-4711-unshipped", "--in", "24h",
         "--prompt", "Has order {{ order_id }} shipped?", "--var", "order_id=4711",
         "--max-checks", "5", "--email", "ops@example.com",
         "--escalate-email", "boss@example.com", "--escalate-after", "3")  # fmt: skip
    _cli(dsn, "followups", "add", "--key", "order-4712-unshipped", "--in", "1h",
         "--prompt", "Has order 4712 shipped?", "--max-checks", "5")  # fmt: skip
    ids = {r["key"]: r["schedule_id"] for r in await pool.fetch("SELECT * FROM followups")}
    first = ids["order-4711-unshipped"]
    await pool.execute(
        "INSERT INTO followup_checks (schedule_id, number, status, decision, outcome, next_at, "
        "at) VALUES ($1, 1, 'succeeded', '{\"recheck_in\": 21600}', 'recheck', $2, $3)",
        first, datetime(2026, 11, 24, 13, 57, 2, tzinfo=UTC),
        datetime(2026, 11, 24, 7, 57, 2, tzinfo=UTC),
    )  # fmt: skip
    await pool.execute("UPDATE followups SET checks = 1 WHERE schedule_id = $1", first)
    await factories.pending_run(pool, first, datetime(2026, 11, 24, 13, 57, 2, tzinfo=UTC), "check")
    done = ids["order-4712-unshipped"]
    for number, decision, outcome in ((1, {"recheck_in": 900}, "recheck"), (2, None, "done")):
        await pool.execute(
            "INSERT INTO followup_checks (schedule_id, number, status, decision, outcome, at) "
            "VALUES ($1, $2, 'succeeded', $3::jsonb, $4, $5)",
            done, number, decision, outcome, NOW,
        )  # fmt: skip
    await pool.execute(
        "UPDATE followups SET checks = 2, state = 'done' WHERE schedule_id = $1", done
    )


FOLLOWUPS_LIST = """\
KEY                   STATE            CHECKS  FIRST CHECK
order-4712-unshipped  done (resolved)  2 of 5  2026-11-23 08:57 UTC (in 1 h)
order-4711-unshipped  active           1 of 5  2026-11-24 07:57 UTC (in 1 d)
"""

FOLLOWUP_SHOW = """\
key          order-4711-unshipped
state        active
first check  2026-11-24 07:57 UTC (in 1 d)
checks       1 of at most 5, none after 2026-12-24 07:57 UTC (in 31 d)
vars         order_id=4711
notify       email ops@example.com on success and failure
escalation   after 3 unresolved checks: email boss@example.com
why          Active: check 2 of at most 5 is due at 2026-11-24 13:57:02 UTC (run #1).

#  RUN  STATUS     OUTCOME                      DECISION
1  -    succeeded  not resolved: checked again  check again in 6 h
"""


async def test_followups_list_and_show_in_words(pool: asyncpg.Pool[Any], dsn: str) -> None:
    await _followups(pool, dsn)
    assert _cli(dsn, "followups", "list") == FOLLOWUPS_LIST
    assert _cli(dsn, "followups", "show", "order-4711-unshipped") == FOLLOWUP_SHOW


TOKENS_LIST = """\
ID  OWNER    ADMIN  NAME                  CREATED                               LAST USED                         REVOKED
1   default  no     laptop                2026-11-02 09:00 UTC (20 d 22 h ago)  never                             -
2   ops      yes    the deploy pipeline…  2026-11-02 09:00 UTC (20 d 22 h ago)  2026-11-23 07:53 UTC (4 min ago)  -
"""


async def test_tokens_list_in_words(pool: asyncpg.Pool[Any], dsn: str) -> None:
    _cli(dsn, "tokens", "create", "--owner", "default", "--name", "laptop")
    _cli(dsn, "tokens", "create", "--owner", "ops", "--admin", "--name",
         "the deploy pipeline of the shop's backend")  # fmt: skip
    await pool.execute(
        "UPDATE api_tokens SET created_at = $1, last_used_at = CASE WHEN admin THEN $2::timestamptz END",
        datetime(2026, 11, 2, 9, tzinfo=UTC), NOW - timedelta(minutes=4),
    )  # fmt: skip
    assert _cli(dsn, "tokens", "list") == TOKENS_LIST
    assert json.loads(_cli(dsn, "tokens", "list", "--json"))[1]["admin"] is True


SCHEDULES_LIST = """\
ID  OWNER    NAME                      KIND   EXPRESSION              TZ                STATE    NEXT FIRE
1   default  brief                     cron   0 9 * * *               Europe/Paris      enabled  2026-11-23 09:00 CET (in 3 min)
2   default  nightly report for the…   cron   30 2 * * *              America/New_York  enabled  2026-11-24 02:30 EST (in 23 h 33 min)
3   default  every other minute        rrule  FREQ=MINUTELY;INTERVA…  Europe/Paris      enabled  2026-11-23 08:58 CET (in 1 min)
4   default  once                      at     2026-11-23T07:00:00Z    UTC               done     - (done)
5   default  holiday                   cron   15,45 * * * * *         UTC               paused   2026-11-24 07:00:45 UTC (in 23 h 3 min), after the pause
"""

SCHEDULE_SHOW = """\
id                    5
owner                 default
name                  holiday
kind                  cron
expression            15,45 * * * * *
in words              at seconds 15 and 45 past each minute
timezone              UTC
prompt                hello
provider              echo
model                 -
params                -
misfire               run_once
misfire cap           100
misfire grace         1m
catch-up window       -
overlap               skip
max attempts          3
timeout               5m
jitter                -
give up after         1h
fallback              -
dst gap               shift
dst fold              first
pause after failures  -
version               1
notify                none
notify when           always
output schema         none (free text)
state                 paused until 2026-11-24 07:00:20 UTC (in 23 h 3 min) (holiday)
next fire times       2026-11-24 07:00:45 UTC (in 23 h 3 min), the first slot after the pause
spend today           0 tokens, cost 0.00 (UTC)
spend this month      0 tokens, cost 0.00 (UTC)
budget                no budget
created               2026-11-02 00:00 UTC (21 d 7 h ago)
updated               2026-11-02 00:00 UTC (21 d 7 h ago)
"""


async def test_schedules_list_and_show_in_words(pool: asyncpg.Pool[Any], dsn: str) -> None:
    await _schedules(pool)
    assert _cli(dsn, "schedules", "list") == SCHEDULES_LIST
    assert _cli(dsn, "schedules", "show", "5") == SCHEDULE_SHOW
    shown = json.loads(_cli(dsn, "schedules", "show", "5", "--json"))
    assert shown["enabled"] is False and shown["paused_until"] == "2026-11-24T07:00:20+00:00"


PREVIEW = """\
cron 30 2 * * * (every day at 02:30), in America/New_York:
  2026-03-07 02:30 EST   2026-03-07 07:30 UTC   in 7 h 30 min
  2026-03-08 03:00 EDT   2026-03-08 07:00 UTC   in 1 d 7 h
  2026-03-09 02:30 EDT   2026-03-09 06:30 UTC   in 2 d 6 h
"""


def test_preview_in_words_zone_and_utc() -> None:
    done = run_cli("preview", "30 2 * * *", "--tz", "America/New_York", "--count", "3",
                   "--from", "2026-03-07T00:00:00Z",
                   env={"PROMPTSCHED_CLI_NOW": "2026-03-07T00:00:00Z"})  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr) == (0, PREVIEW, "")
