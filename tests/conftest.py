"""Test fixtures: one embedded Postgres per session, one template clone per test, and the
loopback fakes (OpenAI-compatible server, web site, HTTP sink) that many modules share."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from promptsched.store import migrate
from promptsched.store import pool as pools
from promptsched.store.embedded import EmbeddedPostgres
from tests import api_support
from tests.api_support import Api
from tests.fakes import openai_server as fake_server
from tests.fakes import pages as site
from tests.fakes.http_sink import HttpSink, start_http_sink
from tests.helpers import admin_execute

TEMPLATE = "promptsched_template"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # Each session gets a base temporary directory of its own. By default every pytest session
    # shares /tmp/pytest-of-<user> and resets it to mode 0700 when it starts, which locks the
    # embedded Postgres's unprivileged user (tests run as root, Postgres does not) out of the
    # data directories that another session's tests keep under their tmp_path: two sessions
    # at once (two checkouts on one machine) made initdb fail at random.
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        config.option.basetemp = tempfile.mkdtemp(prefix="pytest-promptsched-")
        config.add_cleanup(lambda: shutil.rmtree(config.option.basetemp, ignore_errors=True))


async def _build_template(admin_dsn: str, template_dsn: str) -> None:
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
        await admin.execute(f"CREATE DATABASE {TEMPLATE}")
    finally:
        await admin.close()
    conn = await pools.connect(template_dsn)
    try:
        await migrate.apply(conn)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[EmbeddedPostgres]:
    # A short path: the server's unix socket lives under it.
    data_dir = Path(tempfile.mkdtemp(prefix="pst-", dir="/tmp"))
    server = EmbeddedPostgres(data_dir, fast_unsafe=True)
    server.ensure_running()
    asyncio.run(_build_template(server.dsn(), server.dsn(TEMPLATE)))
    yield server
    server.stop("immediate")
    shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture
def dsn(pg_server: EmbeddedPostgres) -> Iterator[str]:
    """A fresh, migrated database for this test."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    asyncio.run(admin_execute(pg_server, f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}"))
    yield pg_server.dsn(name)
    asyncio.run(admin_execute(pg_server, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


@pytest.fixture
async def pool(dsn: str) -> AsyncIterator[asyncpg.Pool[Any]]:
    created = await pools.create_pool(dsn, max_size=10)
    yield created
    await created.close()


@pytest.fixture
async def fake() -> AsyncIterator[fake_server.FakeOpenAI]:
    async with fake_server.start_fake_openai() as server:
        yield server


@pytest.fixture
async def pages() -> AsyncIterator[site.Pages]:
    async with site.start_pages() as running:
        yield running


@pytest.fixture
async def sink() -> AsyncIterator[HttpSink]:
    async with start_http_sink() as running:
        yield running


@pytest.fixture
async def api(pool: asyncpg.Pool[Any]) -> AsyncIterator[Api]:
    """The API app over the per-test database (a module may override it with other options)."""
    async with api_support.client(pool) as client:
        yield client


@pytest.fixture
async def alice(api: Api) -> dict[str, str]:
    return await api.token("alice")
