"""A monitor's runs as the API, the CLI and explain show them (docs/monitors.md): each
success's decision with its reason, the structured answer, and `runs diff A B` for any two runs
of a schedule (JSON paths, or a text diff), refused for runs of two schedules or without
output."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import asyncpg

from promptsched.clock import FrozenClock
from tests import api_support, factories
from tests.factories import EPOCH
from tests.helpers import run_cli
from tests.test_monitor_answers import _run
from tests.test_monitor_rules import STATUS


async def test_decisions_answers_and_diffs_are_shown(pool: asyncpg.Pool[Any], dsn: str) -> None:
    sid = await factories.schedule(pool, output_schema=STATUS, notify_when="changed")
    a = await _run(pool, sid, 0, '{"status": "ok", "degraded": false}')
    b = await _run(pool, sid, 1, '{"degraded": false, "status": "ok"}')
    c = await _run(pool, sid, 2, '{"status": "degraded", "degraded": true}')
    text = await factories.schedule(pool, notify_when="changed")
    t1 = await _run(pool, text, 0, "line one\nline two")
    t2 = await _run(pool, text, 1, "line one\nline 2")
    async with api_support.client(pool, clock=FrozenClock(EPOCH + timedelta(days=1))) as api:
        who = await api.token("default")
        listed = (await api.get(f"/v1/schedules/{sid}/runs", who)).body["items"]
        assert [r["notify_decision"]["reason"] for r in listed] == [
            f"output changed since run {a}", f"output unchanged since run {a}",
            "first output: nothing to compare with",
        ]  # fmt: skip
        shown = (await api.get(f"/v1/runs/{b}", who)).body
        assert shown["output_json"] == {"status": "ok", "degraded": False}
        assert shown["notify_decision"] == {
            "notify": False, "when": "changed", "since": a,
            "reason": f"output unchanged since run {a}",
        }  # fmt: skip
        diff = (await api.get(f"/v1/runs/{a}/diff/{c}", who)).body
        assert diff == {"schedule_id": sid, "a": a, "b": c, "kind": "json", "changed": True,
                        "paths": [{"path": "/status", "old": "ok", "new": "degraded"},
                                  {"path": "/degraded", "old": False, "new": True}]}  # fmt: skip
        same = (await api.get(f"/v1/runs/{a}/diff/{b}", who)).body
        assert (same["changed"], same["paths"]) == (False, [])
        texts = (await api.get(f"/v1/runs/{t1}/diff/{t2}", who)).body
        assert texts["diff"] == [f"--- run {t1}", f"+++ run {t2}", "@@ -1,2 +1,2 @@",
                                 " echo: line one", "-line two", "+line 2"]  # fmt: skip
        across = await api.get(f"/v1/runs/{a}/diff/{t2}", who)
        assert across.status == 422 and across.body["error"]["field"] == "b"
        assert "compare two runs of one schedule" in across.body["error"]["message"]
        other = await api.token("mallory")
        assert (await api.get(f"/v1/runs/{a}/diff/{c}", other)).status == 404
        at = (EPOCH + timedelta(hours=1)).isoformat()
        explained = await api.get(f"/v1/schedules/{sid}/explain", who, params={"at": at})
        assert f"it did not notify: output unchanged since run {a}" in explained.body["message"]

    listed_cli = run_cli("runs", "list", "--schedule", str(sid), dsn=dsn)
    assert listed_cli.returncode == 0, listed_cli.stderr
    assert f"not notified: output unchanged since run {a}" in listed_cli.stdout
    assert f"notified: output changed since run {a}" in listed_cli.stdout
    diffed = run_cli("runs", "diff", str(a), str(c), dsn=dsn)
    assert diffed.returncode == 0, diffed.stderr
    assert diffed.stdout.splitlines() == [
        f"run {a} -> run {c}: 2 path(s) changed",
        '  /status: "ok" → "degraded"', "  /degraded: false → true",
    ]  # fmt: skip
    as_json = run_cli("runs", "diff", str(t1), str(t2), "--json", dsn=dsn)
    assert json.loads(as_json.stdout)["kind"] == "text"
    shown_cli = run_cli("runs", "show", str(b), dsn=dsn)
    assert f"not notified: output unchanged since run {a}" in shown_cli.stdout
    assert '"status": "ok"' in shown_cli.stdout
    dead = await factories.pending_run(pool, sid, EPOCH + timedelta(hours=9))
    await pool.execute("UPDATE runs SET status = 'dead', error = 'x' WHERE id = $1", dead)
    refused = run_cli("runs", "diff", str(a), str(dead), dsn=dsn)
    assert refused.returncode != 0 and "has no output (dead)" in refused.stderr
