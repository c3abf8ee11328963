"""Budgets from the command line: a schedule's (`schedules add/edit --budget`, `--no-budget`)
and an owner's (`budget show/set/clear`), remote through the API and direct through the
database, shown against the spend; bad limits are refused naming the flag."""

from __future__ import annotations

import json

from tests import factories
from tests.test_cli_remote import Cli, _sql, _token, api_service, run_cli  # noqa: F401

ADD = ("schedules", "add", "--name", "n", "--cron", "0 9 * * 1", "--prompt", "one two three")


def test_schedule_and_owner_budgets_from_the_cli(run_cli: Cli, dsn: str) -> None:  # noqa: F811
    alice = _token(run_cli, "alice")
    created = run_cli.json(*ADD, "--budget", "tokens/day=100", "--budget", "cost/month=2.5",
                           token=alice)  # fmt: skip
    sid = created["id"]
    assert created["budget"] == {"tokens_per_day": 100, "cost_per_month": 2.5}
    # One echo run: 3 prompt words + "echo: one two three" (4) = 7 tokens.
    _sql(dsn, "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts) "
              "VALUES ($1, now(), 'manual', 'echo', 3)", sid)  # fmt: skip
    factories.work_once(dsn)
    for token in (alice, None):  # remote, then direct: the same words
        code, out, err = run_cli("schedules", "show", str(sid), token=token)
        assert code == 0, err
        assert "100 tokens a day, 2.50 a month" in out
        assert "7 tokens of 100 tokens a day (7%)" in out
        assert "0.00 of 2.50 a month (0%)" in out
    # edit replaces the budget; --no-budget removes it.
    edited = run_cli.json("schedules", "edit", str(sid), "--budget", "tokens/month=5",
                          token=alice)  # fmt: skip
    assert edited["budget"] == {"tokens_per_month": 5}
    code, out, _ = run_cli("schedules", "show", str(sid), token=alice)
    assert "7 tokens of 5 tokens a month (reached: runs are skipped)" in out
    for argv, named in (
        (("--budget", "tokens/week=5"), "--budget"),
        (("--budget", "tokens/day=lots"), "--budget.tokens_per_day"),
        (("--budget", "cost/day=0"), "--budget.cost_per_day"),
        (("--budget", "tokens/day=5", "--no-budget"), "--no-budget"),
    ):
        code, out, err = run_cli("schedules", "edit", str(sid), *argv, token=alice)
        assert code == 2 and named in err and "Traceback" not in err, (argv, err)
    stored = _sql(dsn, "SELECT budget FROM schedules WHERE id = $1", sid)
    assert (stored if isinstance(stored, dict) else json.loads(stored)) == {"tokens_per_month": 5}
    assert run_cli.json("schedules", "edit", str(sid), "--no-budget", token=alice)["budget"] is None

    # The owner's budget: set remotely, read directly (the operator names the owner).
    code, out, err = run_cli("budget", "set", "cost/day=1", "tokens/month=1000", token=alice)
    assert code == 0, err
    assert "budget:           1.00 a day, 1,000 tokens a month" in out
    assert "7 tokens of 1,000 tokens a month (1%)" in out
    shown = run_cli.json("budget", "show", "--owner", "alice")
    assert shown["budget"] == {"cost_per_day": 1.0, "tokens_per_month": 1000}
    assert shown["spend"]["month"]["tokens"] == 7
    # Another owner's budget needs an admin token; bad limits name themselves.
    bob = _token(run_cli, "bob")
    code, _, err = run_cli("budget", "show", "--owner", "alice", token=bob)
    assert code != 0 and "own owner" in err
    code, _, err = run_cli("budget", "set", "cost/day=-3", token=alice)
    assert code == 2 and "limits.cost_per_day" in err
    code, _, err = run_cli("budget", "set", token=alice)
    assert code == 2 and "limits" in err
    assert run_cli.json("budget", "show", token=alice)["budget"] == shown["budget"]
