"""The ``webhook`` provider behind the address guard (``PROMPTSCHED_WEBHOOK_ALLOW``): refused at
startup for a literal address or local name the allowlist refuses, refused after DNS at each
request (the run goes ``dead`` with the rule's message and the receiver gets nothing), let
through by the allowlist; cloud metadata only when listed exactly. The ``openai`` provider
stays unguarded."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from promptsched import config as configuration
from promptsched import netguard
from promptsched.clock import FrozenClock
from promptsched.config import WorkerSettings
from promptsched.errors import ConfigError, PermanentError
from promptsched.executors import openai, webhook_provider
from promptsched.executors.base import Registry
from promptsched.executors.limiter import Limiter
from promptsched.executors.providers import build_registry
from promptsched.executors.settings import parse_providers
from promptsched.metrics import Metrics
from promptsched.roles.worker import WorkerPool
from promptsched.roles.worker.heartbeat import Heartbeat
from tests import factories
from tests.factories import EPOCH
from tests.fakes.http_sink import HttpSink
from tests.helpers import Service, wait_until
from tests.test_executors_webhook import make_request, make_settings

NAME = "provider.example.test"  # resolves (in these tests) to wherever DNS is told
BASE_URL_VAR = "PROMPTSCHED_PROVIDER_HOOK_BASE_URL"


def _allow(text: str) -> netguard.Allowlist:
    return configuration.load(env={netguard.WEBHOOK_ALLOW: text}).webhook_allow


def hook_env(base_url: str) -> dict[str, str]:
    return {
        "PROMPTSCHED_PROVIDERS": "hook",
        "PROMPTSCHED_PROVIDER_HOOK_KIND": "webhook",
        BASE_URL_VAR: base_url,
        "PROMPTSCHED_PROVIDER_HOOK_TIMEOUT": "10s",
    }


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """``NAME`` resolves to the address stored under it (a name that passed every check
    without I/O and whose DNS answer is what counts)."""
    answers: dict[str, str] = {}

    async def fake_dns(host: str, port: int, **kwargs: Any) -> list[Any]:
        assert host == NAME
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[host], port))]

    monkeypatch.setattr(netguard.anyio, "getaddrinfo", fake_dns)
    yield answers


def _port(sink: HttpSink) -> str:
    return sink.base_url.rsplit(":", 1)[1]


# -- at startup ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "allow", "message"),
    [
        (
            "http://127.0.0.1:9/hook",
            "",
            "127.0.0.1 is loopback and not in PROMPTSCHED_WEBHOOK_ALLOW",
        ),
        (
            "http://[::1]:9/hook",
            "127.0.0.1/32",
            "::1 is loopback and not in PROMPTSCHED_WEBHOOK_ALLOW",
        ),
        (
            "http://localhost:9/hook",
            "",
            "localhost is a loopback name and not in PROMPTSCHED_WEBHOOK_ALLOW",
        ),
        (
            "http://10.1.2.3/hook",
            "192.168.0.0/16",
            "10.1.2.3 is private and not in PROMPTSCHED_WEBHOOK_ALLOW",
        ),
        (
            "http://169.254.169.254/latest/meta-data/",
            "0.0.0.0/0",
            "169.254.169.254 is a cloud metadata address, which only an exact entry allows: "
            "PROMPTSCHED_WEBHOOK_ALLOW covers it only with the wider range 0.0.0.0/0; "
            "list 169.254.169.254/32 itself to allow it",
        ),
    ],
    ids=["loopback", "v6-loopback", "localhost", "private", "metadata-under-0.0.0.0/0"],
)
def test_a_webhook_provider_the_allowlist_refuses_stops_startup(
    url: str, allow: str, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        build_registry(parse_providers(hook_env(url)), webhook_allow=_allow(allow))
    assert caught.value.field == BASE_URL_VAR
    assert caught.value.message.startswith(message)
    assert "PROMPTSCHED_WEBHOOK_ALLOW" in caught.value.message


def test_the_startup_error_names_the_toml_key_when_base_url_came_from_the_file() -> None:
    toml = {"hook": {"kind": "webhook", "base_url": "http://127.0.0.1:9/hook"}}
    with pytest.raises(ConfigError) as caught:
        build_registry(parse_providers({}, toml))
    assert caught.value.field == "providers.hook.base_url"


async def test_listed_addresses_public_names_and_openai_providers_build() -> None:
    env = {
        **hook_env("http://127.0.0.1:9/hook"),
        "PROMPTSCHED_PROVIDERS": "hook,public,meta,local",
        "PROMPTSCHED_PROVIDER_PUBLIC_KIND": "webhook",
        "PROMPTSCHED_PROVIDER_PUBLIC_BASE_URL": "https://hooks.example.com/llm",
        "PROMPTSCHED_PROVIDER_META_KIND": "webhook",
        "PROMPTSCHED_PROVIDER_META_BASE_URL": "http://169.254.169.254/x",
        # An operator's local model server: the openai provider is not guarded.
        "PROMPTSCHED_PROVIDER_LOCAL_KIND": "openai",
        "PROMPTSCHED_PROVIDER_LOCAL_BASE_URL": "http://localhost:11434/v1",
    }
    registry, _ = build_registry(
        parse_providers(env), webhook_allow=_allow("127.0.0.1/32,169.254.169.254")
    )
    try:
        assert isinstance(registry.get("hook"), webhook_provider.WebhookExecutor)
        assert isinstance(registry.get("public"), webhook_provider.WebhookExecutor)
        assert isinstance(registry.get("local"), openai.OpenAIExecutor)
    finally:
        await registry.aclose()
    with pytest.raises(ConfigError) as caught:  # without the exact metadata entry
        build_registry(parse_providers(env), webhook_allow=_allow("127.0.0.1/32"))
    assert caught.value.field == "PROMPTSCHED_PROVIDER_META_BASE_URL"


def _cli(dsn: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTSCHED_")}
    return subprocess.run(
        [sys.executable, "-m", "promptsched", "run"],
        env={**clean, "PROMPTSCHED_DATABASE_URL": dsn, "PROMPTSCHED_HTTP_PORT": "0", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_run_refuses_to_start_with_a_loopback_webhook_provider_not_allowed(dsn: str) -> None:
    started = _cli(dsn, **hook_env("http://127.0.0.1:9/hook"))
    assert started.returncode == 2, started.stderr
    assert (
        f"{BASE_URL_VAR}: 127.0.0.1 is loopback and not in PROMPTSCHED_WEBHOOK_ALLOW"
    ) in started.stderr
    assert "Traceback" not in started.stderr


# -- at each request -----------------------------------------------------------------------


async def test_the_executor_checks_a_literal_address_before_each_request(sink: HttpSink) -> None:
    # built without the startup check
    executor = webhook_provider.WebhookExecutor(make_settings(sink.url))
    try:
        with pytest.raises(PermanentError) as caught:
            await executor.execute(make_request())
    finally:
        await executor.aclose()
    assert caught.value.message == (
        "hook: 127.0.0.1 is loopback and not in PROMPTSCHED_WEBHOOK_ALLOW"
    )
    assert sink.requests == []


@pytest.mark.parametrize(
    ("allow", "rule"),
    [
        ("0.0.0.0/0", "which only an exact entry allows: PROMPTSCHED_WEBHOOK_ALLOW covers it "
         "only with the wider range 0.0.0.0/0"),
        ("169.254.0.0/16", "covers it only with the wider range 169.254.0.0/16"),
        ("", "list it exactly (169.254.169.254/32) in PROMPTSCHED_WEBHOOK_ALLOW"),
    ],
)  # fmt: skip
async def test_a_name_resolving_to_metadata_is_refused_under_any_wide_range(
    dns: dict[str, str], allow: str, rule: str
) -> None:
    dns[NAME] = "169.254.169.254"
    url = f"http://{NAME}/latest/meta-data/"
    registry, _ = build_registry(parse_providers(hook_env(url)), webhook_allow=_allow(allow))
    try:
        with pytest.raises(PermanentError) as caught:
            await registry.get("hook").execute(make_request())
    finally:
        await registry.aclose()
    message = caught.value.message
    assert message.startswith(
        f"hook: 169.254.169.254 ({NAME} resolves to it) is a cloud metadata address"
    )
    assert rule in message


@asynccontextmanager
async def hook_workers(
    pool: asyncpg.Pool[Any], base_url: str, allow: netguard.Allowlist
) -> AsyncIterator[WorkerPool]:
    registry, limiters = build_registry(parse_providers(hook_env(base_url)), webhook_allow=allow)
    try:
        yield _workers(pool, registry, limiters)
    finally:
        await registry.aclose()


def _workers(
    pool: asyncpg.Pool[Any], registry: Registry, limiters: dict[str, Limiter]
) -> WorkerPool:
    clock, metrics = FrozenClock(EPOCH), Metrics()
    heartbeat = Heartbeat(pool, clock, metrics, lease=timedelta(seconds=30),
                          interval=timedelta(seconds=10))  # fmt: skip
    return WorkerPool(pool, clock, metrics, registry, limiters, heartbeat, WorkerSettings(slots=1,
                      worker_id="w", retry_base=timedelta(milliseconds=1),
                      retry_max=timedelta(milliseconds=1)))  # fmt: skip


async def _hook_run(pool: asyncpg.Pool[Any]) -> int:
    sid = await factories.schedule(pool, max_attempts=3)
    await pool.execute("UPDATE schedules SET provider = 'hook' WHERE id = $1", sid)
    return await factories.pending_run(pool, sid)


async def _status(pool: asyncpg.Pool[Any], rid: int) -> asyncpg.Record:
    row = await pool.fetchrow("SELECT status, attempts, error, output FROM runs WHERE id = $1", rid)
    assert row is not None
    return row


async def test_a_run_is_dead_when_dns_gives_loopback_and_succeeds_once_it_is_allowed(
    pool: asyncpg.Pool[Any], sink: HttpSink, dns: dict[str, str]
) -> None:
    dns[NAME] = "127.0.0.1"
    url = f"http://{NAME}:{_port(sink)}/hook"
    refused = await _hook_run(pool)
    async with hook_workers(pool, url, netguard.NO_WEBHOOK_ALLOW) as workers:
        assert await workers.run_once() == 1
    run = await _status(pool, refused)
    assert (run["status"], run["attempts"]) == ("dead", 1)  # permanent: never retried
    assert run["error"] == (
        f"hook: 127.0.0.1 ({NAME} resolves to it) is loopback and not in PROMPTSCHED_WEBHOOK_ALLOW"
    )
    assert sink.requests == []  # the receiver got nothing

    allowed = await _hook_run(pool)
    async with hook_workers(pool, url, _allow("127.0.0.1/32")) as workers:
        assert await workers.run_once() == 1
    run = await _status(pool, allowed)
    assert (run["status"], run["output"]) == ("succeeded", "ok")
    assert [request.json()["run_id"] for request in sink.requests] == [allowed]
    assert sink.requests[0].headers["Host"] == f"{NAME}:{_port(sink)}"


async def test_a_literal_loopback_provider_runs_with_the_allowlist(
    pool: asyncpg.Pool[Any], sink: HttpSink
) -> None:
    rid = await _hook_run(pool)
    async with hook_workers(pool, sink.url, _allow("127.0.0.1/32")) as workers:
        assert await workers.run_once() == 1
    assert (await _status(pool, rid))["status"] == "succeeded"
    assert [request.json()["run_id"] for request in sink.requests] == [rid]


@pytest.mark.slow
async def test_a_service_reaches_a_loopback_webhook_provider_through_the_allowlist(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path, sink: HttpSink
) -> None:
    rid = await _hook_run(pool)
    process = Service(
        dsn,
        tmp_path / "service.log",
        env={**hook_env(sink.url), netguard.WEBHOOK_ALLOW: "127.0.0.1/32"},
    )
    try:
        await process.ready()

        async def finished() -> bool:
            status = await pool.fetchval("SELECT status FROM runs WHERE id = $1", rid)
            return status in ("succeeded", "dead")

        await wait_until(finished, timeout=30, what="the webhook provider's run")
    finally:
        process.stop()
    assert (await _status(pool, rid))["status"] == "succeeded"
    assert [request.json()["run_id"] for request in sink.requests] == [rid]
