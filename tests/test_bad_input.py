"""Bad input never answers 5xx and never changes what is stored: hypothesis-built schedule
payloads (huge strings, unicode, NULs, lone surrogates, nulls, wrong types, deep JSON,
expressions at the parsers' limits) against create and patch, raw bodies that are not JSON
objects, and CLI commands with bad arguments (exit 2 and one line naming the field)."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import api_support
from tests.helpers import run_cli

BASE = {"name": "fuzz", "cron": "0 9 * * *", "prompt": "Summarize {{ date }}"}
FIELDS = (
    "name", "prompt", "cron", "rrule", "at", "every", "kind", "expression", "timezone",
    "provider", "model", "params", "misfire", "misfire_cap", "misfire_grace", "catchup_window",
    "overlap", "max_attempts", "timeout", "jitter", "dst_gap", "dst_fold", "enabled",
    "pause_after_failures", "notify", "version", "no_such_field",
)  # fmt: skip
# Values that sit right at, or just past, the documented limits.
LIMITS = (200, 201, 2000, 2001, 100_000, 100_001)
EXPRESSIONS = (
    "*/0 * * * *", "60 * * * *", "* * * * * * *", "0 0 31 2 *", "0 0 30 2 *", "@reboot",
    "59-0 * * * *", "1-60/61 * * * * *", ",".join(str(i) for i in range(60)) + " * * * *",
    "* " * 1000, "FREQ=SECONDLY;COUNT=1000000000", "FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30",
    "DTSTART:99991231T235959Z\nRRULE:FREQ=DAILY", "RRULE:FREQ=MINUTELY;BYSETPOS=400",
    "every 0s", "every -5m", "every 1us", "every 100000000d", "every 1e309s", "every",
    "at 9999-12-31T23:59:59", "0001-01-01T00:00:00", "2026-03-08T02:30:00", "2026-13-45T99:99",
)  # fmt: skip
TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
NASTY_TEXT = st.sampled_from(
    ["", " ", "\x00", "a\x00b", "\ud800", "x\udfffy", "\u202e\u0000", "🙂" * 50, "{{", "{{ x }}",
     "{% raw %}", "null", "NaN", "Infinity", "-0", "1e999", "0x10", "Mars/Olympus",
     "../../etc/passwd", "UTC\n", "America/New_York ", "'; DROP TABLE schedules; --"]
)  # fmt: skip
HUGE_TEXT = st.sampled_from(LIMITS).map(lambda n: "x" * n)


def _deep(kind: str, depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    TEXT,
    NASTY_TEXT,
    HUGE_TEXT,
    st.sampled_from(EXPRESSIONS),
)
VALUES = st.one_of(
    SCALARS,
    st.lists(SCALARS, max_size=4),
    st.dictionaries(TEXT, SCALARS, max_size=4),
    st.builds(_deep, st.sampled_from(["list", "dict"]), st.sampled_from([40, 64, 65, 200, 900])),
)
# A valid schedule with one field replaced or added, or a few, or nothing valid at all.
PAYLOADS = st.one_of(
    st.builds(lambda k, v: {**BASE, k: v}, st.sampled_from(FIELDS), VALUES),
    st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=6).map(lambda d: {**BASE, **d}),
    st.dictionaries(st.one_of(st.sampled_from(FIELDS), TEXT), VALUES, max_size=5),
)
FUZZ = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _check_rejection(reply: api_support.Reply) -> None:
    assert reply.status < 500, reply.body
    if reply.status >= 400:
        error = reply.body["error"]
        assert error["message"], reply.body
        if reply.status == 422:  # a validation error names the field to fix (maybe "")
            assert isinstance(error["field"], str), reply.body


@FUZZ
@given(payload=PAYLOADS)
async def test_creating_a_schedule_from_any_payload_never_fails_the_server(
    pool: asyncpg.Pool[Any], payload: dict[str, Any]
) -> None:
    async with api_support.client(pool) as api:
        who = await api.token("fuzz")
        before = await api_support.snapshot(pool)
        reply = await api.post("/v1/schedules", who, json=payload)
        _check_rejection(reply)
        if reply.status >= 400:
            assert await api_support.snapshot(pool) == before, payload
        else:
            assert reply.status == 201


@pytest.fixture
async def fuzzed_schedule(pool: asyncpg.Pool[Any]) -> int:
    async with api_support.client(pool) as api:
        reply = await api.post("/v1/schedules", await api.token("owner"), json=BASE)
        assert reply.status == 201
        return int(reply.body["id"])


@FUZZ
@given(
    patch=st.one_of(
        st.builds(lambda k, v: {k: v}, st.sampled_from(FIELDS), VALUES),
        st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=4),
    )
)
async def test_patching_a_schedule_with_any_payload_never_fails_or_half_applies(
    pool: asyncpg.Pool[Any], fuzzed_schedule: int, patch: dict[str, Any]
) -> None:
    async with api_support.client(pool) as api:
        who = await api.token("owner")
        before = await api_support.snapshot(pool)
        reply = await api.patch(f"/v1/schedules/{fuzzed_schedule}", who, json=patch)
        _check_rejection(reply)
        if reply.status >= 400:
            assert await api_support.snapshot(pool) == before, patch


RAW_BODIES = [
    b"",
    b"not json",
    b"[]",
    b'"a string"',
    b"null",
    b"{",
    b'{"name": NaN}',
    b'{"name": Infinity, "prompt": "p", "cron": "0 9 * * *"}',
    b"\xff\xfe\x00\x00",
    b'{"name": "\\ud800", "prompt": "p", "cron": "0 9 * * *"}',
    b'{"name": "n", "prompt": "\\u0000", "cron": "0 9 * * *"}',
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    b'{"name": "n", "prompt": "' + b"x" * 2_000_000 + b'", "cron": "0 9 * * *"}',
]


@pytest.mark.parametrize("body", RAW_BODIES, ids=[f"body{i}" for i in range(len(RAW_BODIES))])
@pytest.mark.parametrize("method", ["POST", "PATCH"])
async def test_bodies_that_are_not_a_json_object_are_a_clear_4xx(
    pool: asyncpg.Pool[Any], fuzzed_schedule: int, method: str, body: bytes
) -> None:
    path = "/v1/schedules" if method == "POST" else f"/v1/schedules/{fuzzed_schedule}"
    async with api_support.client(pool) as api:
        who = await api.token("owner")
        before = await api_support.snapshot(pool)
        headers = {"Content-Type": "application/json"}
        reply = await api.request(method, path, who, data=io.BytesIO(body), headers=headers)
        _check_rejection(reply)
        assert 400 <= reply.status < 500, reply.body
        assert await api_support.snapshot(pool) == before


# --- the CLI --------------------------------------------------------------------------------

ADD = ("schedules", "add", "--name", "n", "--prompt", "p")
CLI_CASES = [
    # (arguments, what the error line must name)
    ((*ADD, "--cron", "61 * * * *"), "expression"),
    ((*ADD, "--cron", "* " * 500), "expression"),
    ((*ADD, "--every", "0s"), "expression"),
    ((*ADD, "--every", "soon"), "expression"),
    ((*ADD, "--at", "2026-13-45T00:00"), "at"),
    ((*ADD, "--rrule", "FREQ=NEVER"), "expression"),
    ((*ADD, "--cron", "0 9 * * *", "--tz", "Mars/Olympus"), "timezone"),
    ((*ADD, "--cron", "0 9 * * *", "--max-attempts", "0"), "max_attempts"),
    ((*ADD, "--cron", "0 9 * * *", "--timeout", "forever"), "timeout"),
    ((*ADD, "--cron", "0 9 * * *", "--timeout", "0s"), "timeout"),
    ((*ADD, "--cron", "0 9 * * *", "--param", "no-equals-sign"), "param"),
    ((*ADD, "--cron", "0 9 * * *", "--param", "latency=forever"), "params.latency"),
    ((*ADD, "--cron", "0 9 * * *", "--overlap", "sometimes"), "overlap"),
    ((*ADD, "--cron", "0 9 * * *", "--provider", "nope"), "provider"),
    ((*ADD, "--cron", "0 9 * * *", "--jitter", "-1s"), "jitter"),
    (("schedules", "add", "--name", " ", "--prompt", "p", "--cron", "0 9 * * *"), "name"),
    (("schedules", "add", "--name", "n", "--prompt", "{{ nope", "--cron", "* * * * *"), "prompt"),
    (("schedules", "add", "--name", "n", "--prompt", "x" * 100_001, "--cron", "0 9 * * *"),
     "prompt"),
    (("schedules", "add", "--name", "n", "--cron", "0 9 * * *"), "--prompt"),
    (("schedules", "add", "--name", "n", "--prompt", "p"), "--cron"),
    ((*ADD, "--cron", "0 9 * * *", "--max-attempts", "many"), "--max-attempts"),
    ((*ADD, "--cron", "0 9 * * *", "--misfire", "later"), "--misfire"),
    (("runs", "show", "not-a-number"), "run id"),
    (("schedules", "pause", "1", "--until", "tomorrow"), "--until"),
    (("runs", "list", "--status", "bogus"), "--status"),
    (("runs", "list", "--limit", "x"), "--limit"),
    (("preview", "not a cron"), "expression"),
    (("preview", "* * * * *", "--count", "0"), "--count"),
    (("preview", "* * * * *", "--from", "yesterday"), "--from"),
]  # fmt: skip


def _stored(dsn: str) -> Any:
    async def read() -> Any:
        conn = await asyncpg.connect(dsn)
        try:
            return [
                [tuple(row) for row in await conn.fetch(f"SELECT * FROM {table} ORDER BY 1")]
                for table in ("schedules", "runs", "schedule_changes")
            ]
        finally:
            await conn.close()

    return asyncio.run(read())


@pytest.mark.parametrize(
    ("args", "names"), CLI_CASES, ids=[f"cli{i}" for i in range(len(CLI_CASES))]
)
def test_the_cli_rejects_bad_arguments_with_exit_2_and_one_line_naming_the_field(
    dsn: str, args: tuple[str, ...], names: str
) -> None:
    before = _stored(dsn)
    result = run_cli(*args, dsn=dsn)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("promptsched"), result.stderr
    assert names in errors[0], result.stderr
    # one line of error (argparse's adds where the help is; a note may say which
    # configuration the input was checked against)
    assert len(lines) <= 2, result.stderr
    assert result.stdout == ""
    assert _stored(dsn) == before
