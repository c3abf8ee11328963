"""The CLI commands around the API: tokens (shown once), human tables and --json for schedules
and runs, run show/cancel/replay, and exit codes (2 bad input, 4 not found, 1 other)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from promptsched import cli
from promptsched.store import pool as pools
from promptsched.web import auth
from tests import factories

RUN_KEYS = {"id", "schedule_id", "slot", "status", "attempts", "skip_reason", "error"}


@pytest.fixture
def promptsched(
    dsn: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Any:
    """Run a CLI command in-process; returns (exit code, stdout, stderr)."""
    monkeypatch.setenv("PROMPTSCHED_DATABASE_URL", dsn)

    def run(*argv: str) -> tuple[int, str, str]:
        code = cli.main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def _token_owner(dsn: str, token: str) -> Any:
    async def look() -> Any:
        conn = await pools.connect(dsn)
        try:
            return await conn.fetchrow(
                "SELECT owner, admin, name FROM api_tokens WHERE token_hash = $1",
                auth.token_hash(token),
            )
        finally:
            await conn.close()

    return asyncio.run(look())


def test_tokens_create_prints_the_token_once(promptsched: Any, dsn: str) -> None:
    code, out, err = promptsched("tokens", "create", "--owner", "alice", "--name", "ci")
    assert code == 0
    token = out.strip()
    assert token.startswith("pst_") and "\n" not in token and token not in err
    assert "shown only now" in err
    assert dict(_token_owner(dsn, token)) == {"owner": "alice", "admin": False, "name": "ci"}
    code, out, _ = promptsched("tokens", "create", "--owner", "ops", "--admin", "--json")
    created = json.loads(out)
    assert created["admin"] is True and created["token"].startswith("pst_")
    code, out, _ = promptsched("tokens", "list")
    assert code == 0 and "alice" in out and token not in out and created["token"] not in out
    assert promptsched("tokens", "revoke", str(created["id"]))[0] == 0
    assert promptsched("tokens", "revoke", str(created["id"]))[0] == 4
    code, _, err = promptsched("tokens", "create", "--owner", "no spaces")
    assert code == 2 and "--owner" in err


def test_schedules_tables_and_json(promptsched: Any) -> None:
    for name in ("alpha", "beta"):
        assert promptsched("schedules", "add", "--name", name, "--cron", "0 9 * * *",
                           "--prompt", "p")[0] == 0  # fmt: skip
    code, out, _ = promptsched("schedules", "list")
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:5] == ["ID", "OWNER", "NAME", "KIND", "EXPRESSION"]
    assert "alpha" in lines[1] and "beta" in lines[2] and "enabled" in lines[1]
    code, out, _ = promptsched("schedules", "list", "--json", "--name", "BET")
    assert [s["name"] for s in json.loads(out)] == ["beta"]
    code, out, _ = promptsched("schedules", "show", "1")
    assert code == 0 and "next fire times" in out and "alpha" in out
    assert json.loads(promptsched("schedules", "show", "1", "--json")[1])["id"] == 1
    code, out, _ = promptsched("schedules", "pause", "1", "--reason", "holiday")
    assert code == 0 and "paused (holiday)" in out
    assert "paused" in promptsched("schedules", "list")[1].splitlines()[1]
    assert promptsched("schedules", "resume", "1", "--json")[0] == 0
    assert promptsched("schedules", "show", "99")[0] == 4
    assert promptsched("schedules", "pause", "99")[0] == 4
    assert promptsched("schedules", "delete", "2")[0] == 0
    assert promptsched("schedules", "delete", "2")[0] == 4
    code, _, err = promptsched("schedules", "pause", "1", "--until", "tomorrow")
    assert code == 2 and "--until" in err


def test_runs_list_show_cancel_and_replay(promptsched: Any, dsn: str) -> None:
    promptsched("schedules", "add", "--name", "ok", "--cron", "0 9 * * *", "--prompt", "p")
    promptsched("schedules", "add", "--name", "bad", "--cron", "0 9 * * *", "--prompt", "p",
                "--max-attempts", "1", "--param", "fail_attempts=1")  # fmt: skip
    for sid in ("1", "2"):
        assert promptsched("schedules", "trigger", sid)[0] == 0
    factories.work_once(dsn)
    promptsched("schedules", "trigger", "1")  # stays pending

    code, out, _ = promptsched("runs", "list", "--json")
    runs = json.loads(out)
    assert code == 0 and [r["status"] for r in runs] == ["pending", "dead", "succeeded"]
    assert all(RUN_KEYS <= set(r) for r in runs)
    code, out, _ = promptsched("runs", "list", "--status", "dead")
    assert out.splitlines()[0].split()[:3] == ["ID", "SCHEDULE", "SLOT"]
    assert "injected failure" in out and len(out.splitlines()) == 2

    code, out, _ = promptsched("runs", "show", "1")
    assert code == 0 and "attempts:" in out and "output:" in out and "succeeded" in out
    detail = json.loads(promptsched("runs", "show", "2", "--json")[1])
    assert detail["status"] == "dead" and detail["attempt_history"][0]["status"] == "failed"

    code, out, _ = promptsched("runs", "replay", "2")
    assert code == 0 and "replayed run 2 as run 4" in out
    code, _, err = promptsched("runs", "replay", "2")
    assert code == 1 and "already replayed as run 4" in err
    code, out, _ = promptsched("runs", "cancel", "3", "--json")
    assert code == 0 and json.loads(out)["status"] == "cancelled"
    code, _, err = promptsched("runs", "cancel", "1")
    assert code == 1 and "succeeded" in err
    assert promptsched("runs", "show", "99")[0] == 4
    assert promptsched("runs", "cancel", "99")[0] == 4
