"""Monitors on the command line: --notify-when and --output-schema FILE on add and edit,
refused naming the flag or field, shown by schedules show."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import asyncpg

from tests.helpers import run_cli
from tests.test_monitor_rules import STATUS


async def test_add_and_edit_a_monitor(dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path) -> None:
    schema = tmp_path / "status.json"
    schema.write_text(json.dumps({**STATUS, "title": "Status page"}))
    added = run_cli(
        "schedules", "add", "--name", "status", "--every", "1h", "--prompt", "Read the page",
        "--output-schema", str(schema), "--notify-when", "/degraded", "--json", dsn=dsn,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    body = json.loads(added.stdout)
    assert body["notify_when"] == "/degraded" and body["output_schema"]["title"] == "Status page"
    shown = run_cli("schedules", "show", str(body["id"]), dsn=dsn)
    assert shown.returncode == 0, shown.stderr
    pairs = [line.split(None, 2)[-1] for line in shown.stdout.splitlines()]
    assert "when  /degraded".split()[-1] in pairs
    assert "notify when" in shown.stdout and "output schema" in shown.stdout
    assert "Status page: a JSON object with status, degraded" in pairs

    edited = run_cli("schedules", "edit", str(body["id"]), "--notify-when", "changed", dsn=dsn)
    assert edited.returncode == 0, edited.stderr
    cleared = run_cli(
        "schedules", "edit", str(body["id"]), "--output-schema", "", "--json", dsn=dsn
    )
    assert cleared.returncode == 0, cleared.stderr
    after = json.loads(cleared.stdout)
    assert (after["output_schema"], after["notify_when"]) == (None, "changed")

    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "object", "properties": {"a": {"type": "strin"}}}')
    refused = run_cli("schedules", "edit", str(body["id"]), "--output-schema", str(bad), dsn=dsn)
    assert refused.returncode != 0 and "output_schema" in refused.stderr
    assert "at /properties/a/type" in refused.stderr and "Traceback" not in refused.stderr
    missing = run_cli("schedules", "edit", str(body["id"]), "--output-schema",
                      str(tmp_path / "nope.json"), dsn=dsn)  # fmt: skip
    assert missing.returncode != 0 and "--output-schema" in missing.stderr
    condition = run_cli("schedules", "edit", str(body["id"]), "--notify-when", "/up", dsn=dsn)
    assert condition.returncode != 0 and "notify_when" in condition.stderr
    assert "set an output_schema" in condition.stderr
    row = await pool.fetchrow("SELECT notify_when, output_schema FROM schedules")
    assert (row["notify_when"], row["output_schema"]) == ("changed", None)
