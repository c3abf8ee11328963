"""Follow-ups from the command line, remote through the API and direct through the database:
`followups add` is idempotent by key (the same command again changes nothing, another body
is refused saying what differs), `--var` fills the prompt's tags, `--at` places it at an
instant and `--json` prints it, `show` lists every check and decision and says where it
stands, `runs list --followup KEY` lists its runs, `cancel` is idempotent; bad input is refused
naming the flag or field."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests import factories
from tests.test_cli_remote import Cli, _sql, _token, api_service, run_cli  # noqa: F401

ADD = (
    "followups", "add", "--key", "order-4711", "--in", "24h",
    "--prompt", "Has order {{ order_id }} shipped?", "--var", "order_id=4711", "--max-checks",
    "3", "--escalate-email", "boss@example.com", "--escalate-after", "2",
)  # fmt: skip


def test_add_show_list_and_cancel_by_key(run_cli: Cli, dsn: str) -> None:  # noqa: F811
    alice = _token(run_cli, "alice")
    code, out, err = run_cli(*ADD, token=alice)
    assert code == 0, err
    assert out.startswith("follow-up order-4711 created: first check at ")
    code, out, err = run_cli(*ADD, token=alice)
    assert code == 0 and "exists (same body: nothing changed)" in out, err
    code, out, err = run_cli(*[a if a != "24h" else "1h" for a in ADD], token=alice)
    assert code != 0 and "in differs" in err and "Traceback" not in err
    assert _sql(dsn, "SELECT count(*) FROM followups") == 1
    shown = run_cli.json("followups", "show", "order-4711", token=alice)
    assert shown["vars"] == {"order_id": "4711"} and shown["max_checks"] == 3
    assert shown["escalate"][0]["after_checks"] == 2
    # A check recorded as the worker's finish records it, shown in words.
    sid = shown["schedule_id"]
    _sql(dsn, "INSERT INTO followup_checks (schedule_id, number, status, decision, outcome, "
              "next_at, at) VALUES ($1, 1, 'succeeded', '{\"recheck_in\": 21600}', 'recheck', "
              "now() + interval '6 hours', now())", sid)  # fmt: skip
    code, out, err = run_cli("followups", "show", "order-4711", token=alice)
    assert code == 0, err
    assert "state        active" in out and "check again in 6 h" in out
    # Direct mode acts for --owner; Bob's token does not see Alice's key.
    direct = run_cli.json("followups", "show", "order-4711", "--owner", "alice")
    assert direct["key"] == "order-4711"
    bob = _token(run_cli, "bob")
    assert run_cli("followups", "show", "order-4711", token=bob)[0] == 4
    # Bad input names the flag or field, and stores nothing.
    for argv, named in (
        (("followups", "add", "--key", "k2", "--in", "1h", "--prompt", "{{ x }}"), "vars.x"),
        (("followups", "add", "--key", "k 2", "--in", "1h", "--prompt", "p"), "key"),
        (("followups", "add", "--key", "k2", "--in", "soon", "--prompt", "p"), "in"),
        (("followups", "add", "--key", "k2", "--in", "1h", "--prompt", "p",
          "--escalate-after", "1"), "--escalate-email"),
    ):  # fmt: skip
        code, out, err = run_cli(*argv, token=alice)
        assert code == 2 and named in err and "Traceback" not in err, (argv, err)
    assert _sql(dsn, "SELECT count(*) FROM followups") == 1
    # Cancel, twice: the second changes nothing; the list shows it cancelled.
    code, out, err = run_cli("followups", "cancel", "order-4711", token=alice)
    assert code == 0 and "cancelled: no further check starts" in out, err
    assert run_cli("followups", "cancel", "order-4711", token=alice)[0] == 0
    listed = run_cli.json("followups", "list", "--state", "cancelled", token=alice)
    assert [f["key"] for f in listed] == ["order-4711"]
    assert _sql(dsn, "SELECT enabled FROM schedules WHERE id = $1", sid) is False


def test_add_at_json_runs_and_explanation_by_key(run_cli: Cli, dsn: str) -> None:  # noqa: F811
    alice = _token(run_cli, "alice")
    now = _sql(dsn, "SELECT now()")
    at = (now + timedelta(hours=2)).replace(microsecond=0)
    slot = datetime.fromtimestamp(-(-at.timestamp() // 900) * 900, UTC)  # up to 15 minutes
    add = ("followups", "add", "--key", "order-5", "--at", at.isoformat(),
           "--prompt", "Has order 5 shipped?", "--resolution", "15m")  # fmt: skip
    created = run_cli.json(*add, token=alice)
    assert (created["id"], created["key"]) == (created["schedule_id"], "order-5")
    assert created["due_at"] == slot.isoformat() and created["resolution"] == "15m"
    again = run_cli.json(*add, token=alice)  # the same command: the same follow-up
    assert (again["id"], again["due_at"]) == (created["id"], created["due_at"])
    code, out, err = run_cli("followups", "show", "order-5", token=alice)
    assert code == 0 and "resolution   15m (every check rounded up" in out, err
    # By key, both ways alike: its runs, and where it stands.
    assert run_cli.both("runs", "list", "--followup", "order-5", "--owner", "alice",
                        token=alice) == []  # fmt: skip
    _sql(dsn, "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts, "
              "available_at) SELECT id, $2, 'cadence', provider, max_attempts, now() "
              "FROM schedules WHERE id = $1", created["id"], slot)  # fmt: skip
    factories.work_once(dsn)  # the check runs (echo: no recheck asked, so done)
    run_cli.capsys.readouterr()  # the worker's log lines
    runs = run_cli.both("runs", "list", "--followup", "order-5", "--owner", "alice",
                        token=alice)  # fmt: skip
    assert [(r["schedule_id"], r["slot"], r["status"]) for r in runs] == [
        (created["id"], slot.isoformat(), "succeeded")
    ]
    code, out, err = run_cli("runs", "list", "--followup", "order-5", token=alice)
    assert code == 0 and "succeeded" in out and str(runs[0]["id"]) in out, err
    shown = run_cli.both("followups", "show", "order-5", "--owner", "alice", token=alice)
    assert shown["explanation"] == (
        f"Done: check 1 answered without asking to be checked again (run #{runs[0]['id']})."
    )
    code, out, err = run_cli("followups", "show", "order-5", token=alice)
    assert code == 0 and f"why          {shown['explanation']}" in out, err
    # Another owner's key is not found; a bad key or a stray --owner names the flag.
    bob = _token(run_cli, "bob")
    assert run_cli("runs", "list", "--followup", "order-5", token=bob)[0] == 4
    assert run_cli("runs", "list", "--followup", "order-5", "--owner", "bob")[0] == 4
    for argv, named in ((("--followup", "has space"), "--followup"),
                        (("--owner", "alice"), "--owner")):  # fmt: skip
        code, out, err = run_cli("runs", "list", *argv, token=alice)
        assert code == 2 and named in err and "Traceback" not in err, (argv, err)
