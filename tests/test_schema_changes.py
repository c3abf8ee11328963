"""A schema change under a live replica: statements it prepared before an ``ALTER TABLE``
are prepared again and their unit of work (a request, a console form, a role's tick) runs
once more, so that no caller ever sees the change (store/pool.py ``retry_stale``)."""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import asyncpg
import pytest

import promptsched
from promptsched.store import migrate
from tests.helpers import Service, assert_every_second_once, run_cli, wait_until

pytestmark = pytest.mark.slow

# The tables every request, form and tick writes or reads in a transaction.
HOT = (
    "schedules", "runs", "ended_attempts", "schedule_changes", "schedule_names", "outbox",
    "api_tokens", "console_sessions", "replicas",
)  # fmt: skip
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


class Load:
    """Requests of every kind in a loop; every status counted by what made it."""

    def __init__(self, http: aiohttp.ClientSession, token: str) -> None:
        self.http = http
        self.auth = {"Authorization": f"Bearer {token}"}
        self.token = token
        self.statuses: Counter[tuple[str, int]] = Counter()
        self.done = 0
        self.stopping = False

    def _count(self, what: str, status: int) -> None:
        self.statuses[(what, status)] += 1
        self.done += 1

    def failures(self) -> dict[tuple[str, int], int]:
        return {key: n for key, n in self.statuses.items() if key[1] >= 500}

    async def api(self, worker: int) -> None:
        n = 0
        while not self.stopping:
            n += 1
            body = {"name": f"load-{worker}-{n}", "cron": "0 0 1 1 *", "prompt": "p"}
            async with self.http.post("/v1/schedules", json=body, headers=self.auth) as r:
                self._count("create", r.status)
                if r.status != 201:
                    continue
                created = await r.json()
            path = f"/v1/schedules/{created['id']}"
            async with self.http.patch(path, json={"prompt": "q"}, headers=self.auth) as r:
                self._count("update", r.status)
            async with self.http.post(f"{path}/trigger", headers=self.auth) as r:
                self._count("trigger", r.status)
            async with self.http.get("/v1/runs?limit=5", headers=self.auth) as r:
                self._count("runs", r.status)
            async with self.http.post(f"{path}/pause", json={}, headers=self.auth) as r:
                self._count("pause", r.status)

    async def console(self, schedule_id: int) -> None:
        async with self.http.get("/login") as r:
            csrf = _CSRF.search(await r.text())
        assert csrf is not None
        login = {"token": self.token, "csrf": csrf.group(1)}
        async with self.http.post("/login", data=login, allow_redirects=False) as r:
            assert r.status == 303, await r.text()
        while not self.stopping:
            async with self.http.get(f"/schedules/{schedule_id}") as r:
                self._count("console-page", r.status)
                csrf = _CSRF.search(await r.text())
            if csrf is None:
                continue
            for action in ("pause", "resume"):
                form = {"csrf": csrf.group(1), "confirmed": "1"}
                async with self.http.post(
                    f"/schedules/{schedule_id}/{action}", data=form, allow_redirects=False
                ) as r:
                    self._count(f"console-{action}", r.status)


async def test_alter_table_of_each_hot_table_under_load_answers_no_error(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    made = run_cli("tokens", "create", "--owner", "alice", dsn=dsn)
    token = made.stdout.strip()
    assert token.startswith("pst_"), made.stderr
    # As fast as it answers, one token: no API rate limit (tests/test_quotas.py has its own).
    env = {"PROMPTSCHED_WORKERS": "4", "PROMPTSCHED_API_RATE": "0"}
    service = Service(dsn, tmp_path / "service.log", env=env)
    try:
        await service.ready()
        port = (await service.wait_event("api.listening"))["port"]
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}", cookie_jar=jar) as http:
            load = Load(http, token)
            every = {"name": "every-second", "cron": "* * * * * *", "prompt": "tick"}
            async with http.post("/v1/schedules", json=every, headers=load.auth) as r:
                assert r.status == 201, await r.text()
                ticking = (await r.json())["id"]
            target = {"name": "console-target", "cron": "0 0 1 1 *", "prompt": "p"}
            async with http.post("/v1/schedules", json=target, headers=load.auth) as r:
                assert r.status == 201, await r.text()
                console_target = (await r.json())["id"]
            started = time.monotonic()
            async with anyio.create_task_group() as tg:
                for worker in range(3):
                    tg.start_soon(load.api, worker)
                tg.start_soon(load.console, console_target)
                # Every prepared statement of the replica is in use before the first change.
                await _wait_done(load, 60)
                for number, table in enumerate(HOT):
                    await pool.execute(f"ALTER TABLE {table} ADD COLUMN probe_{number} text")
                    await _wait_done(load, 40)  # each kind of request ran again since
                load.stopping = True
            async with http.get("/metrics") as r:
                exported = await r.text()
        # The release it runs, as Prometheus reads it (docs/observability.md).
        build = (
            f'promptsched_build_info{{commit="{promptsched.commit()}",'
            f'schema="{migrate.latest_version()}",version="{promptsched.__version__}"}} 1.0'
        )
        assert build in exported, [x for x in exported.splitlines() if "build_info" in x]
        print(dict(load.statuses))
        assert load.failures() == {}, dict(load.statuses)
        assert load.statuses[("create", 201)] > 20, dict(load.statuses)
        assert load.statuses[("console-pause", 303)] > 5, dict(load.statuses)
        errors = [  # a loaded machine may lag the event loop: not an error of the change
            e
            for e in service.events()
            if e.get("level") in ("error", "critical", "warning")
            and e.get("event") != "event_loop.lagged"
        ]
        assert errors == []
        slots = [
            row["slot"]
            for row in await pool.fetch(
                "SELECT slot FROM runs WHERE schedule_id = $1 AND origin = 'cadence' ORDER BY slot",
                ticking,
            )
        ]
        assert len(slots) >= time.monotonic() - started - 3
        assert_every_second_once(slots)
        prepared_again = [
            e for e in service.events() if e.get("event") == "store.statements_prepared_again"
        ]
        assert prepared_again, "no request met a statement the changes made stale"
    finally:
        assert service.stop() == 0


async def _wait_done(load: Load, more: int) -> None:
    target = load.done + more

    async def enough() -> bool:
        return load.done >= target

    await wait_until(enough, timeout=60, what=f"{more} more requests")


async def test_a_roles_tick_that_met_a_stale_statement_runs_again_at_once() -> None:
    """The roles' loop (roles/loop.py) is the owner of each tick's transactions: a tick whose
    transaction met a statement a schema change made stale runs again at once, and no
    role error is counted or logged; any other error still is."""
    from promptsched.metrics import Metrics
    from promptsched.roles.loop import Wakeup, run_forever

    metrics = Metrics()
    calls: list[str] = []

    async def tick() -> float:
        calls.append("tick")
        if len(calls) == 1:
            raise asyncpg.InvalidCachedStatementError("cached statement plan is invalid")
        if len(calls) == 3:
            raise ValueError("a bug")
        return 0.0

    await run_forever("probe", tick, Wakeup(), metrics, stopping=lambda: len(calls) >= 4)
    assert calls == ["tick"] * 4
    errors = metrics.registry.get_sample_value("promptsched_role_errors_total", {"role": "probe"})
    assert errors == 1.0  # the ValueError only
