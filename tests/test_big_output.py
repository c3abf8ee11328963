"""One answer of 9.5 MB (under the provider cap of 10 MB) never holds the event loop
(docs/reliability.md, "One answer never holds the loop"). A real `promptsched run` gets it from
a scripted OpenAI-compatible server for a schedule that notifies a real SMTP server (aiosmtpd)
and a Slack hook; while the run is made, its messages built and sent, its console page opened
and its whole output downloaded, /healthz is asked every 10 ms from a process of its own. Its
p99 stays under 250 ms, and the loop-lag histogram that PromptschedEventLoopStalled reads
(deploy/alerts.yml) counts no probe over 5 s in that time. The page is under a megabyte and
links to the whole output, which both the API and the console stream byte for byte."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import aiohttp
import asyncpg
import pytest

from promptsched.store import queries
from promptsched.web import auth
from tests import factories
from tests.console_support import Console
from tests.fakes import openai_server as fake_server
from tests.fakes.http_sink import HttpSink
from tests.fakes.smtp import FakeSMTP, start_fake_smtp
from tests.helpers import Service, wait_until
from tests.test_providers_integration import MODEL, PROVIDER, provider_env

pytestmark = pytest.mark.slow

SIZE = 9_500_000  # characters (ASCII: bytes too), under the provider cap of 10 MiB
P99 = 0.25  # seconds: /healthz while the answer is handled
PAGE = 1_000_000  # bytes of HTML at most for the run's console page


def answer() -> str:
    """9.5 MB of the Markdown a model writes: headings, emphasis, links, lists, tables, code
    and quotes, each line different (a diff or a parser finds no shortcut)."""
    parts: list[str] = []
    size = n = 0
    while size < SIZE:
        n += 1
        part = {
            0: f"## Section {n}\n\n",
            1: f"The service in region {n} answered **{n % 97} ms** at p99, _steady_, see "
            f"[the report](https://example.com/r/{n}) and `probe-{n}`.\n\n",
            2: "".join(f"- item {n}.{i} with *emphasis* and `x{i}`\n" for i in range(6)) + "\n",
            3: "| a | b | c |\n|---|---|---|\n"
            + "".join(f"| {n} | {i} | {n * i} |\n" for i in range(5))
            + "\n",
            4: "```python\n" + "".join(f"print({n}, {i})\n" for i in range(8)) + "```\n\n",
            5: f"> note {n}: nothing to add\n\n",
        }[n % 6]
        parts.append(part)
        size += len(part)
    return "".join(parts)[:SIZE]


# GET /healthz every 10 ms on one keep-alive connection, in a process of its own (what a load
# balancer sees, measured apart from the test's own work), until its input closes and it has
# made at least 200 probes (a quiet machine does the whole work in a second); then one line:
# each probe's latency in seconds, or null for a probe not answered 200 within 10 s.
_PROBE = """
import http.client, json, select, sys, time
port, latencies = int(sys.argv[1]), []
connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
print("probing", flush=True)
closed = False
while True:
    if closed:
        time.sleep(0.01)
    else:
        closed = bool(select.select([sys.stdin], [], [], 0.01)[0])
    if closed and len(latencies) >= 200:
        break
    started = time.monotonic()
    try:
        connection.request("GET", "/healthz")
        reply = connection.getresponse()
        reply.read()
        latencies.append(time.monotonic() - started if reply.status == 200 else None)
    except OSError:
        latencies.append(None)
        connection.close()
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
print(json.dumps(latencies), flush=True)
"""


class HealthProbe:
    """The probe process: ``stop()`` returns the latencies it measured."""

    def __init__(self, port: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _PROBE, str(port)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        assert self.process.stdout.readline() == "probing\n"

    def stop(self) -> list[float | None]:
        out, _ = self.process.communicate(timeout=30)
        latencies: list[float | None] = json.loads(out)
        return latencies


def p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def lag_counts(metrics: str) -> dict[str, float]:
    """The loop-lag histogram's count and cumulative buckets, by ``le``."""
    found: dict[str, float] = {}
    for line in metrics.splitlines():
        if line.startswith("promptsched_event_loop_lag_seconds_count"):
            found["count"] = float(line.split()[-1])
        match = re.match(r'promptsched_event_loop_lag_seconds_bucket\{le="([^"]+)"\} (\S+)', line)
        if match:
            found[match.group(1)] = float(match.group(2))
    return found


@pytest.fixture
async def smtp() -> AsyncIterator[FakeSMTP]:
    async with start_fake_smtp() as server:
        yield server


async def test_a_95_mb_answer_never_holds_the_loop(
    dsn: str,
    pool: asyncpg.Pool[Any],
    fake: fake_server.FakeOpenAI,
    smtp: FakeSMTP,
    sink: HttpSink,
    tmp_path: Path,
) -> None:
    text = answer()
    notify = {"email": ["ops@example.com"], "slack": {"url": sink.url}}
    sid = await factories.schedule(pool, prompt="Write the long report", notify=notify,
                                   max_attempts=1)  # fmt: skip
    await pool.execute("UPDATE schedules SET provider = $2 WHERE id = $1", sid, PROVIDER)
    token, _ = await auth.create_token(pool, owner="default")
    other, _ = await auth.create_token(pool, owner="mallory")
    # The completion written once, here: the server then only sends its bytes.
    completion = {
        "id": "chatcmpl-fake", "object": "chat.completion", "model": MODEL,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": dict(fake_server.DEFAULT_USAGE),
    }  # fmt: skip
    fake.script(fake_server.reply(json.dumps(completion)))
    env = {**provider_env(fake.base_url, timeout="60s"), **smtp.env(),
           "PROMPTSCHED_WEBHOOK_ALLOW": "127.0.0.1/32"}  # fmt: skip
    service = Service(dsn, tmp_path / "service.log", env=env)
    stack = contextlib.AsyncExitStack()
    probe: HealthProbe | None = None
    try:
        await service.ready()
        port = (await service.wait_event("api.listening"))["port"]
        base = f"http://127.0.0.1:{port}"
        jar = aiohttp.CookieJar(unsafe=True)  # a session cookie from 127.0.0.1
        http = await stack.enter_async_context(aiohttp.ClientSession(base, cookie_jar=jar))
        # What the loop-lag histogram held before the answer came (a start-up's own lag is
        # not this test's: the alert's increase() over the window is).
        before = lag_counts(await (await http.get("/metrics")).text())
        probe = HealthProbe(port)

        rid = await factories.pending_run(pool, sid, await pool.fetchval("SELECT now()"), "manual")
        await queries.run_notify_ready(pool, "test")

        async def sent() -> bool:
            row = await pool.fetchrow(
                "SELECT r.status, (SELECT count(*) FROM outbox o WHERE o.run_id = r.id "
                "AND o.status = 'sent') AS sent FROM runs r WHERE r.id = $1", rid,
            )  # fmt: skip
            assert row is not None and row["status"] not in ("dead", "cancelled"), row
            return bool(row["status"] == "succeeded" and row["sent"] == 2)

        await wait_until(sent, timeout=120, what=f"run {rid} succeeded and both messages sent")

        console = Console(cast(Any, http), pool)
        assert (await console.login(token)).status == 303
        page = await console.get(f"/runs/{rid}")
        assert page.status == 200
        size = len(page.text.encode())
        assert size < PAGE, size
        assert f'href="/runs/{rid}/output"' in page.text
        assert "Showing the first 49,9" in page.text and f"of {SIZE:,} characters" in page.text
        async with http.get(f"/runs/{rid}/output") as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
            by_session = await response.read()
        bearer = {"Authorization": f"Bearer {token}"}
        async with http.get(f"/v1/runs/{rid}/output", headers=bearer) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
            assert response.headers["Content-Length"] == str(SIZE)
            by_token = await response.read()
        mallory = {"Authorization": f"Bearer {other}"}
        async with http.get(f"/v1/runs/{rid}/output", headers=mallory) as response:
            assert response.status == 404  # another owner's run is not there for mallory
        latencies = probe.stop()
        after = lag_counts(await (await http.get("/metrics")).text())
    finally:
        if probe is not None and probe.process.poll() is None:
            probe.process.kill()
        await stack.aclose()
        assert service.stop() == 0

    answered = [latency for latency in latencies if latency is not None]
    lags = {le: after[le] - before.get(le, 0.0) for le in after}  # increase() over the window
    slowest = p99(answered)
    print(
        f"/healthz over {len(latencies)} probes: p99 {slowest * 1000:.0f} ms, max "
        f"{max(answered) * 1000:.0f} ms; loop-lag probes {lags['count']:.0f}, over 0.25 s "
        f"{lags['count'] - lags['0.25']:.0f}, over 1 s {lags['count'] - lags['1.0']:.0f}, "
        f"over 5 s {lags['count'] - lags['5.0']:.0f}; run page {size:,} bytes"
    )
    assert len(answered) == len(latencies) > 100, latencies  # every probe answered 200
    assert slowest < P99, (slowest, sorted(answered)[-10:])
    # PromptschedEventLoopStalled: increase(count) - increase(bucket{le="5.0"}) > 0.
    assert lags["count"] > 0 and lags["count"] - lags["5.0"] == 0, lags
    # And more: the service's own probe saw the loop held for a second at no time (before,
    # for 38 s; 1.6 s already for a 1 MB answer).
    assert lags["count"] - lags["1.0"] == 0, lags
    assert by_session.decode() == by_token.decode() == text

    # The messages went out, cut to what each channel shows, with the rest on the run's page.
    [mail] = smtp.received
    plain = mail.message.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    assert "more characters cut]" in plain and len(plain) < 200_000
    html = mail.message.get_body(("html",)).get_content()  # type: ignore[union-attr]
    assert "Clipped: the full output is on the run" in html
    [hook] = sink.requests
    slack = json.loads(hook.body)
    assert "clipped" in slack["blocks"][-1]["elements"][0]["text"]
