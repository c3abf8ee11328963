"""The fleet's one truth with real processes: a service started with a custom provider and a
webhook allowlist; the CLI in direct mode, from another directory and with none of those
variables, accepts both because it checks against what the running replica published (and,
with no replica up, says it fell back to its own environment); a second replica started with
another limit makes ``status`` report drift and the drift gauge move; ``status`` as text and
JSON, directly and through the API, compared with golden files."""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from promptsched.store import pool as pools
from promptsched.web import auth
from tests import factories
from tests.helpers import Service, run_cli, wait_until

GOLDEN = Path(__file__).resolve().parent / "golden"
FLEET_ENV = {
    "PROMPTSCHED_PROVIDERS": "shopcheck",
    "PROMPTSCHED_PROVIDER_SHOPCHECK_KIND": "openai",
    "PROMPTSCHED_PROVIDER_SHOPCHECK_BASE_URL": "http://127.0.0.1:9/v1",
    "PROMPTSCHED_PROVIDER_SHOPCHECK_MAX_CONCURRENCY": "2",
    "PROMPTSCHED_WEBHOOK_ALLOW": "127.0.0.1/32",
    "PROMPTSCHED_FLEET_INTERVAL": "300ms",
    "PROMPTSCHED_WORKERS": "2",
}
ADD = ("schedules", "add", "--name", "shop", "--every", "1h", "--prompt", "check the shop",
       "--provider", "shopcheck", "--webhook", "http://127.0.0.1:9/hook", "--json")  # fmt: skip


@asynccontextmanager
async def _service(dsn: str, log: Path, env: dict[str, str]) -> AsyncIterator[Service]:
    service = Service(dsn, log, env=env)
    try:
        await service.ready()
        yield service
    finally:
        service.stop()


async def _metric(service: Service, name: str) -> float | None:
    port = service.has_event("api.listening")["port"]  # type: ignore[index]
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/metrics") as reply:
            text = await reply.text()
    found = re.search(rf"^promptsched_{name} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


def _status(dsn: str, cwd: Path) -> dict[str, Any]:
    result = run_cli("status", "--json", dsn=dsn, cwd=cwd)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


async def test_the_cli_checks_against_the_running_fleet_and_status_reports_drift(
    dsn: str, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # No replica yet: the CLI checks against its own environment, and says so.
    alone = run_cli(*ADD, dsn=dsn, cwd=elsewhere)
    assert alone.returncode == 2, alone.stdout
    assert "no replica is running" in alone.stderr and "shopcheck" in alone.stderr
    async with _service(dsn, tmp_path / "a.log", FLEET_ENV) as first:
        added = run_cli(*ADD, dsn=dsn, cwd=elsewhere)
        assert added.returncode == 0, added.stderr
        assert "note:" not in added.stderr
        assert "warning" not in added.stderr
        # No replica can send mail (none has SMTP): the CLI warns, and still saves.
        mail = run_cli(*ADD[:3], "mailed", *ADD[4:], "--email", "ops@example.com", dsn=dsn,
                       cwd=elsewhere)  # fmt: skip
        assert mail.returncode == 0, mail.stderr
        assert "promptsched: warning: email: no running replica can send mail" in mail.stderr
        assert "PROMPTSCHED_SMTP_HOST" in mail.stderr and json.loads(mail.stdout)["warnings"]
        created = json.loads(added.stdout)
        assert created["provider"] == "shopcheck"
        assert created["notify"]["webhook"]["url"] == "http://127.0.0.1:9/hook"
        agreed = _status(dsn, elsewhere)
        assert agreed["fleet"] | {"versions": None} == {
            "replicas": 1, "fingerprints": 1, "drift": False, "versions": None,
            "fingerprint": agreed["replicas"][0]["fingerprint"],
        }  # fmt: skip
        assert await _metric(first, "config_drift") == 0
        other = {**FLEET_ENV, "PROMPTSCHED_PROVIDER_SHOPCHECK_MAX_CONCURRENCY": "3"}
        async with _service(dsn, tmp_path / "b.log", other) as second:
            drifted = _status(dsn, elsewhere)
            assert drifted["fleet"]["drift"] is True and drifted["fleet"]["fingerprints"] == 2
            newest = drifted["replicas"][0]  # newest first: the second replica
            assert re.fullmatch(rf"{_host(second)}:{second.pid}/[0-9a-f]{{8}}", newest["id"])
            # One against one: the newest replica's configuration is the fleet's (a rolling
            # change starts with the new one), and the other replica differs from it.
            assert newest["drift"] is False and newest["differs"] == []
            oldest = drifted["replicas"][1]
            assert oldest["drift"] is True
            assert oldest["differs"] == ["providers.shopcheck.limits.max_concurrency: 2 (fleet: 3)"]
            await wait_until(
                lambda: _equals(_metric(first, "config_drift"), 1.0), timeout=10,
                what="the first replica's drift gauge",
            )  # fmt: skip
            assert await _metric(first, "config_fingerprints") == 2
            assert await _metric(first, "replicas") == 2
            # The console says it too: the status page (admins) and the schedules page.
            page = await _console(dsn, first, "/status", admin=True)
            assert 'id="fleet-headline">Fleet: 2 replicas alive' in page
            assert "configuration DRIFT" in page and "st-DRIFT" in page
            assert "providers.shopcheck.limits.max_concurrency: 2 (fleet: 3)" in page
            assert 'id="drift"' in await _console(dsn, first, "/", admin=True)
            assert "Admins only" in await _console(dsn, first, "/status", admin=False)
        await wait_until(
            lambda: _equals(_metric(first, "config_drift"), 0.0), timeout=10,
            what="the drift gauge back at 0 after the second replica stopped",
        )  # fmt: skip
        after = _status(dsn, elsewhere)
        assert after["fleet"]["drift"] is False
        assert [r["alive"] for r in after["replicas"]] == [False, True]


async def _console(dsn: str, service: Service, path: str, *, admin: bool) -> str:
    """A console page as a fresh session of a new token sees it."""
    pool = await pools.create_pool(dsn, max_size=1)
    try:
        token, _ = await auth.create_token(pool, owner="ops", admin=admin)
    finally:
        await pool.close()
    base = f"http://127.0.0.1:{service.has_event('api.listening')['port']}"  # type: ignore[index]
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        async with browser.get(f"{base}/login") as form:
            csrf = re.search(r'name="csrf" value="([^"]+)"', await form.text())
        assert csrf is not None
        login = {"token": token, "csrf": csrf.group(1)}
        async with browser.post(f"{base}/login", data=login, allow_redirects=False) as done:
            assert done.status == 303
        async with browser.get(f"{base}{path}", allow_redirects=False) as page:
            return await page.text()


def _host(service: Service) -> str:
    """Its worker id but the pid: the host and the random part."""
    return str(service.has_event("supervisor.ready")["worker_id"]).rsplit(":", 1)[0]  # type: ignore[index]


async def _equals(value: Any, expected: float) -> bool:
    return bool(await value == expected)


# --- golden output ---------------------------------------------------------------------------

_VOLATILE: list[tuple[str, str]] = [
    (r"[\w.-]+:[0-9a-f]{6}:\d+/[0-9a-f]{8}", "<replica>"),
    (r"\b[0-9a-f]{16}\b", "<fingerprint>"),
    (r"\d{4}-\d\d-\d\dT[\d:.]+\+00:00", "<time>"),
    (r"\b\d+ (?:ms|s|min|h|d)(?: \d+ (?:ms|s|min|h|d))?(?: ago)?\b", "<duration>"),
    (r" {2,}", "  "),
]


def _normalized(text: str) -> str:
    for pattern, replacement in _VOLATILE:
        text = re.sub(pattern, replacement, text)
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


def _normalized_json(data: Any) -> Any:
    """The document with each volatile value named instead (numbers of seconds, times, ids)."""
    if isinstance(data, dict):
        return {
            key: "<volatile>"
            if key in ("uptime_seconds", "seen_seconds_ago", "now", "started_at", "seen_at", "host")
            else _normalized_json(value)
            for key, value in data.items()
        }
    if isinstance(data, list):
        return [_normalized_json(item) for item in data]
    if isinstance(data, str):
        return _normalized(data).rstrip("\n")
    return data


def _golden(name: str, actual: str) -> None:
    """``UPDATE_GOLDEN=1`` rewrites the file (review the diff before committing it)."""
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(actual)
    assert actual == path.read_text(), f"{name} differs from tests/golden/{name}"


async def test_status_as_text_and_json_directly_and_through_the_api(
    dsn: str, tmp_path: Path
) -> None:
    async with _service(dsn, tmp_path / "a.log", FLEET_ENV) as service:
        pool = await pools.create_pool(dsn, max_size=2)
        try:
            token, _ = await auth.create_token(pool, owner="ops", admin=True)
            plain, _ = await auth.create_token(pool, owner="alice")
            await _later_run(pool)
        finally:
            await pool.close()
        port = service.has_event("api.listening")["port"]  # type: ignore[index]
        remote = {"PROMPTSCHED_URL": f"http://127.0.0.1:{port}", "PROMPTSCHED_TOKEN": token}
        outputs: dict[str, Callable[[], Any]] = {}
        for mode, env in (("direct", {}), ("remote", remote)):
            text = run_cli("status", dsn=dsn, env=env, cwd=tmp_path)
            assert text.returncode == 0, text.stderr
            _golden("status.txt", _normalized(text.stdout))
            raw = run_cli("status", "--json", dsn=dsn, env=env, cwd=tmp_path)
            assert raw.returncode == 0, raw.stderr
            data = json.loads(raw.stdout)
            _golden("status.json", json.dumps(_normalized_json(data), indent=2) + "\n")
            outputs[mode] = data
        assert outputs["direct"]["fleet"] == outputs["remote"]["fleet"]
        refused = run_cli("status", env={**remote, "PROMPTSCHED_TOKEN": plain}, cwd=tmp_path)
        assert refused.returncode != 0 and "admin" in refused.stderr


async def _later_run(pool: asyncpg.Pool[Any]) -> None:
    """One run due in 2100, so the queue line has something to count."""
    sid = await factories.schedule(pool)
    await factories.pending_run(pool, sid, slot=datetime(2100, 1, 1, tzinfo=UTC))
