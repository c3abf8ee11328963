"""``promptsched doctor`` against real parts: the embedded Postgres (and a real PgBouncer in
transaction mode), a plain SMTP server (aiosmtpd), a real LiteLLM proxy, a web server that is
not promptsched. Each check says what it found and, when broken, what to set; the command
exits 1 when something a configured feature needs is broken and 0 on a healthy setup. Also: a
STARTTLS failure at delivery time is a configuration error naming PROMPTSCHED_SMTP_TLS."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator, Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import asyncpg
import pytest
from aiohttp import web

from promptsched import config as configuration
from promptsched.clock import FrozenClock
from promptsched.config import NotifierSettings
from promptsched.delivery.email import EmailSender, EmailSettings
from promptsched.executors.settings import parse_providers
from promptsched.metrics import Metrics
from promptsched.ops import doctor, fleet, probes
from promptsched.roles.notifier import Notifier
from promptsched.store.embedded import EmbeddedPostgres
from promptsched.web import auth
from tests import factories, litellm_support
from tests.fakes.smtp import FakeSMTP, start_fake_smtp
from tests.helpers import Service, free_port, run_cli
from tests.pgbouncer_support import PgBouncer
from tests.test_notifier import EPOCH, finished_run, notified_schedule

HOME = {"HOME": "/nonexistent"}
SERVICE = {
    "PROMPTSCHED_LEASE": "2s", "PROMPTSCHED_HEARTBEAT": "500ms", "PROMPTSCHED_DRAIN_GRACE": "1s",
    "PROMPTSCHED_RETRY_BASE": "100ms", "PROMPTSCHED_RETRY_MAX": "500ms",
}  # fmt: skip


async def _cli(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """``run_cli`` off the event loop, which serves the SMTP server meanwhile."""
    return await anyio.to_thread.run_sync(lambda: run_cli(*args, **kw))


def _config(env: Mapping[str, str]) -> configuration.Config:
    return configuration.load(env={**HOME, **env})


async def _doctor(dsn: str, env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Each check's verdict by name, for this environment."""
    config = _config(env)
    providers = parse_providers(config.env, config.providers_raw)
    published = fleet.describe(config, providers, roles=config.roles, slots=config.workers)
    found = await doctor.run(config, dsn, published)
    checks = {check["name"]: check for check in found["checks"]}
    assert found["ok"] is not any(c["status"] == "fail" for c in checks.values())
    return checks


@pytest.fixture
async def smtp() -> AsyncIterator[FakeSMTP]:
    async with start_fake_smtp() as server:
        yield server


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[litellm_support.LiteLLMProxy]:
    running = litellm_support.LiteLLMProxy(tmp_path_factory.mktemp("litellm"))
    try:
        yield running
    finally:
        running.stop()


def _provider_env(base_url: str, key: str) -> dict[str, str]:
    return {
        "PROMPTSCHED_PROVIDERS": "shop",
        "PROMPTSCHED_PROVIDER_SHOP_KIND": "openai",
        "PROMPTSCHED_PROVIDER_SHOP_BASE_URL": base_url,
        "PROMPTSCHED_PROVIDER_SHOP_API_KEY_ENV": "SHOP_KEY",
        "SHOP_KEY": key,
    }


# --- SMTP --------------------------------------------------------------------------------------


async def test_a_plain_smtp_server_with_the_default_tls_setting_says_what_to_set(
    dsn: str, smtp: FakeSMTP
) -> None:
    plain = {"PROMPTSCHED_SMTP_HOST": smtp.host, "PROMPTSCHED_SMTP_PORT": str(smtp.port)}
    check = (await _doctor(dsn, plain))["smtp"]
    assert check["status"] == "fail"
    assert "does not offer STARTTLS" in check["message"]
    assert check["fix"].startswith("set PROMPTSCHED_SMTP_TLS=none")
    fixed = (await _doctor(dsn, {**plain, "PROMPTSCHED_SMTP_TLS": "none"}))["smtp"]
    assert fixed["status"] == "ok" and "nothing was sent" in fixed["message"]
    implicit = {**plain, "PROMPTSCHED_SMTP_TLS": "tls"}
    wrong = (await _doctor(dsn, implicit))["smtp"]
    assert wrong["status"] == "fail" and "PROMPTSCHED_SMTP_TLS=starttls" in wrong["fix"]
    assert smtp.received == []  # the doctor never sends mail


@pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS")
async def test_a_refused_smtp_login_names_the_user_and_password_settings(dsn: str) -> None:
    async with start_fake_smtp(("promptsched", "right")) as server:
        env = {**server.env(), "PROMPTSCHED_SMTP_USERNAME": "promptsched",
               "PROMPTSCHED_SMTP_PASSWORD": "wrong-secret"}  # fmt: skip
        check = (await _doctor(dsn, env))["smtp"]
        assert check["status"] == "fail" and "535" in check["message"]
        assert (
            "PROMPTSCHED_SMTP_PASSWORD" in check["fix"] and "wrong-secret" not in check["message"]
        )
        env["PROMPTSCHED_SMTP_PASSWORD"] = "right"
        assert (await _doctor(dsn, env))["smtp"]["status"] == "ok"


async def test_emails_without_smtp_are_broken_and_no_emails_without_smtp_are_fine(
    dsn: str, pool: asyncpg.Pool[Any]
) -> None:
    assert (await _doctor(dsn, {}))["smtp"]["status"] == "skip"
    await notified_schedule(pool, email=["ops@example.com"])
    check = (await _doctor(dsn, {}))["smtp"]
    assert check["status"] == "fail" and "PROMPTSCHED_SMTP_HOST" in check["fix"]


async def test_a_starttls_failure_at_delivery_is_a_configuration_error_naming_the_setting(
    pool: asyncpg.Pool[Any], smtp: FakeSMTP
) -> None:
    """The notification goes dead at once (no retries for hours), its error saying what to set."""
    clock = FrozenClock(EPOCH)
    rid = await finished_run(pool, clock, email=["ops@example.com"])
    settings = EmailSettings(host=smtp.host, port=smtp.port, username=None, password=None,
                             tls="starttls", sender="p@example.test", timeout=5.0)  # fmt: skip
    notifier = Notifier(
        pool, clock, Metrics(), {"email": EmailSender(settings)},
        NotifierSettings(lease=timedelta(seconds=60), timeout=timedelta(seconds=5),
                         max_attempts=10),
    )  # fmt: skip
    assert (await notifier.run_once())["dead"] == 1
    row = await pool.fetchrow(
        "SELECT status, attempts, last_error FROM outbox WHERE run_id = $1", rid
    )
    assert row is not None and (row["status"], row["attempts"]) == ("dead", 1)
    assert "PROMPTSCHED_SMTP_TLS=none" in row["last_error"]


# --- providers ---------------------------------------------------------------------------------


async def test_a_providers_wrong_key_is_named_and_a_right_one_passes(
    dsn: str, proxy: litellm_support.LiteLLMProxy
) -> None:
    await proxy.ready()
    wrong = (await _doctor(dsn, _provider_env(proxy.base_url, "sk-wrong")))["provider shop"]
    assert wrong["status"] == "fail" and "401" in wrong["message"]
    assert "SHOP_KEY" in wrong["fix"] and "sk-wrong" not in json.dumps(wrong)
    right = (await _doctor(dsn, _provider_env(proxy.base_url, "sk-free")))["provider shop"]
    assert right["status"] == "ok" and "key accepted" in right["message"]
    skipped = {**_provider_env(proxy.base_url, "sk-wrong"), "PROMPTSCHED_PROVIDER_SHOP_PROBE": "no"}
    assert (await _doctor(dsn, skipped))["provider shop"]["status"] == "skip"
    down = await _doctor(dsn, _provider_env("http://127.0.0.1:9/v1", "sk-free"))
    assert down["provider shop"]["status"] == "fail"
    assert "PROMPTSCHED_PROVIDER_SHOP_BASE_URL" in down["provider shop"]["fix"]
    assert down["provider echo"]["status"] == "skip"


# --- the database, the clock, a pooler ----------------------------------------------------------


async def test_the_database_unreachable_or_behind_is_broken(
    dsn: str, pool: asyncpg.Pool[Any]
) -> None:
    ok = await _doctor(dsn, {})
    assert ok["database"]["status"] == "ok" and ok["statements"]["status"] == "ok"
    assert ok["pooler"]["status"] == "ok" and ok["clock"]["status"] == "ok"
    gone = await _doctor("postgresql://nobody@127.0.0.1:9/none", {})
    assert (
        gone["database"]["status"] == "fail"
        and "PROMPTSCHED_DATABASE_URL" in gone["database"]["fix"]
    )
    assert "pooler" not in gone  # nothing that reads the database runs without it
    await pool.execute("DELETE FROM promptsched_schema WHERE version = "
                       "(SELECT max(version) FROM promptsched_schema)")  # fmt: skip
    behind = (await _doctor(dsn, {}))["database"]
    assert behind["status"] == "fail" and "promptsched migrate" in behind["message"]


async def test_a_clock_far_from_postgres_is_a_warning(
    pool: asyncpg.Pool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = probes.time.time
    monkeypatch.setattr(probes.time, "time", lambda: real() + 30)
    async with pool.acquire() as conn:
        check = await probes.clock(conn)  # type: ignore[arg-type]
    assert check.status == "warn" and "ahead of Postgres's" in check.message and check.fix


async def test_through_a_transaction_pooler_the_direct_url_and_the_statement_cache_are_named(
    pg_server: EmbeddedPostgres, dsn: str
) -> None:
    bouncer = PgBouncer(pg_server)
    try:
        pooled = bouncer.dsn(urlsplit(dsn).path.lstrip("/"))
        found = await _doctor(pooled, {"PROMPTSCHED_DATABASE_URL": pooled})
        assert found["pooler"]["status"] == "fail"
        assert "PROMPTSCHED_DIRECT_DATABASE_URL" in found["pooler"]["fix"]
        assert found["statements"]["status"] == "fail"
        assert found["statements"]["fix"] == "set PROMPTSCHED_STATEMENT_CACHE_SIZE=0"
        fixed = await _doctor(pooled, {
            "PROMPTSCHED_DATABASE_URL": pooled, "PROMPTSCHED_DIRECT_DATABASE_URL": dsn,
            "PROMPTSCHED_STATEMENT_CACHE_SIZE": "0",
        })  # fmt: skip
        assert (fixed["pooler"]["status"], fixed["statements"]["status"]) == ("ok", "ok")
    finally:
        bouncer.stop()


# --- targets, the public URL, the fleet ----------------------------------------------------------


async def test_targets_in_use_are_checked_against_the_allowlist(
    dsn: str, pool: asyncpg.Pool[Any]
) -> None:
    assert (await _doctor(dsn, {}))["targets"]["status"] == "skip"
    hook, chat = await factories.schedule(pool), await factories.schedule(pool)
    secret_url = "https://127.0.0.1/services/T000/B000/very-secret-path"
    for sid, notify in ((hook, {"webhook": {"url": "http://10.20.30.40:8080/hook"}}),
                        (chat, {"slack": {"url": secret_url}})):  # fmt: skip
        await pool.execute("UPDATE schedules SET notify = $2 WHERE id = $1", sid, notify)
    refused = (await _doctor(dsn, {}))["targets"]
    assert refused["status"] == "fail" and "PROMPTSCHED_WEBHOOK_ALLOW" in refused["fix"]
    assert "10.20.30.40" in refused["message"] and "very-secret-path" not in refused["message"]
    allowed = {"PROMPTSCHED_WEBHOOK_ALLOW": "10.20.30.40,127.0.0.1"}
    assert (await _doctor(dsn, allowed))["targets"]["status"] == "ok"


@pytest.fixture
async def elsewhere() -> AsyncIterator[str]:
    """A web server that is not promptsched."""
    app = web.Application()

    async def teapot(request: web.Request) -> web.Response:
        return web.Response(text="I am a teapot")

    app.router.add_get("/healthz", teapot)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_a_public_url_that_is_not_promptsched_is_broken(dsn: str, elsewhere: str) -> None:
    assert (await _doctor(dsn, {}))["public_url"]["status"] == "skip"
    wrong = (await _doctor(dsn, {"PROMPTSCHED_PUBLIC_URL": elsewhere}))["public_url"]
    assert wrong["status"] == "fail" and "PROMPTSCHED_PUBLIC_URL" in wrong["fix"]
    down = (await _doctor(dsn, {"PROMPTSCHED_PUBLIC_URL": "http://127.0.0.1:9"}))["public_url"]
    assert down["status"] == "warn"


# --- real processes: exit statuses, a healthy setup, remote -------------------------------------


async def test_doctor_exits_0_on_a_healthy_setup_and_1_when_broken_directly_and_remotely(
    dsn: str, tmp_path: Path, smtp: FakeSMTP, proxy: litellm_support.LiteLLMProxy
) -> None:
    await proxy.ready()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    healthy = {
        **smtp.env(), **_provider_env(proxy.base_url, "sk-free"),
        "PROMPTSCHED_WEBHOOK_ALLOW": "127.0.0.1/32", "PROMPTSCHED_PUBLIC_URL": base,
    }  # fmt: skip
    listening = {**healthy, "PROMPTSCHED_HTTP_PORT": str(port)}
    service = Service(dsn, tmp_path / "service.log", env=listening)
    try:
        await service.ready()
        # This shell as the service: Service's own settings too (tests/helpers.py).
        env = {**healthy, **SERVICE}
        done = await _cli("doctor", dsn=dsn, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        lines = done.stdout.splitlines()
        assert lines[-1] == "nothing is broken"
        assert "FAIL" not in done.stdout, done.stdout
        for name in ("database", "clock", "statements", "pooler", "provider shop", "smtp",
                     "fleet"):  # fmt: skip
            assert any(line.startswith(f"ok    {name}:") for line in lines), (name, done.stdout)
        # this shell's own settings, apart: they only matter to commands run here
        for name in ("provider shop", "smtp", "public_url"):
            assert any(line.startswith(f"  ok    {name}:") for line in lines), (name, done.stdout)
        # this shell's SMTP broken, the service's fine: said, and the verdict is the service's
        starttls = {**env, "PROMPTSCHED_SMTP_TLS": "starttls"}
        shell = await _cli("doctor", "--json", dsn=dsn, env=starttls, cwd=tmp_path)
        assert shell.returncode == 0, shell.stdout
        found = json.loads(shell.stdout)
        verdicts = {c["name"]: c for c in [*found["checks"], *found["shell"]]}
        assert verdicts["smtp"]["status"] == "ok"
        assert verdicts["this shell: smtp"]["status"] == "warn"
        assert "STARTTLS" in verdicts["this shell: smtp"]["message"]
        assert verdicts["fleet"]["status"] == "warn"  # this shell now differs from the service
        # Remote: the replica checks its own configuration (an admin token).
        conn = await asyncpg.connect(dsn)
        try:
            token, _ = await auth.create_token(conn, owner="ops", admin=True)
        finally:
            await conn.close()
        remote = {"PROMPTSCHED_URL": base, "PROMPTSCHED_TOKEN": token}
        far = await _cli("doctor", "--json", env=remote, cwd=tmp_path)
        assert far.returncode == 0, far.stdout + far.stderr
        assert {c["name"] for c in json.loads(far.stdout)["checks"]} >= {"smtp", "provider shop"}
    finally:
        service.stop()


# --- direct mode with replicas running ---------------------------------------------------------


async def test_direct_doctor_judges_the_service_by_its_replicas_and_this_shell_apart(
    dsn: str, pool: asyncpg.Pool[Any]
) -> None:
    """README's second terminal has no SMTP variables while the running service mails: doctor
    says the service can mail (what its replicas publish), its providers, and reports this
    shell's settings apart, outside the verdict; with replicas that cannot mail, it is broken
    whatever this shell has."""
    from promptsched.clock import Clock
    from tests.test_fleet import BASE_ENV, _presence, _published

    await notified_schedule(pool, email=["ops@example.com"])
    mailing = _presence(pool, Clock(), "mailing", _published(BASE_ENV))
    await mailing.run_once()
    done = await _cli("doctor", dsn=dsn, env=HOME)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("ok    smtp: a running replica") for line in lines), done.stdout
    assert any(line.startswith("ok    provider shopcheck: the running replicas have it")
               for line in lines), done.stdout  # fmt: skip
    assert "this shell's own settings (they only matter to commands run here):" in done.stdout
    assert "  skip  smtp: not configured" in done.stdout
    assert lines[-1] == "nothing is broken"
    data = json.loads((await _cli("doctor", "--json", dsn=dsn, env=HOME)).stdout)
    assert data["ok"] is True and data["judged_by"] == "the 1 running replica(s)"
    assert {c["name"] for c in data["shell"]} >= {"this shell: smtp", "this shell: public_url"}

    # The replicas cannot mail: broken, exit 1, although nothing about this shell changed
    await pool.execute("DELETE FROM replicas")
    silent = {k: v for k, v in BASE_ENV.items() if not k.startswith("PROMPTSCHED_SMTP")}
    await _presence(pool, Clock(), "silent", _published(silent)).run_once()
    broken = await _cli("doctor", dsn=dsn, env=HOME)
    assert broken.returncode == 1, broken.stdout
    assert "FAIL  smtp: 1 schedule(s) or follow-up escalation(s) email, but no running replica" in (
        broken.stdout
    )
    assert broken.stdout.splitlines()[-1] == "broken: smtp"
