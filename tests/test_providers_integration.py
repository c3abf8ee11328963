"""Issue 4 end to end: the ``openai`` provider, built from its environment configuration, run
through a real WorkerPool and Postgres against the scriptable fake server (every failure class,
Retry-After, backpressure, fencing, save-time validation), and a real ``promptsched run``
process that must never show the API key."""

from __future__ import annotations

import re
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import asyncpg
import pytest

from promptsched.clock import Clock, FrozenClock
from promptsched.config import WorkerSettings
from promptsched.errors import ValidationError
from promptsched.executors.providers import build_registry
from promptsched.executors.settings import parse_providers
from promptsched.metrics import Metrics
from promptsched.ops import inputs
from promptsched.ops import schedules as schedule_ops
from promptsched.roles.worker import WorkerPool
from promptsched.roles.worker.heartbeat import Heartbeat
from promptsched.store import queries
from promptsched.web import auth
from tests import factories
from tests.factories import EPOCH, attempt_rows, attempt_statuses, run_row
from tests.fakes import openai_server as fake_server
from tests.helpers import Service, wait_until

PROVIDER = "fake"
MODEL = "gpt-fake"
RETRY_MAX = timedelta(seconds=1)


def provider_env(base_url: str, **settings: str) -> dict[str, str]:
    """``PROMPTSCHED_*`` variables for one openai-kind provider named ``fake``."""
    env = {
        "PROMPTSCHED_PROVIDERS": PROVIDER,
        "PROMPTSCHED_PROVIDER_FAKE_KIND": "openai",
        "PROMPTSCHED_PROVIDER_FAKE_BASE_URL": base_url,
        "PROMPTSCHED_PROVIDER_FAKE_MODEL": MODEL,
    }
    env.update({f"PROMPTSCHED_PROVIDER_FAKE_{key.upper()}": v for key, v in settings.items()})
    return env


@asynccontextmanager
async def fake_workers(
    pool: asyncpg.Pool[Any],
    clock: Clock,
    base_url: str,
    *,
    slots: int = 4,
    metrics: Metrics | None = None,
    timeout: str = "500ms",
    **settings: str,
) -> AsyncIterator[WorkerPool]:
    """A WorkerPool whose registry comes from ``build_registry(parse_providers(env))``, with a
    tiny retry backoff (at most ``RETRY_MAX``) so a longer wait can only be ``Retry-After``."""
    env = provider_env(base_url, timeout=timeout, **settings)
    registry, limiters = build_registry(parse_providers(env))
    metrics = metrics or Metrics()
    lease = timedelta(seconds=30)
    heartbeat = Heartbeat(pool, clock, metrics, lease=lease, interval=lease / 3)
    try:
        yield WorkerPool(
            pool,
            clock,
            metrics,
            registry,
            limiters,
            heartbeat,
            WorkerSettings(
                slots=slots,
                worker_id="it-worker",
                retry_base=timedelta(milliseconds=100),
                retry_max=RETRY_MAX,
            ),
        )
    finally:
        await registry.aclose()


async def fake_schedule(pool: asyncpg.Pool[Any], **fields: Any) -> int:
    sid = await factories.schedule(pool, **fields)
    await pool.execute("UPDATE schedules SET provider = $2 WHERE id = $1", sid, PROVIDER)
    return sid


async def fake_run(pool: asyncpg.Pool[Any], **fields: Any) -> int:
    return await factories.pending_run(pool, await fake_schedule(pool, **fields))


# --- one attempt per behaviour --------------------------------------------------------------


async def test_ok_stores_output_and_usage_and_renders_the_system_prompt(
    pool: asyncpg.Pool[Any], fake: fake_server.FakeOpenAI
) -> None:
    clock = FrozenClock(EPOCH)
    params = {"system": "You write for {{ schedule_name }}.", "temperature": "0.2"}
    rid = await fake_run(pool, prompt="Summarise {{ date }}", params=params)
    async with fake_workers(pool, clock, fake.base_url) as workers:
        assert await workers.run_once() == 1

    run = await run_row(pool, rid)
    assert (run["status"], run["attempts"], run["error"]) == ("succeeded", 1, None)
    assert run["output"] == "hello from the fake"
    assert run["usage"] == dict(fake_server.DEFAULT_USAGE)
    assert await attempt_statuses(pool, rid) == ["succeeded"]
    (sent,) = fake.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.json == {
        "model": MODEL,
        "temperature": 0.2,
        "messages": [
            {"role": "system", "content": "You write for test."},
            {"role": "user", "content": "Summarise 2026-03-02"},
        ],
    }


async def test_slow_but_within_the_timeout_succeeds(
    pool: asyncpg.Pool[Any], fake: fake_server.FakeOpenAI
) -> None:
    fake.script(fake_server.slow(0.3))
    rid = await fake_run(pool)
    async with fake_workers(pool, FrozenClock(EPOCH), fake.base_url, timeout="2s") as workers:
        assert await workers.run_once() == 1

    run = await run_row(pool, rid)
    assert (run["status"], run["attempts"], run["output"]) == ("succeeded", 1, "slow but fine")
    assert await attempt_statuses(pool, rid) == ["succeeded"]


@pytest.mark.parametrize(
    ("behaviour", "status", "error"),
    [
        pytest.param(
            fake_server.hang(), "pending", "fake: request timed out after 500ms", id="hang"
        ),
        pytest.param(
            fake_server.status(500, '{"error": {"message": "upstream on fire"}}'),
            "pending",
            "fake: HTTP 500 Internal Server Error: upstream on fire",
            id="500",
        ),
        pytest.param(
            fake_server.drop_mid_body(),
            "pending",
            "fake: connection lost while reading the response",
            id="dropped-mid-body",
        ),
        pytest.param(
            fake_server.status(400, '{"error": {"message": "max_tokens is too large"}}'),
            "dead",
            "fake: HTTP 400 Bad Request: max_tokens is too large",
            id="400",
        ),
        pytest.param(
            fake_server.malformed(),
            "dead",
            "fake: invalid response: body is not JSON",
            id="malformed-json",
        ),
    ],
)
async def test_a_failed_attempt_retries_or_dies_by_its_class(
    pool: asyncpg.Pool[Any],
    fake: fake_server.FakeOpenAI,
    behaviour: fake_server.Behaviour,
    status: str,
    error: str,
) -> None:
    clock = FrozenClock(EPOCH)
    fake.script(behaviour)  # then the default: ok
    rid = await fake_run(pool, max_attempts=3)
    async with fake_workers(pool, clock, fake.base_url) as workers:
        assert await workers.run_once() == 1
        run = await run_row(pool, rid)
        assert (run["status"], run["attempts"]) == (status, 1)
        assert run["error"].startswith(error), run["error"]
        assert run["lease_expires_at"] is None and run["output"] is None
        (attempt,) = await attempt_rows(pool, rid)
        assert (attempt["status"], attempt["error"]) == ("failed", run["error"])
        if status == "dead":
            assert run["finished_at"] == clock.instant
            assert await workers.run_once() == 0  # permanent: never tried again
            assert len(fake.requests) == 1
            return
        # Retryable: back to pending after a backoff, then the next attempt succeeds.
        delay = run["available_at"] - clock.instant
        assert timedelta(0) < delay <= RETRY_MAX
        assert await workers.run_once() == 0
        clock.advance(delay)
        assert await workers.run_once() == 1

    run = await run_row(pool, rid)
    assert (run["status"], run["attempts"], run["error"]) == ("succeeded", 2, None)
    assert await attempt_statuses(pool, rid) == ["failed", "succeeded"]


async def test_timeouts_retry_then_go_dead_after_max_attempts(
    pool: asyncpg.Pool[Any], fake: fake_server.FakeOpenAI
) -> None:
    clock = FrozenClock(EPOCH)
    fake.script(fake_server.hang(), fake_server.hang())
    rid = await fake_run(pool, max_attempts=2)
    async with fake_workers(pool, clock, fake.base_url) as workers:
        assert await workers.run_once() == 1
        run = await run_row(pool, rid)
        assert (run["status"], run["attempts"]) == ("pending", 1)
        clock.advance(run["available_at"] - clock.instant)
        assert await workers.run_once() == 1

    run = await run_row(pool, rid)
    assert (run["status"], run["attempts"]) == ("dead", 2)
    assert run["error"] == "fake: request timed out after 500ms"
    assert await attempt_statuses(pool, rid) == ["failed", "failed"]
    # Each timed-out attempt closed its connection: the server saw the client go away.
    with anyio.fail_after(2):
        await fake.wait_until(lambda server: server.disconnects == 2)


async def test_429_retry_after_is_honoured_never_shortened(
    pool: asyncpg.Pool[Any], fake: fake_server.FakeOpenAI
) -> None:
    clock = FrozenClock(EPOCH)
    fake.script(fake_server.rate_limited("7"))
    rid = await fake_run(pool, max_attempts=3)
    async with fake_workers(pool, clock, fake.base_url) as workers:
        assert await workers.run_once() == 1
        run = await run_row(pool, rid)
        assert (run["status"], run["attempts"]) == ("pending", 1)
        assert "HTTP 429 Too Many Requests (retry after 7s)" in run["error"]
        assert await attempt_statuses(pool, rid) == ["failed"]
        # The backoff alone is at most RETRY_MAX (1s): the 7s can only come from Retry-After.
        delay = run["available_at"] - clock.instant
        assert delay >= timedelta(seconds=7)
        clock.advance(delay - timedelta(milliseconds=1))
        assert await workers.run_once() == 0  # not a moment sooner
        clock.advance(timedelta(milliseconds=1))
        assert await workers.run_once() == 1

    run = await run_row(pool, rid)
    assert (run["status"], run["attempts"]) == ("succeeded", 2)
    assert await attempt_statuses(pool, rid) == ["failed", "succeeded"]


async def test_a_bad_system_template_is_permanent_and_sends_nothing(
    pool: asyncpg.Pool[Any], fake: fake_server.FakeOpenAI
) -> None:
    # Stored behind validate()'s back (the row is written directly): the worker still refuses.
    rid = await fake_run(pool, params={"system": "You are {{ nme }}"})
    async with fake_workers(pool, FrozenClock(EPOCH), fake.base_url) as workers:
        assert await workers.run_once() == 1

    run = await run_row(pool, rid)
    assert (run["status"], run["attempts"]) == ("dead", 1)
    assert run["error"].startswith("bad prompt template: params.system: unknown variable {{ nme }}")
    assert fake.requests == []


# --- backpressure ---------------------------------------------------------------------------

LIMIT = 8
RUSH = 200


async def test_a_rush_waits_as_pending_rows_within_the_provider_limit(
    pool: asyncpg.Pool[Any], fake: fake_server.FakeOpenAI
) -> None:
    # Each request is held until LIMIT requests overlap, so a limit that let more through
    # would show in the fake's max-in-flight counter.
    fake.default = fake_server.gather(LIMIT)
    sid = await fake_schedule(pool)
    await pool.execute(
        "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts, available_at) "
        "SELECT s.id, $2::timestamptz - make_interval(secs => g), 'cadence', s.provider, "
        "s.max_attempts, $2::timestamptz - make_interval(secs => g) "
        "FROM schedules s, generate_series(1, $3) g "
        "WHERE s.id = $1",
        sid, EPOCH, RUSH,
    )  # fmt: skip
    samples: list[tuple[int, int, int]] = []

    def more_than(count: int) -> Callable[[fake_server.FakeOpenAI], bool]:
        return lambda server: len(server.requests) > count

    async def observe() -> None:
        # One snapshot of the queue each time a request reaches the provider.
        while True:
            await fake.wait_until(more_than(len(samples)))
            row = await pool.fetchrow(
                "SELECT count(*) FILTER (WHERE status = 'running')::int AS running, "
                "count(*) FILTER (WHERE status = 'pending')::int AS pending, "
                "count(*) FILTER (WHERE status = 'succeeded')::int AS succeeded FROM runs"
            )
            assert row is not None
            # Answered by then (read after the query: never fewer than the query saw). A run
            # answered and not yet written is running, and no call in flight.
            answered = len(fake.requests) - fake.in_flight
            calls = row["running"] - (answered - row["succeeded"])
            samples.append((row["running"], row["pending"], calls))

    clock = FrozenClock(EPOCH)
    async with fake_workers(
        pool, clock, fake.base_url, slots=64, timeout="10s", max_concurrency=str(LIMIT)
    ) as workers:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(observe)
                assert await workers.run_once() == RUSH
                tg.cancel_scope.cancel()

    assert fake.max_in_flight == LIMIT  # never more, and the limit was reached
    assert len(fake.requests) == RUSH
    counts = await pool.fetch("SELECT status, attempts, count(*)::int FROM runs GROUP BY 1, 2")
    assert [tuple(row) for row in counts] == [("succeeded", 1, RUSH)]
    attempts = await pool.fetchval("SELECT count(*)::int FROM run_attempts")
    assert attempts == RUSH  # waiting for the limiter spent no attempt
    # The rush waited as pending rows, holding no lease: never more than LIMIT running but
    # for those whose call was answered and whose final write was on its way.
    assert samples and max(calls for _, _, calls in samples) <= LIMIT
    assert any(pending > 0 and running > 0 for running, pending, _ in samples), samples[:5]


# --- fencing --------------------------------------------------------------------------------


async def test_a_fenced_attempt_aborts_its_request_and_writes_nothing(
    pool: asyncpg.Pool[Any], fake: fake_server.FakeOpenAI
) -> None:
    fake.script(fake_server.hang())
    metrics = Metrics()
    rid = await fake_run(pool)
    clock = FrozenClock(EPOCH)
    async with fake_workers(pool, clock, fake.base_url, metrics=metrics, timeout="60s") as workers:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(workers.run_once)
                await fake.wait_until(lambda server: server.in_flight == 1)
                mine = (await run_row(pool, rid))["attempt_id"]
                # Another attempt wins the run (as after a reap and a re-claim elsewhere).
                await pool.execute(
                    "UPDATE runs SET attempt_id = gen_random_uuid() WHERE id = $1", rid
                )
                taken = await run_row(pool, rid)
                assert await workers.heartbeat.run_once() == 1
                with anyio.fail_after(1):
                    await fake.wait_until(
                        lambda server: server.disconnects == 1 and server.in_flight == 0
                    )
                # run_once returns once the fenced attempt has stopped.

    assert dict(await run_row(pool, rid)) == dict(taken)  # untouched by the fenced attempt
    # The run's one attempt is the one that took it, still running; the fenced attempt wrote
    # no row of its own (an ended attempt is written by whoever ends it: here, nobody).
    (attempt,) = await attempt_rows(pool, rid)
    assert attempt["attempt_id"] == taken["attempt_id"] != mine
    assert (attempt["status"], attempt["finished_at"], attempt["error"]) == ("running", None, None)
    assert (
        await pool.fetchval("SELECT count(*) FROM ended_attempts WHERE attempt_id = $1", mine) == 0
    )
    # One write was rejected (the heartbeat's), one lease lost; the attempt wrote nothing more.
    assert metrics.fenced_writes.labels("heartbeat")._value.get() == 1
    assert metrics.fenced_writes.labels("finish")._value.get() == 0
    assert metrics.leases_lost.labels("taken")._value.get() == 1
    assert not workers.inflight and len(fake.requests) == 1


# --- save-time validation -------------------------------------------------------------------

KINDS = {"echo": "echo", PROVIDER: "openai"}


def _raw(provider: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"name": "n", "cron": "0 9 * * *", "prompt": "p", "provider": provider, "params": params}


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        pytest.param(
            {"temperature": "warm"},
            "params.temperature",
            "must be a number (got 'warm')",
            id="temperature-not-a-number",
        ),
        ({"max_tokens": 1.5}, "params.max_tokens", "must be a whole number"),
        ({"tempreature": 1}, "params.tempreature", "unknown parameter"),
        ({"system": 42}, "params.system", "must be a string"),
        ({"system": "Hi {{ schedule_nam }}"}, "params.system", "did you mean {{ schedule_name }}"),
    ],
)
def test_bad_openai_params_are_rejected_at_save_time(
    params: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        inputs.validate(_raw(PROVIDER, params), providers=KINDS, provider_kinds=KINDS)
    assert caught.value.field == field
    assert message in caught.value.message


def test_openai_param_checks_apply_to_openai_kinds_only() -> None:
    good = {"temperature": "0.2", "max_tokens": "100", "stop": "END", "system": "{{ date }}"}
    values = inputs.validate(_raw(PROVIDER, good), providers=KINDS, provider_kinds=KINDS)
    assert values.params == good  # stored as given; converted on the wire
    echo_params = {"latency": "10ms", "fail_attempts": 1}
    inputs.validate(_raw("echo", echo_params), providers=KINDS, provider_kinds=KINDS)
    # Without kinds (the old signature) the openai check cannot apply.
    inputs.validate(_raw(PROVIDER, {"temperature": "warm"}), providers=KINDS)
    # A system prompt is a template whatever the provider, since the worker renders it.
    with pytest.raises(ValidationError, match=r"params\.system: unclosed tag"):
        inputs.validate(_raw("echo", {"system": "{{ date"}), providers=KINDS)


async def test_an_update_with_bad_openai_params_is_rejected_and_changes_nothing(
    pool: asyncpg.Pool[Any],
) -> None:
    clock = Clock()
    values = inputs.validate(_raw(PROVIDER, {"temperature": 1}), providers=KINDS)
    async with pool.acquire() as conn:
        created = await schedule_ops.create_schedule(conn, clock, values, owner="o")
        with pytest.raises(ValidationError) as caught:
            await schedule_ops.update_schedule(
                conn, clock, created.id, {"params": {"temperature": "hot"}},
                owner="o", actor="o", providers=KINDS, provider_kinds=KINDS,
            )  # fmt: skip
    assert caught.value.field == "params.temperature"
    stored = await pool.fetchrow("SELECT params, version FROM schedules WHERE id = $1", created.id)
    assert stored is not None
    assert (stored["params"], stored["version"]) == ({"temperature": 1}, created.version)


# --- the API key never shows ----------------------------------------------------------------

API_PATHS = ("/healthz", "/readyz", "/metrics")


async def _table_dump(pool: asyncpg.Pool[Any]) -> dict[str, list[str]]:
    """Every row of every table and view outside the system schemas, as JSON text."""
    names = await pool.fetch(
        "SELECT format('%I.%I', table_schema, table_name) AS name "
        "FROM information_schema.tables "
        "WHERE table_schema NOT IN ('pg_catalog', 'information_schema')"
    )
    return {
        row["name"]: [
            text
            for (text,) in await pool.fetch(f"SELECT row_to_json(t)::text FROM {row['name']} t")
        ]
        for row in names
    }


async def _api_responses(base: str, token: str, ids: dict[str, int]) -> dict[str, str]:
    """Status, headers and body of /healthz, /readyz, /metrics and every GET route the OpenAPI
    document lists (if the API has one), path ids filled from ``ids`` (``run``/``schedule``)."""
    answers: dict[str, str] = {}
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(base, headers=headers) as session:
        paths = list(API_PATHS)
        async with session.get("/v1/openapi.json") as response:
            if response.status == 200:
                document = await response.json()
                paths += [path for path, ops in document["paths"].items() if "get" in ops]
        for path in paths:
            ident = ids["run" if path.startswith("/v1/runs/") else "schedule"]
            async with session.get(re.sub(r"\{[^}]+\}", str(ident), path)) as response:
                text = await response.text()
                answers[path] = f"{response.status} {dict(response.headers)} {text}"
    return answers


async def _wait_finished(pool: asyncpg.Pool[Any], run_id: int, what: str) -> asyncpg.Record:
    async def finished() -> asyncpg.Record | None:
        run = await run_row(pool, run_id)
        return run if run["status"] in ("succeeded", "dead") else None

    run: asyncpg.Record | None = await wait_until(finished, timeout=15, what=what)
    assert run is not None
    return run


@pytest.mark.slow
async def test_the_api_key_appears_in_no_log_row_or_response(
    pool: asyncpg.Pool[Any], dsn: str, fake: fake_server.FakeOpenAI, tmp_path: Path
) -> None:
    secret_part = secrets.token_hex(16)
    key = f"sk-test-{secret_part}"
    env = {
        **provider_env(fake.base_url, timeout="500ms", api_key_env="FAKE_KEY"),
        "FAKE_KEY": key,
        "PROMPTSCHED_LOG_LEVEL": "debug",
    }
    process = Service(dsn, tmp_path / "svc.log", env=env)
    try:
        await process.ready()
        port = (await process.wait_event("api.listening"))["port"]
        sid = await fake_schedule(pool, max_attempts=1, next_fire_at=None)
        finished: dict[str, asyncpg.Record] = {}
        # One run at a time, so each takes the behaviour scripted for it.
        for label, behaviour in [
            ("ok", fake_server.ok()),
            ("401", fake_server.echo_auth()),
            ("timeout", fake_server.hang()),
        ]:
            fake.script(behaviour)
            now: datetime = await pool.fetchval("SELECT now()")
            rid = await factories.pending_run(pool, sid, now, "manual")
            await queries.run_notify_ready(pool, "test")
            finished[label] = await _wait_finished(pool, rid, f"the {label} run")
        token, _ = await auth.create_token(pool, owner="default", admin=True)
        ids = {"run": finished["401"]["id"], "schedule": sid}
        responses = await _api_responses(f"http://127.0.0.1:{port}", token, ids)
    finally:
        process.stop()

    # The key was configured and sent, and the server echoed it back.
    assert [r.headers.get("Authorization") for r in fake.requests] == [f"Bearer {key}"] * 3
    assert finished["ok"]["status"] == "succeeded"
    assert finished["401"]["status"] == "dead"
    assert finished["401"]["error"].startswith("fake: HTTP 401 Unauthorized")
    assert "Incorrect API key provided: Bearer ********" in finished["401"]["error"]
    assert finished["timeout"]["error"] == "fake: request timed out after 500ms"

    log_text = process.log_path.read_text(errors="replace")
    assert process.has_event("run.dead", error=finished["401"]["error"])  # the log saw it
    dump = await _table_dump(pool)
    assert {"public.runs", "public.run_attempts", "public.schedules"} <= set(dump)
    assert set(responses) >= set(API_PATHS)
    if "/v1/runs/{id}" in responses:  # the API shows the run, and its error, masked
        assert responses["/v1/runs/{id}"].startswith("200 ")
        assert "Incorrect API key provided: Bearer ********" in responses["/v1/runs/{id}"]
    for needle in (key, secret_part):
        assert needle not in log_text
        assert [name for name, rows in dump.items() if any(needle in row for row in rows)] == []
        assert [path for path, text in responses.items() if needle in text] == []
