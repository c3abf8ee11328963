"""``promptsched doctor``: this configuration checked against everything it needs (the checks
are ops/probes.py), one line each with the fix when it fails; ``ok`` is False when something a
configured feature needs is broken (the CLI's exit status)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import asyncpg

from promptsched import errors
from promptsched.clock import Clock
from promptsched.config import Config
from promptsched.executors.settings import parse_providers
from promptsched.ops import fleet, probes
from promptsched.ops.probes import Check
from promptsched.store import pool as pools

ORDER = ("database", "clock", "statements", "pooler", "provider", "smtp", "targets",
         "public_url", "fleet")  # fmt: skip


def report(checks: list[Check]) -> dict[str, Any]:
    def rank(check: Check) -> tuple[int, str]:
        kind = check.name.split(" ", 1)[0]
        return (ORDER.index(kind) if kind in ORDER else len(ORDER), check.name)

    ordered = sorted(checks, key=rank)
    return {
        "ok": not any(check.status == "fail" for check in ordered),
        "checks": [check.json() for check in ordered],
    }


async def run(
    config: Config, dsn: str, published: fleet.Published, *, from_outside: bool = False
) -> dict[str, Any]:
    """Every check; those that read the database are left out when it cannot be reached or its
    schema is not this version's. ``from_outside`` (the CLI in direct mode): when replicas are
    running, the service is judged by what they publish (mail, providers, allowlist), and this
    shell's own settings are reported apart (``shell``), outside the verdict."""
    checks: list[Check] = []
    conn: asyncpg.Connection[Any] | None = None
    try:
        conn = await probes.connect(dsn)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        checks.append(Check(
            "database", "fail",
            f"cannot connect: {errors.connect_failure(exc) or str(exc) or type(exc).__name__}",
            "check PROMPTSCHED_DATABASE_URL (or, for the embedded database, that "
            "`promptsched run` started it), and that Postgres is up",
        ))  # fmt: skip
    try:
        usable = None
        if conn is not None:
            checks += [await probes.database(conn), await probes.clock(conn)]
            if checks[0].status == "ok":
                usable = conn
                checks += await _inside(config, dsn, conn, published)
        running = await fleet.alive(usable, Clock()) if usable and from_outside else []
        if usable is not None and running:
            checks = [c for c in checks if c.name != "targets"]
            checks += await _service(usable, running)
            shell = [await probes.email(config, None), *await _outside(config)]
        else:
            checks.append(await probes.email(config, usable))
    finally:
        if conn is not None:
            await conn.close()
    if not running:
        return report([*checks, *await _outside(config)])
    return {**report(checks), "judged_by": f"the {len(running)} running replica(s)",
            "shell": [_shell(check) for check in shell]}  # fmt: skip


async def _service(db: asyncpg.Connection[Any], running: list[Any]) -> list[Check]:
    """The service as its running replicas publish it: can they send the mail schedules owe,
    which providers do they have, does their allowlist pass the targets in use."""
    lead = fleet.leading(running)
    assert lead is not None
    view = fleet.from_document(
        lead["config"], can_email=any(fleet.emails(row["config"]) for row in running),
        source="fleet", replicas=len(running), fingerprints=0,
    )  # fmt: skip
    return [
        await probes.fleet_email(db, view.can_email),
        *probes.fleet_providers(lead["config"]),
        await probes.targets(db, view.webhook_allow),
    ]


def _shell(check: Check) -> dict[str, Any]:
    """A check of this shell's own settings: said, never part of the verdict."""
    status = "warn" if check.status == "fail" else check.status
    return {**check.json(), "status": status, "name": f"this shell: {check.name}"}


async def _inside(
    config: Config, dsn: str, conn: asyncpg.Connection[Any], published: fleet.Published
) -> list[Check]:
    """The checks that read the database."""
    pool = await pools.create_pool(
        dsn, min_size=2, max_size=2, statement_cache_size=config.statement_cache_size,
        application_name="promptsched-doctor",
    )  # fmt: skip
    try:
        checks = [
            await probes.statements(pool, config.statement_cache_size),
            await probes.listening(config, dsn, pool),
        ]
    finally:
        await pool.close()
    return [
        *checks,
        await probes.targets(conn, config.webhook_allow),
        await probes.agreement(conn, published),
    ]


async def _outside(config: Config) -> list[Check]:
    """The checks that reach out (providers, the public URL), at once."""
    found: list[Check] = []

    async def gather(check: Callable[[], Awaitable[list[Check]]]) -> None:
        found.extend(await check())

    async def public() -> list[Check]:
        return [await probes.public_url(config)]

    async def providers() -> list[Check]:
        settings = parse_providers(config.env, config.providers_raw)
        return await probes.providers(settings, config.webhook_allow)

    async with anyio.create_task_group() as tg:
        tg.start_soon(gather, providers)
        tg.start_soon(gather, public)
    return found
