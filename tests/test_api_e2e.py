"""End to end: a token made with the CLI, a schedule created over HTTP on a real
``promptsched run`` process, and its first slot fired within the scheduler's wake-up latency
(not a polling interval) and run by the echo provider."""

from __future__ import annotations

import os
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import asyncpg
import pytest

from tests.helpers import Service, wait_until

pytestmark = pytest.mark.slow


async def _cli_token(dsn: str, owner: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTSCHED_")}
    env["PROMPTSCHED_DATABASE_URL"] = dsn
    done = await anyio.run_process(
        [sys.executable, "-m", "promptsched", "tokens", "create", "--owner", owner], env=env
    )
    token = done.stdout.decode().strip()
    assert token.startswith("pst_") and "\n" not in token, done.stderr
    assert token not in done.stderr.decode()
    return token


async def test_a_schedule_created_over_http_fires_at_its_first_slot(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    token = await _cli_token(dsn, "a")
    service = Service(dsn, tmp_path / "service.log")
    try:
        await service.ready()
        port = (await service.wait_event("api.listening"))["port"]
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
            async with http.post(
                "/v1/schedules",
                json={"name": "every second", "cron": "* * * * * *", "prompt": "tick {{ slot }}"},
                headers={"Authorization": f"Bearer {token}"},
            ) as response:
                assert response.status == 201, await response.text()
                created = await response.json()
        first_slot = datetime.fromisoformat(created["next_fire_at"])

        async def first_run() -> asyncpg.Record | None:
            return await pool.fetchrow(
                "SELECT * FROM runs WHERE schedule_id = $1 ORDER BY slot LIMIT 1", created["id"]
            )

        run = await wait_until(first_run, timeout=10, interval=0.02, what="the first run")
        assert run["slot"] == first_slot  # no missed slot
        assert run["origin"] == "cadence" and run["missed_slots"] == 0
        lag = (run["created_at"] - run["slot"]).total_seconds()
        print(f"end-to-end fire latency (run row created_at - slot): {lag * 1000:.1f} ms")
        assert 0 <= lag < 0.5

        async def succeeded() -> bool:
            status = await pool.fetchval("SELECT status FROM runs WHERE id = $1", run["id"])
            return bool(status == "succeeded")

        await wait_until(succeeded, timeout=10, what="the echo provider to run it")
        output = await pool.fetchval("SELECT output FROM runs WHERE id = $1", run["id"])
        assert output and "tick" in output
        logged = service.log_path.read_text()
        assert token not in logged  # tokens are never logged
    finally:
        assert service.stop() == 0
