"""Remote mode: every schedule, run, notification and preview command against a real
``promptsched run`` over HTTP with two owners' tokens. Isolation holds, and the output (JSON
and human, under one pinned clock) is the direct mode's for the same data."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

from promptsched import cli
from promptsched.cli import completion
from promptsched.clock import Clock, FrozenClock
from promptsched.store import pool as pools
from tests import factories
from tests import test_agent_processes as agents
from tests.fakes import openai_server as fake_server
from tests.fakes import pages as site
from tests.helpers import Service

# Commands that never go through the API: the service itself, its schema, token management
# (the API has no token endpoints) and the completion script; `mcp`, a server of its own
# whose remote mode tests/test_mcp_server.py drives with the MCP client; and `healthcheck`,
# which asks this machine's service itself (tests/test_healthcheck.py).
LOCAL_ONLY = {"run", "migrate", "tokens create", "tokens list", "tokens revoke", "completion",
              "mcp", "healthcheck"}  # fmt: skip


@dataclass
class Cli:
    """Runs ``promptsched`` in this process, in direct or remote mode; records the commands."""

    dsn: str
    url: str
    data_dir: Path
    monkeypatch: pytest.MonkeyPatch
    capsys: pytest.CaptureFixture[str]
    used: set[str]

    def __call__(
        self, *argv: str, token: str | None = None, clock: Clock | None = None
    ) -> tuple[int, str, str]:
        """Remote mode with ``token``, else direct mode on the test database."""
        env = {"PROMPTSCHED_DATA_DIR": str(self.data_dir)}  # never used: nothing is created
        if token is None:
            env["PROMPTSCHED_DATABASE_URL"] = self.dsn
        else:
            env.update({"PROMPTSCHED_URL": self.url, "PROMPTSCHED_TOKEN": token})
        env["XDG_CONFIG_HOME"] = str(self.data_dir.parent / "config")
        with self.monkeypatch.context() as m:
            for key in os.environ:
                if key.startswith("PROMPTSCHED_"):
                    m.delenv(key)
            for key, value in env.items():
                m.setenv(key, value)
            code = cli.main(list(argv), clock=clock)
        out, err = self.capsys.readouterr()
        words = [a for a in argv[:2] if not a.startswith("-")]
        self.used.add(" ".join(words[:2] if words[0] in _GROUPS else words[:1]))
        return code, out, err

    def json(self, *argv: str, token: str | None = None) -> Any:
        code, out, err = self(*argv, "--json", token=token)
        assert code == 0, (argv, err)
        return json.loads(out)

    def both(self, *argv: str, token: str) -> Any:
        """The same command's JSON in remote and in direct mode, which must agree."""
        remote = self.json(*argv, token=token)
        direct = self.json(*argv)
        assert remote == direct, argv
        return remote


_GROUPS = {"schedules", "runs", "notifications", "tokens", "budget", "followups"}


def _all_commands() -> set[str]:
    return {path.removeprefix("promptsched ") for path, children, _ in
            completion.walk(cli.build_parser()) if not children}  # fmt: skip


def _sql(dsn: str, query: str, *args: Any) -> Any:
    async def go() -> Any:
        conn = await pools.connect(dsn)
        try:
            return await conn.fetchval(query, *args)
        finally:
            await conn.close()

    return asyncio.run(go())


@pytest.fixture
def api_service(dsn: str, tmp_path: Path) -> Iterator[str]:
    """A real ``promptsched run`` with only the API role; yields its base URL."""
    service = Service(dsn, tmp_path / "api.log", env={"PROMPTSCHED_ROLES": "api"})
    try:
        port = asyncio.run(service.wait_event("api.listening", timeout=60))["port"]
        yield f"http://127.0.0.1:{port}"
    finally:
        service.stop()


@pytest.fixture
def run_cli(
    dsn: str,
    api_service: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> Cli:
    return Cli(dsn, api_service, tmp_path / "data", monkeypatch, capsys, set())


def _token(run_cli: Cli, owner: str, *extra: str) -> str:
    code, out, err = run_cli("tokens", "create", "--owner", owner, *extra)
    assert code == 0, err
    return out.strip()


def test_every_command_goes_through_the_api_isolated_and_as_direct_mode_prints(
    run_cli: Cli, dsn: str, tmp_path: Path
) -> None:
    alice, bob = _token(run_cli, "alice"), _token(run_cli, "bob")
    root = _token(run_cli, "root", "--admin")
    sched = ("schedules", "add", "--cron", "0 9 * * *", "--tz", "Europe/Paris", "--prompt", "p")
    a = run_cli.json(*sched, "--name", "alpha", token=alice)
    af = run_cli.json(*sched, "--name", "failing", "--max-attempts", "1",
                      "--param", "fail_attempts=1", token=alice)  # fmt: skip
    b = run_cli.json(*sched, "--name", "bravo", token=bob)
    assert (a["owner"], af["owner"], b["owner"]) == ("alice", "alice", "bob")
    code, _, err = run_cli(*sched, "--name", "x", "--owner", "carol", token=alice)
    assert code == 2 and "--owner: in remote mode" in err

    # Schedules: the same JSON both ways, and the same human text under one pinned clock.
    sid, fid, bid = str(a["id"]), str(af["id"]), str(b["id"])
    assert run_cli.both("schedules", "show", sid, token=alice)["name"] == "alpha"
    mine = run_cli.json("schedules", "list", token=alice)
    assert mine == run_cli.json("schedules", "list", "--owner", "alice")
    assert [s["name"] for s in mine] == ["alpha", "failing"]
    assert [s["owner"] for s in run_cli.json("schedules", "list", token=root)] == [
        "alice", "alice", "bob"]  # fmt: skip
    assert run_cli.json("schedules", "list", "--owner", "bob", token=root) == run_cli.json(
        "schedules", "list", "--owner", "bob")  # fmt: skip
    pinned = FrozenClock(datetime(2026, 11, 23, 7, 57, tzinfo=UTC))
    for argv in (("schedules", "show", sid), ("schedules", "list", "--owner", "alice")):
        remote = run_cli(*argv, token=alice, clock=pinned)
        assert remote[0] == 0 and remote == run_cli(*argv, clock=pinned), argv
    preview = ("preview", "0 9 * * *", "--tz", "Europe/Paris", "--from", "2026-03-28T00:00Z")
    assert len(run_cli.both(*preview, "--count", "3", token=alice)["fire_times"]) == 3

    edit = ("schedules", "edit", sid, "--name", "alpha2", "--every", "15m")
    edited = run_cli.json(*edit, "--param", "latency=1ms", "--email", "a@x.example", token=alice)
    assert (edited["name"], edited["kind"], edited["params"]) == ("alpha2", "every", {
        "latency": "1ms"})  # fmt: skip
    assert edited["notify"]["email"] == ["a@x.example"]
    stale = ("schedules", "edit", sid, "--name", "late", "--version", str(a["version"]))
    remote_stale, direct_stale = run_cli(*stale, token=alice), run_cli(*stale)
    assert remote_stale == direct_stale and remote_stale[0] == 1
    assert remote_stale[2] == (
        f"promptsched: error: version: the schedule changed meanwhile (now at version "
        f"{edited['version']})\n"
    )
    paused = run_cli.json("schedules", "pause", sid, "--reason", "holiday", token=alice)
    assert paused["enabled"] is False
    assert run_cli.json("schedules", "resume", sid, token=alice)["enabled"] is True
    history = run_cli.both("schedules", "history", sid, token=alice)
    assert [h["action"] for h in history] == ["resume", "pause", "update", "create"]
    explained = run_cli.both("schedules", "explain", fid, "--at", "2020-01-01T09:00", token=alice)
    assert explained["verdict"] == "before_created"

    # Runs.
    run = run_cli.json("schedules", "trigger", sid, token=alice)
    dead = run_cli.json("schedules", "trigger", fid, token=alice)
    factories.work_once(dsn)
    run_cli.capsys.readouterr()  # the worker's log
    assert run_cli.both("runs", "show", str(run["id"]), token=alice)["status"] == "succeeded"
    assert run_cli.both("runs", "list", "--schedule", fid, token=alice)[0]["status"] == "dead"
    replay = run_cli.json("runs", "replay", str(dead["id"]), token=alice)
    assert replay["replay_of"] == dead["id"]
    cancelled = run_cli.json("runs", "cancel", str(replay["id"]), token=alice)
    assert cancelled["status"] == "cancelled"
    assert run_cli.both("runs", "watch", str(run["id"]), token=alice) == {
        "event": "done", "run_id": run["id"], "status": "succeeded"}  # fmt: skip
    for argv in (("runs", "show", str(run["id"])), ("schedules", "history", sid),
                 ("runs", "list", "--schedule", sid), ("schedules", "explain", sid, "--at",
                 "2026-01-01T09:00")):  # fmt: skip
        remote = run_cli(*argv, token=alice, clock=pinned)
        assert remote[0] == 0 and remote == run_cli(*argv, clock=pinned), argv
    code, out, _ = run_cli("runs", "watch", str(run["id"]), token=alice)
    assert code == 0 and out.splitlines()[-1] == f"run {run['id']} succeeded"
    again_run = run_cli.json("schedules", "trigger", sid, token=alice)
    factories.work_once(dsn)
    run_cli.capsys.readouterr()
    pair = ("runs", "diff", str(run["id"]), str(again_run["id"]))
    assert run_cli.both(*pair, token=alice)["changed"] is False  # the same prompt, echoed
    assert run_cli(*pair, token=alice) == run_cli(*pair)
    backfill = run_cli.json("schedules", "backfill", fid, "--start", "2026-01-01T00:00:00Z",
                            "--end", "2026-01-02T23:00:00Z", token=alice)  # fmt: skip
    assert backfill["created"] == 2 and len(backfill["slots"]) == 2

    # Notifications.
    nid = _sql(dsn, "INSERT INTO outbox (run_id, schedule_id, channel, target, event, status, "
               "idempotency_key) VALUES ($1, $2, 'email', '[\"a@example.com\"]', 'dead', 'dead',"
               " 'k') RETURNING id", dead["id"], af["id"])  # fmt: skip
    assert [n["id"] for n in run_cli.both("notifications", "dead", token=alice)] == [nid]
    assert run_cli.json("notifications", "replay", str(nid), token=alice)["status"] == "pending"
    again = ("notifications", "replay", str(nid))
    assert run_cli(*again, token=alice) == run_cli(*again)
    assert run_cli(*again)[0] == 1 and "only dead notifications" in run_cli(*again)[2]

    # Bob reaches none of Alice's: every command that names her resources is a 404.
    before = run_cli.json("schedules", "list")
    hidden: tuple[tuple[str, ...], ...] = (
        ("schedules", "show", sid), ("schedules", "edit", sid, "--name", "mine"),
        ("schedules", "pause", sid), ("schedules", "resume", sid),
        ("schedules", "trigger", sid), ("schedules", "delete", sid),
        ("schedules", "backfill", sid, "--start", "2026-01-01T00:00:00Z",
         "--end", "2026-01-01T00:00:00Z"),
        ("schedules", "history", sid), ("schedules", "explain", sid, "--at", "2026-01-01T09:00"),
        ("runs", "show", str(run["id"])), ("runs", "cancel", str(run["id"])),
        ("runs", "replay", str(dead["id"])), ("runs", "watch", str(run["id"])),
        ("notifications", "replay", str(nid)),
        ("runs", "list", "--schedule", sid), ("runs", "diff", str(run["id"]), str(run["id"])),
    )  # fmt: skip
    for argv in hidden:
        code, out, err = run_cli(*argv, token=bob)
        assert code == 4 and "not found" in err and not out, (argv, code, err)
    assert run_cli.json("schedules", "list", "--owner", "alice", token=bob) == []
    assert [s["id"] for s in run_cli.json("schedules", "list", token=bob)] == [b["id"]]
    assert run_cli.json("runs", "list", token=bob) == []
    assert run_cli.json("notifications", "list", token=bob) == []
    assert run_cli.json("schedules", "list") == before  # nothing of Alice's changed

    # Delete: the runs go, the history stays readable.
    code, out, _ = run_cli("schedules", "delete", fid, token=alice)
    assert code == 0 and "its change history stays" in out
    assert run_cli("schedules", "show", fid, token=alice)[0] == 4
    assert run_cli.json("schedules", "history", fid, token=alice)[0]["action"] == "delete"
    assert run_cli.json("schedules", "delete", bid, token=bob) == {"deleted": b["id"]}

    # The owner's budget, remote and direct alike (tests/test_cli_budget.py has the rest).
    assert run_cli.json("budget", "set", "tokens/day=500", token=alice)["budget"] == {
        "tokens_per_day": 500
    }
    assert run_cli.both("budget", "show", "--owner", "alice", token=alice)["budget"] == {
        "tokens_per_day": 500
    }
    assert run_cli.json("budget", "clear", token=alice)["budget"] is None
    # Follow-ups (tests/test_cli_followups.py has the rest).
    added = run_cli.json("followups", "add", "--key", "k1", "--in", "1h", "--prompt", "p",
                         token=alice)  # fmt: skip
    assert added["key"] == "k1" and added["state"] == "active"
    assert run_cli.json("followups", "show", "k1", token=alice)["key"] == "k1"
    assert [f["key"] for f in run_cli.json("followups", "list", token=alice)] == ["k1"]
    assert run_cli.json("followups", "cancel", "k1", token=alice) == {"cancelled": "k1"}
    # The fleet's status: admin tokens only (tests/test_fleet_processes.py has the rest).
    code, _, err = run_cli("status", token=alice)
    assert code == 1 and "admin" in err
    assert run_cli.json("status", token=root)["fleet"]["replicas"] >= 0
    # Doctor runs in the replica that answers (tests/test_doctor.py has the rest): these
    # schedules email, and it has no SMTP.
    code, out, _ = run_cli("doctor", token=root)
    assert code == 1 and "FAIL  smtp:" in out and "ok    database:" in out

    assert not run_cli.data_dir.exists()  # remote mode never touched an embedded database
    assert run_cli.used >= _all_commands() - LOCAL_ONLY, _all_commands() - run_cli.used


def test_remote_errors_are_worded_as_the_api_words_them(run_cli: Cli) -> None:
    alice = _token(run_cli, "alice")
    code, out, err = run_cli("schedules", "add", "--name", "n", "--cron", "61 * * * *",
                             "--prompt", "p", token=alice)  # fmt: skip
    assert code == 2 and not out and err.startswith("promptsched: error: expression: ")
    direct = run_cli("schedules", "add", "--name", "n", "--cron", "61 * * * *", "--prompt", "p")
    assert direct == (code, out, err)
    code, _, err = run_cli("schedules", "list", token="pst_" + "x" * 43)
    assert code == 1 and "token" in err.lower() and "Traceback" not in err


def test_human_times_are_in_the_zone_relative_and_paused_schedules_have_no_next_fire(
    run_cli: Cli,
) -> None:
    clock = FrozenClock(datetime(2026, 11, 23, 7, 57, tzinfo=UTC))  # 08:57 in Paris
    code, out, _ = run_cli("schedules", "add", "--name", "brief", "--cron", "0 9 * * *",
                           "--tz", "Europe/Paris", "--prompt", "p", clock=clock)  # fmt: skip
    assert code == 0
    assert "next fire: 2026-11-23 09:00 CET (in 3 min)" in out, out
    code, out, _ = run_cli("schedules", "show", "1", clock=clock)
    assert re.search(r"next fire times +2026-11-23 09:00 CET \(in 3 min\)\n", out), out
    assert "2026-11-24 09:00 CET (in 1 d)" in out
    assert "{" not in out and "'" not in out and re.search(r"notify +none\n", out)
    code, out, _ = run_cli("schedules", "pause", "1", "--reason", "holiday", clock=clock)
    assert "next fire: none while paused" in out and "09:00" not in out
    out = run_cli("schedules", "show", "1", clock=clock)[1]
    assert re.search(r"next fire times +none while paused", out) and "(in 3 min)" not in out
    assert "- (paused)" in run_cli("schedules", "list", clock=clock)[1]
    clock.advance(datetime(2026, 11, 23, 9, 20, tzinfo=UTC) - clock.instant)  # 23 min late
    code, out, _ = run_cli("schedules", "resume", "1", clock=clock)
    assert "next fire: 2026-11-24 09:00 CET (in 22 h 40 min)" in out, out
    assert "slots due since 2026-11-23 09:00 CET (1 h 20 min ago) meet the misfire" in out
    history = run_cli("schedules", "history", "1", clock=clock)[1]
    assert re.search(r"resume\s", history) and "holiday" in history
    code, out, _ = run_cli("schedules", "explain", "1", "--at", "2026-11-23T09:00", clock=clock)
    assert code == 0 and out.startswith("2026-11-23 09:00 CET (1 h 20 min ago): ")


def _watcher(dsn: str, run_id: int, remote_env: dict[str, str] | None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTSCHED_")}
    env.update(remote_env or {"PROMPTSCHED_DATABASE_URL": dsn})
    return subprocess.Popen(
        [sys.executable, "-m", "promptsched", "runs", "watch", str(run_id)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
async def test_runs_watch_follows_an_agent_run_live_in_both_modes(
    dsn: str,
    pool: asyncpg.Pool[Any],
    tmp_path: Path,
    fake: fake_server.FakeOpenAI,
    pages: site.Pages,
) -> None:
    rid, token = await agents._owed_agent_run(pool, fake, pages)
    service = Service(dsn, tmp_path / "service.log", env=agents._env(fake))
    watchers: list[subprocess.Popen[str]] = []
    try:
        port = (await service.wait_event("api.listening", timeout=60))["port"]
        remote_env = {"PROMPTSCHED_URL": f"http://127.0.0.1:{port}", "PROMPTSCHED_TOKEN": token}
        watchers = [_watcher(dsn, rid, remote_env), _watcher(dsn, rid, None)]
        for watcher in watchers:
            assert watcher.stdout is not None
            first = await anyio.to_thread.run_sync(watcher.stdout.readline)
            assert first.startswith(f"watching run {rid} (pending)"), first
        await pool.execute("UPDATE runs SET available_at = now() WHERE id = $1", rid)
        await pool.execute("SELECT pg_notify('promptsched_runs', 'test')")
        outputs = [
            await anyio.to_thread.run_sync(lambda w=w: w.communicate(timeout=60)) for w in watchers
        ]
    finally:
        for watcher in watchers:
            if watcher.poll() is None:
                watcher.kill()
                watcher.wait()
        service.stop()
    (remote_out, remote_err), (direct_out, direct_err) = outputs
    assert [w.returncode for w in watchers] == [0, 0], (remote_err, direct_err)
    lines = remote_out.splitlines()
    assert re.fullmatch(r"\[attempt 1\] calling http_get \{.*/page\"\}", lines[2]), lines
    assert lines[:2] + lines[3:] == [
        "[attempt 1] starting with http_get; at most 4 steps",
        "[attempt 1] step 1/4: the model calls http_get (10 tokens)",
        "[attempt 1] http_get returned 141 chars",
        "[attempt 1] step 2/4: the model answered (20 tokens)",
        f"run {rid} succeeded",
    ]
