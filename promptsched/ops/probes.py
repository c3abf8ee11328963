"""The checks ``promptsched doctor`` runs, one function each: what it found, in one line, and
what to set when it is broken. Each check is bounded in time and sends nothing anyone
receives: no email, no prompt, no notification."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import anyio
import asyncpg

from promptsched import netguard
from promptsched.clock import Clock
from promptsched.config import Config
from promptsched.delivery import DeliveryError
from promptsched.delivery import email as smtp
from promptsched.errors import SchemaMismatch
from promptsched.executors import probe as provider_probe
from promptsched.executors.settings import ENV_PREFIX, ProviderSettings
from promptsched.ops import fleet
from promptsched.store import listen, migrate, queries
from promptsched.store import pool as pools

TIMEOUT = 10.0  # seconds, per check
MAX_TARGETS = 5000  # notify URLs read from the database
MAX_HOSTS = 200  # distinct hosts resolved
CLOCK_SKEW = 1.0  # seconds this host's clock may differ from Postgres's before a warning


@dataclass(frozen=True, slots=True)
class Check:
    """``status``: ok, warn (works, but look), fail (a configured feature is broken), skip."""

    name: str
    status: str
    message: str
    fix: str | None = None

    def json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "message": self.message,
                "fix": self.fix}  # fmt: skip


def _var(provider: str, suffix: str) -> str:
    return f"{ENV_PREFIX}{provider.upper().replace('-', '_')}_{suffix}"


async def database(conn: asyncpg.Connection[Any]) -> Check:
    version = conn.get_server_version()
    server = f"PostgreSQL {version.major}.{version.minor}"
    try:
        await migrate.check(conn)
    except SchemaMismatch as exc:
        return Check("database", "fail", f"reachable ({server}), but {exc}", "see the message")
    return Check(
        "database", "ok", f"reachable ({server}), schema at version {migrate.latest_version()}"
    )


async def clock(conn: asyncpg.Connection[Any]) -> Check:
    """This host's wall clock against Postgres's, measured at the middle of a round trip."""
    before = time.time()
    now = await queries.clock_now(conn, None)
    after = time.time()
    skew = (before + after) / 2 - now.timestamp()
    words = f"{abs(skew):.2f}s {'ahead of' if skew > 0 else 'behind'} Postgres's"
    if abs(skew) <= CLOCK_SKEW:
        return Check("clock", "ok", f"this host's clock is {words}")
    return Check(
        "clock", "warn",
        f"this host's clock is {words}: promptsched decides by Postgres's clock alone, but the "
        "times this host shows and logs are off by that much",
        "synchronise this host's clock (NTP, chrony, systemd-timesyncd)",
    )  # fmt: skip


async def listening(config: Config, dsn: str, pool: asyncpg.Pool[Any]) -> Check:
    """Wake-ups: a NOTIFY sent through the main URL must reach a LISTEN on the direct one."""
    direct = config.database.direct_url
    name = "PROMPTSCHED_DIRECT_DATABASE_URL" if direct else "PROMPTSCHED_DATABASE_URL"
    try:
        with anyio.fail_after(TIMEOUT):
            heard = await listen.round_trip(direct or dsn, pool)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        return Check("pooler", "fail", f"cannot LISTEN through {name}: {exc}",
                     f"check {name}")  # fmt: skip
    if heard:
        how = "a session connection" if direct else "the database URL (no pooler in between)"
        return Check("pooler", "ok", f"wake-ups arrive: LISTEN through {name}, {how}")
    if direct:
        return Check(
            "pooler", "fail",
            "a NOTIFY sent through PROMPTSCHED_DATABASE_URL does not reach a LISTEN through "
            "PROMPTSCHED_DIRECT_DATABASE_URL: runs start only when the roles poll",
            "point PROMPTSCHED_DIRECT_DATABASE_URL at the same database, as a session "
            "connection (Postgres itself, or a pooler in session mode)",
        )  # fmt: skip
    return Check(
        "pooler", "fail",
        "LISTEN does not hear NOTIFY through PROMPTSCHED_DATABASE_URL: it goes through a "
        "transaction pooler, and runs start only when the roles poll",
        "set PROMPTSCHED_DIRECT_DATABASE_URL to a session connection to the same database",
    )  # fmt: skip


async def statements(pool: asyncpg.Pool[Any], cache_size: int) -> Check:
    """Whether the pooled URL goes through a transaction pooler (one client connection meets
    two server sessions), and whether prepared statements survive it: PgBouncer before 1.21
    (or without max_prepared_statements) loses them."""
    try:
        with anyio.fail_after(TIMEOUT):
            pooled = await _moves(pool)
    except (asyncpg.InvalidSQLStatementNameError, asyncpg.DuplicatePreparedStatementError) as exc:
        return Check(
            "statements", "fail",
            "prepared statements fail through PROMPTSCHED_DATABASE_URL: a transaction pooler "
            f"without prepared-statement support is in between ({str(exc).splitlines()[0]})",
            "set PROMPTSCHED_STATEMENT_CACHE_SIZE=0",
        )  # fmt: skip
    cached = f"statement cache {cache_size}" if cache_size else "no statement cache"
    if pooled:
        return Check("statements", "ok", f"a transaction pooler is in between, and prepared "
                                         f"statements work ({cached})")  # fmt: skip
    return Check("statements", "ok", f"no transaction pooler in between ({cached})")


async def _moves(pool: asyncpg.Pool[Any]) -> bool:
    """Whether a client connection's second transaction runs in another server session than
    its first, forced by holding the first's session busy from another client connection. The
    statement prepared in the first then runs in the second, as the pool's statements do."""
    async with pool.acquire() as first, pool.acquire() as other:
        async with first.transaction():
            before = await queries.backend_pid(first)
            await queries.clock_now(first, None)
        async with other.transaction():
            await queries.backend_pid(other)  # takes the session `first` just left, if pooled
            async with first.transaction():
                after = await queries.backend_pid(first)
                await queries.clock_now(first, None)
    return before != after


def _provider_fix(provider: ProviderSettings, found: provider_probe.Probed) -> str:
    skip = f"; {_var(provider.name, 'PROBE')}=false skips this check"
    if found.status in (401, 403) or found.key_refused:
        if provider.api_key_env is None:
            return f"set {_var(provider.name, 'API_KEY_ENV')} to the variable holding its key"
        return f"put a key the provider accepts in {provider.api_key_env}{skip}"
    if found.status == 404:
        return f"check {_var(provider.name, 'BASE_URL')} (its /models is not there){skip}"
    return f"check {_var(provider.name, 'BASE_URL')} and that the provider is up{skip}"


async def providers(
    settings: Mapping[str, ProviderSettings], allow: netguard.Allowlist
) -> list[Check]:
    results: dict[str, Check] = {}

    async def one(provider: ProviderSettings) -> None:
        found = await provider_probe.probe(provider, allow)
        name = f"provider {provider.name}"
        if found.ok is None:
            results[provider.name] = Check(name, "skip", found.message)
        elif found.ok:
            results[provider.name] = Check(name, "ok", found.message)
        else:
            fix = _provider_fix(provider, found)
            results[provider.name] = Check(name, "fail", found.message, fix)

    async with anyio.create_task_group() as tg:
        for provider in settings.values():
            tg.start_soon(one, provider)
    return [results[name] for name in sorted(results)]


async def email(config: Config, db: queries.DB | None) -> Check:
    """SMTP as a send would meet it (TLS, login), sending nothing; without SMTP, whether any
    schedule emails (then it is broken; ``db`` None: not known)."""
    if not config.smtp_host:
        if db is None:
            return Check("smtp", "skip", "not configured")
        emailing = await queries.notify_email_count(db)
        if not emailing:
            return Check("smtp", "skip", "not configured, and no schedule emails anyone")
        return Check(
            "smtp", "fail",
            f"{emailing} schedule(s) or follow-up escalation(s) email, but SMTP is not configured",
            "set PROMPTSCHED_SMTP_HOST (and PROMPTSCHED_SMTP_TLS, _PORT, _USERNAME, _PASSWORD)",
        )  # fmt: skip
    settings = smtp.EmailSettings.from_config(config)
    bounded = smtp.EmailSettings(**{**_fields(settings), "timeout": min(settings.timeout, TIMEOUT)})
    try:
        return Check("smtp", "ok", await smtp.check_server(bounded))
    except DeliveryError as exc:
        return Check("smtp", "fail", exc.message, exc.fix or "see the message")


async def fleet_email(db: queries.DB, can_email: bool) -> Check:
    """Mail as the running replicas can send it (what they publish; nothing is sent)."""
    if can_email:
        return Check("smtp", "ok", "a running replica with the notifier role has SMTP configured")
    emailing = await queries.notify_email_count(db)
    if not emailing:
        return Check("smtp", "skip", "no running replica sends mail, and no schedule emails anyone")
    return Check(
        "smtp", "fail",
        f"{emailing} schedule(s) or follow-up escalation(s) email, but no running replica with "
        "the notifier role has SMTP configured",
        "set PROMPTSCHED_SMTP_HOST (and PROMPTSCHED_SMTP_TLS, _PORT, _USERNAME, _PASSWORD) on "
        "the replicas and restart them",
    )  # fmt: skip


def fleet_providers(document: Mapping[str, Any]) -> list[Check]:
    """The providers the running replicas publish (probing them needs their keys: `doctor`
    through the API probes them from a replica)."""
    found = ((document.get("shared") or {}).get("providers")) or {}
    return [
        Check(f"provider {name}", "ok",
              f"the running replicas have it ({p.get('kind')}"
              + (f", {p['base_url']}" if p.get("base_url") else "")
              + (", a key configured)" if p.get("key") else ")"))
        for name, p in sorted(found.items())
    ]  # fmt: skip


def _fields(settings: smtp.EmailSettings) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in smtp.EmailSettings.__dataclass_fields__}


def _host_port(url: str) -> tuple[str, int] | None:
    parts = urlsplit(url)
    if not parts.hostname:
        return None
    try:
        return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None


async def targets(db: queries.DB, allow: netguard.Allowlist) -> Check:
    """Every webhook and chat URL in use against the address guard, as a send would resolve it
    (a chat URL is a credential: only its host is named)."""
    rows = await queries.notify_url_targets(db, MAX_TARGETS)
    users: dict[tuple[str, int], list[str]] = {}
    for row in rows:
        where = _host_port(row["url"])
        if where is not None:
            users.setdefault(where, []).append(f"{row['channel']} of {row['name']!r}")
    if not users:
        return Check("targets", "skip", "no schedule notifies a webhook or chat URL")
    hosts = list(users)[:MAX_HOSTS]
    refused: list[str] = []
    unresolved: list[str] = []

    async def one(host: str, port: int) -> None:
        try:
            with anyio.fail_after(TIMEOUT):
                await netguard.resolve(host, port, allow)
        except netguard.AddressRefused as exc:
            refused.append(f"{', '.join(users[(host, port)][:3])}: {exc}")
        except (OSError, TimeoutError):
            unresolved.append(host)

    async with anyio.create_task_group() as tg:
        for host, port in hosts:
            tg.start_soon(one, host, port)
    return _targets_verdict(len(hosts), sorted(refused), sorted(unresolved), allow)


def _targets_verdict(
    hosts: int, refused: Sequence[str], unresolved: Sequence[str], allow: netguard.Allowlist
) -> Check:
    if refused:
        return Check(
            "targets", "fail",
            f"{len(refused)} of {hosts} target host(s) are refused by the address guard: "
            + "; ".join(refused[:3]),
            f"add each to {allow.variable} (hosts or CIDRs), or change those targets",
        )  # fmt: skip
    if unresolved:
        return Check(
            "targets", "warn",
            f"{len(unresolved)} of {hosts} target host(s) do not resolve from here: "
            + ", ".join(unresolved[:5]),
            "check those schedules' targets (deliveries to them retry, then go dead)",
        )  # fmt: skip
    return Check("targets", "ok", f"{hosts} target host(s) in use pass {allow.variable}")


async def public_url(config: Config) -> Check:
    """The console's address: it must answer as promptsched (its /healthz)."""
    if not config.public_url:
        return Check(
            "public_url", "skip",
            "not set: notifications carry no link to the run in the console",
        )  # fmt: skip
    url = config.public_url.rstrip("/") + "/healthz"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT)) as http:
            async with http.get(url, allow_redirects=False) as reply:
                text = await reply.text(errors="replace")
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Check(
            "public_url", "warn",
            f"{url} did not answer from here ({type(exc).__name__}): it may be reachable only "
            "from your users' network",
            "check PROMPTSCHED_PUBLIC_URL from a browser",
        )  # fmt: skip
    try:
        body = json.loads(text) if reply.status == 200 else None
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("status") == "ok":
        return Check("public_url", "ok", f"{config.public_url} answers as promptsched")
    return Check(
        "public_url", "fail",
        f"{url} answered, but not as promptsched (HTTP {reply.status}): links in notifications "
        "lead elsewhere",
        "set PROMPTSCHED_PUBLIC_URL to the console's address as people reach it",
    )  # fmt: skip


async def agreement(db: queries.DB, own: fleet.Published) -> Check:
    """This configuration against the one the running fleet publishes (``fleet.leading``)."""
    rows = await fleet.alive(db, Clock())
    lead = fleet.leading(rows)
    if lead is None:
        return Check("fleet", "skip", "no replica is running")
    fingerprints = len({row["fingerprint"] for row in rows})
    differs = fleet.differences(own.config["shared"], lead["config"]["shared"])
    if not differs and fingerprints == 1:
        return Check("fleet", "ok", f"the {len(rows)} running replica(s) share this configuration")
    among = f"{fingerprints} fingerprint(s) among {len(rows)} replica(s)"
    said = f"this configuration differs from the fleet's: {'; '.join(differs[:3])}"
    return Check(
        "fleet", "warn", f"{said} ({among})" if differs else f"the replicas disagree ({among})",
        "give every replica (and this shell, for direct-mode commands) the same settings; "
        "`promptsched status` names what differs",
    )  # fmt: skip


async def connect(dsn: str) -> asyncpg.Connection[Any]:
    with anyio.fail_after(TIMEOUT):
        return await pools.connect(dsn, application_name="promptsched-doctor")
