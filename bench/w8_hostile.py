"""W8 hostile previews: event-loop lag and /healthz latency while clients burst pathological
previews at the API.

The API is served in this process, so a probe on its event loop can time the loop itself
(scheduled versus actual wake-up every 10 ms). The clients run in a child process
(``python -m bench.w8_hostile URL TOKEN SECONDS``): eight of them send previews of sparse
SECONDLY/MINUTELY rules, far-future DTSTARTs, huge COUNTs and rules that never fire, while
another probes /healthz every 20 ms. The same loop is measured quiet first, for comparison.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.common import fresh_database, percentile, spread
from promptsched.api import app as api_app
from promptsched.console import routes as console_routes
from promptsched.metrics import Metrics
from promptsched.store import pool as pools
from promptsched.store.embedded import EmbeddedPostgres
from promptsched.web import auth

QUIET_SECONDS = 3.0
BURST_SECONDS = 20.0
CLIENTS = 8
PERIOD = 0.01
_DT = "DTSTART:20260101T000000\n"
HOSTILE = (
    _DT + "RRULE:FREQ=SECONDLY;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO;BYSETPOS=1",
    _DT + "RRULE:FREQ=SECONDLY;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO;BYSETPOS=2",
    _DT + "RRULE:FREQ=SECONDLY;INTERVAL=2;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO;BYHOUR=12",
    _DT + "RRULE:FREQ=SECONDLY;INTERVAL=2;BYHOUR=12;BYMINUTE=0;BYSECOND=0",
    _DT + "RRULE:FREQ=MINUTELY;INTERVAL=7;BYMONTH=2;BYMONTHDAY=29;BYHOUR=3",
    _DT + "RRULE:FREQ=MINUTELY;INTERVAL=7;COUNT=100000;BYHOUR=12",
    _DT + "RRULE:FREQ=DAILY;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO",
    _DT + "RRULE:FREQ=YEARLY;INTERVAL=400;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO",
    "DTSTART:46920101T000000\nRRULE:FREQ=SECONDLY",
    "¹ * * * *",
)


async def _lag_probe(samples: list[float], stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        planned = loop.time() + PERIOD
        await asyncio.sleep(PERIOD)
        samples.append(max(0.0, loop.time() - planned))


async def run(embedded: EmbeddedPostgres, workdir: Path) -> dict[str, Any]:
    dsn = await fresh_database(embedded)
    pool = await pools.create_pool(dsn, max_size=4)
    runner = web.AppRunner(
        api_app.build(
            pool, Metrics(), lambda: True, providers=("echo",), mounts=(console_routes.mount,)
        )
    )
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    token, _ = await auth.create_token(pool, owner="bench", admin=False, name="w8")
    stop = asyncio.Event()
    quiet: list[float] = []
    probe = asyncio.create_task(_lag_probe(quiet, stop))
    try:
        await asyncio.sleep(QUIET_SECONDS)  # the quiet baseline is this long, by definition
        stop.set()
        await probe
        stop = asyncio.Event()
        busy: list[float] = []
        probe = asyncio.create_task(_lag_probe(busy, stop))
        client = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.w8_hostile", f"http://127.0.0.1:{port}", token,
            str(BURST_SECONDS), stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await client.communicate()
        stop.set()
        await probe
    finally:
        stop.set()
        await runner.cleanup()
        await pool.close()
    figures = json.loads(out)
    ms = [v * 1000 for v in busy]
    quiet_ms = [v * 1000 for v in quiet]
    return {
        "clients": CLIENTS,
        "seconds": BURST_SECONDS,
        **figures,
        **spread("loop_lag_ms", ms),
        **spread("quiet_loop_lag_ms", quiet_ms),
    }


async def _clients(url: str, token: str, seconds: float) -> dict[str, Any]:
    """The child process: CLIENTS hostile previewers and one /healthz prober."""
    deadline = time.monotonic() + seconds
    healthz: list[float] = []
    previews: list[float] = []
    statuses: dict[str, int] = {}
    headers = {"Authorization": f"Bearer {token}"}

    async def previewer(session: aiohttp.ClientSession, offset: int) -> None:
        i = offset
        while time.monotonic() < deadline:
            params = {"expression": HOSTILE[i % len(HOSTILE)], "count": "100"}
            params["from"] = "2026-11-23T00:00:00Z"
            i += 1
            started = time.monotonic()
            async with session.get(f"{url}/v1/preview", params=params, headers=headers) as r:
                await r.read()
                statuses[str(r.status)] = statuses.get(str(r.status), 0) + 1
            previews.append(time.monotonic() - started)

    async def prober(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < deadline:
            started = time.monotonic()
            async with session.get(f"{url}/healthz") as r:
                await r.read()
            healthz.append(time.monotonic() - started)
            await asyncio.sleep(0.02)  # the probe's period

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(prober(session), *(previewer(session, n) for n in range(CLIENTS)))
    h = [v * 1000 for v in healthz]
    p = [v * 1000 for v in previews]
    return {
        "previews": len(previews),
        "statuses": ",".join(f"{k}:{v}" for k, v in sorted(statuses.items())),
        "preview_ms_p50": percentile(p, 50),
        "preview_ms_max": max(p, default=float("nan")),
        "healthz_probes": len(healthz),
        **spread("healthz_ms", h),
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(_clients(sys.argv[1], sys.argv[2], float(sys.argv[3])))))
