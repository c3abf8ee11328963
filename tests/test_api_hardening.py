"""Requests that must not leak, stall or confuse: what the HTTP parser refuses is answered as
JSON without echoing the request, a huge declared body is refused at once, JSON bodies fail
with our own words, a stray field is refused by every changing operation, params are held to
their documented values, a paused schedule is not triggered, and /healthz never waits for the
database."""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from promptsched import logs
from promptsched.api import app as api_app
from promptsched.clock import Clock
from promptsched.console import routes as console_routes
from promptsched.metrics import Metrics
from promptsched.roles.loop_probe import LoopProbe
from promptsched.store import pool as pools
from promptsched.web import auth
from tests import api_support, console_support, factories
from tests.api_support import SCHEDULE, Api


@pytest.fixture
async def api(pool: asyncpg.Pool[Any]) -> AsyncIterator[Api]:
    kinds = {"gpt": "openai"}
    async with api_support.client(pool, providers=("echo", "gpt"), provider_kinds=kinds) as client:
        yield client


def _token(who: dict[str, str]) -> str:
    return who["Authorization"].removeprefix("Bearer ")


async def _raw(api: Api, request: bytes, *, timeout: float = 5) -> tuple[int, bytes, Any]:
    """Send raw bytes; the status, head and JSON body of the answer, read until the server
    closes the connection (within ``timeout``)."""
    port = api.client.server.port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        with anyio.fail_after(timeout):
            reply = await reader.read()  # to EOF: a refused request closes its connection
    finally:
        writer.close()
    head, _, body = reply.partition(b"\r\n\r\n")
    assert b"application/json" in head, reply[:300]
    return int(head.split()[1]), head + b"\r\n\r\n" + body, json.loads(body)


def _get(headers: bytes, target: bytes = b"/v1/schedules") -> bytes:
    return b"GET " + target + b" HTTP/1.1\r\nHost: test\r\n" + headers + b"\r\n"


# --- what the HTTP parser refuses --------------------------------------------------------


PARSER_CASES = [
    # (id, request built from the token, status, code)
    ("long-authorization", lambda t: _get(b"Authorization: Bearer " + t + b"A" * 9000 + b"\r\n"),
     431, "header_too_large"),
    ("long-cookie", lambda t: _get(b"Cookie: promptsched_session=" + t + b"; x=" + b"c" * 9000
                                   + b"\r\n"), 431, "header_too_large"),
    ("long-request-line", lambda t: _get(b"", b"/v1/schedules?t=" + t + b"&p=" + b"x" * 70_000),
     414, "uri_too_long"),
    ("too-many-headers", lambda t: _get(b"Authorization: Bearer " + t + b"\r\n"
                                        + b"".join(b"X-%d: v\r\n" % i for i in range(200))),
     431, "header_too_large"),
    ("space-before-colon", lambda t: _get(b"Authorization : Bearer " + t + b"\r\n"),
     400, "bad_request"),
    ("control-character", lambda t: _get(b"Authorization: Bearer " + t + b"\x01\r\n"),
     400, "bad_request"),
    ("content-length-overflow", lambda t: b"POST /v1/schedules HTTP/1.1\r\nHost: test\r\n"
     b"Authorization: Bearer " + t + b"\r\nContent-Length: 99999999999999999999999\r\n\r\n",
     413, "too_large"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("build", "status", "code"),
    [case[1:] for case in PARSER_CASES],
    ids=[case[0] for case in PARSER_CASES],
)
async def test_what_the_parser_refuses_is_a_json_error_that_does_not_echo_the_request(
    api: Api, alice: dict[str, str], build: Any, status: int, code: str
) -> None:
    token = _token(alice).encode()
    answered, reply, body = await _raw(api, build(token))
    assert (answered, body["error"]["code"]) == (status, code), reply[:400]
    assert body["error"]["message"] and body["error"]["request_id"]
    assert token not in reply and token[4:20] not in reply
    assert b"Got more than" not in reply and b"Traceback" not in reply


async def test_a_header_just_under_the_limit_is_served(api: Api, alice: dict[str, str]) -> None:
    padding = b"p" * (8000 - len(b"X-Padding: "))
    answered, _, body = await _raw(
        api, _get(b"Authorization: " + alice["Authorization"].encode() + b"\r\n"
                  b"X-Padding: " + padding + b"\r\nConnection: close\r\n"),
    )  # fmt: skip
    assert answered == 200 and body["items"] == []


# --- bodies --------------------------------------------------------------------------------


async def test_a_huge_declared_body_is_refused_at_once(api: Api, alice: dict[str, str]) -> None:
    """Authenticated, so without the check the handler would wait for 500 MB that never come."""
    request = (
        b"POST /v1/schedules HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        b"Authorization: " + alice["Authorization"].encode() + b"\r\n"
        b"Content-Length: 500000000\r\n\r\n{}"
    )
    started = time.monotonic()
    answered, _, body = await _raw(api, request, timeout=5)
    assert answered == 413 and body["error"]["code"] == "too_large"
    assert str(api_app.MAX_BODY) in body["error"]["message"]
    assert time.monotonic() - started < 5


async def test_a_body_whose_framing_breaks_while_it_is_read_is_a_400(
    api: Api, alice: dict[str, str]
) -> None:
    """The parser accepts the headers; the body fails to decompress as the handler reads it."""
    body = b"\x1f\x8b\x08\x00" + b"this is not gzip" * 4
    request = (
        b"POST /v1/schedules HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        b"Authorization: " + alice["Authorization"].encode() + b"\r\n"
        b"Content-Encoding: gzip\r\nConnection: close\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    answered, reply, error = await _raw(api, request)
    assert (answered, error["error"]["code"]) == (400, "bad_request"), reply[:400]
    assert "malformed" in error["error"]["message"] and b"not gzip" not in reply


BAD_JSON = [
    # (id, body, status, field, words the message must contain)
    ("huge-integer", b'{"name": "n", "prompt": "p", "cron": "0 9 * * *", "max_attempts": '
     + b"9" * 5000 + b"}", 422, "max_attempts", "5000 digits"),
    ("huge-integer-deep", b'{"name": "n", "prompt": "p", "cron": "0 9 * * *", "params": '
     b'{"seed": [' + b"1" * 4400 + b"]}}", 422, "params.seed[0]", "4400 digits"),
    ("deep-arrays", b"[" * 100_000 + b"]" * 100_000, 400, None, "nests deeper than 32"),
    ("deep-objects", b'{"a":' * 50_000 + b"1" + b"}" * 50_000, 400, None, "nests deeper than"),
    ("invalid-utf8", b'{"name": "\xff\xfe", "prompt": "p"}', 400, None, "not valid UTF-8"),
    ("nan", b'{"name": "n", "prompt": "p", "cron": "0 9 * * *", "params": {"temperature": NaN}}',
     400, "params.temperature", "NaN is not JSON"),
    ("infinity", b'{"name": "n", "prompt": "p", "cron": "0 9 * * *", "jitter": -Infinity}',
     400, "jitter", "-Infinity is not JSON"),
    ("truncated", b'{"name": ', 400, None, "line 1, column 10"),
    ("overflowing-float", b'{"name": "n", "prompt": "p", "cron": "0 9 * * *", "params": '
     b'{"x": 1e999}}', 422, "params.x", "finite"),
]  # fmt: skip
INTERNALS = ("sys.set_int_max_str_digits", "recursion", "codec", "Traceback", "Exceeds the limit")


@pytest.mark.parametrize(
    ("body", "status", "field", "words"),
    [case[1:] for case in BAD_JSON],
    ids=[case[0] for case in BAD_JSON],
)
async def test_bodies_that_python_parses_badly_get_a_clear_error_in_our_words(
    api: Api,
    alice: dict[str, str],
    pool: asyncpg.Pool[Any],
    body: bytes,
    status: int,
    field: str | None,
    words: str,
) -> None:
    before = await api_support.snapshot(pool)
    headers = {"Content-Type": "application/json"}
    reply = await api.post("/v1/schedules", alice, data=io.BytesIO(body), headers=headers)
    error = reply.body["error"]
    assert (reply.status, error["field"]) == (status, field), error
    assert words in error["message"], error
    assert not any(internal in error["message"] for internal in INTERNALS), error
    if status == 400:
        assert error["code"] == "malformed_json"
    assert await api_support.snapshot(pool) == before


async def test_a_byte_order_mark_is_ignored(api: Api, alice: dict[str, str]) -> None:
    body = b"\xef\xbb\xbf" + json.dumps(SCHEDULE).encode()
    headers = {"Content-Type": "application/json"}
    reply = await api.post("/v1/schedules", alice, data=io.BytesIO(body), headers=headers)
    assert reply.status == 201, reply.body


# --- unknown fields, everywhere -------------------------------------------------------------

CHANGING = [op for op in api_app.OPERATIONS if op.method in ("POST", "PUT", "PATCH", "DELETE")]


@pytest.mark.parametrize(
    "op", CHANGING, ids=[f"{op.method} {op.path}" for op in CHANGING]
)  # fmt: skip
async def test_every_changing_operation_refuses_a_field_it_does_not_know(
    api: Api, alice: dict[str, str], pool: asyncpg.Pool[Any], op: api_app.Operation
) -> None:
    """The body is checked before the handler runs, so an id need not exist."""
    sid = (await api.post("/v1/schedules", alice, json=SCHEDULE)).body["id"]
    before = await api_support.snapshot(pool)
    path = op.path.replace("{id}", str(sid) if "schedules" in op.path else "999999")
    path = path.replace("{key}", "no-such-key")
    reply = await api.request(op.method, path, alice, json={"no_such_field": True})
    assert reply.status == 422, (op.path, reply.body)
    assert reply.body["error"]["field"] == "no_such_field"
    assert await api_support.snapshot(pool) == before
    documented = api_support.DOCUMENT["paths"][op.path][op.method.lower()]
    assert "requestBody" in documented


async def test_an_empty_object_is_still_fine_where_no_fields_are_taken(
    api: Api, alice: dict[str, str]
) -> None:
    sid = (await api.post("/v1/schedules", alice, json=SCHEDULE)).body["id"]
    assert (await api.post(f"/v1/schedules/{sid}/resume", alice, json={})).status == 200
    assert (await api.post(f"/v1/schedules/{sid}/trigger", alice)).status == 201


# --- params and other enumerations held to their documented values ---------------------------

BAD_PARAMS = [
    # (provider, params, field)
    ("gpt", {"response_format": "xml"}, "params.response_format"),
    ("gpt", {"response_format": {"type": "yaml"}}, "params.response_format"),
    ("gpt", {"response_format": {"type": "json_schema"}}, "params.response_format"),
    ("gpt", {"response_format": "{" * 5000}, "params.response_format"),
    ("gpt", {"temperature": 3}, "params.temperature"),
    ("gpt", {"temperature": "nan"}, "params.temperature"),
    ("gpt", {"top_p": -0.1}, "params.top_p"),
    ("gpt", {"presence_penalty": 2.5}, "params.presence_penalty"),
    ("gpt", {"max_tokens": 0}, "params.max_tokens"),
    ("gpt", {"seed": "1e30"}, "params.seed"),
    ("echo", {"fail_rate": 1.5}, "params.fail_rate"),
    ("echo", {"fail_rate": "often"}, "params.fail_rate"),
    ("echo", {"fail_attempts": -1}, "params.fail_attempts"),
    ("echo", {"fail_attempts": 1.5}, "params.fail_attempts"),
    ("echo", {"fail_permanent": "maybe"}, "params.fail_permanent"),
    ("echo", {"latency": "forever"}, "params.latency"),
]
GOOD_PARAMS = [
    ("gpt", {"response_format": "json_object", "temperature": 2, "top_p": "0.5"}),
    ("gpt", {"response_format": {"type": "json_schema", "json_schema": {"name": "n"}}}),
    ("echo", {"fail_rate": "0.5", "fail_attempts": 2, "fail_permanent": True, "latency": "1s"}),
]


@pytest.mark.parametrize(("provider", "params", "field"), BAD_PARAMS)
async def test_params_outside_their_documented_values_are_refused_naming_the_param(
    api: Api, alice: dict[str, str], provider: str, params: dict[str, Any], field: str
) -> None:
    body = {**SCHEDULE, "provider": provider, "model": "m", "params": params}
    reply = await api.post("/v1/schedules", alice, json=body)
    assert (reply.status, reply.body["error"]["field"]) == (422, field), reply.body
    assert len(reply.body["error"]["message"]) < 300


@pytest.mark.parametrize(("provider", "params"), GOOD_PARAMS)
async def test_documented_param_values_are_accepted(
    api: Api, alice: dict[str, str], provider: str, params: dict[str, Any]
) -> None:
    body = {**SCHEDULE, "provider": provider, "model": "m", "params": params}
    reply = await api.post("/v1/schedules", alice, json=body)
    assert reply.status == 201, reply.body


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("POST", "/v1/schedules", {**SCHEDULE, "misfire": "later"}, "misfire"),
        ("POST", "/v1/schedules", {**SCHEDULE, "overlap": "sometimes"}, "overlap"),
        ("POST", "/v1/schedules", {**SCHEDULE, "dst_gap": "ignore"}, "dst_gap"),
        ("POST", "/v1/schedules", {**SCHEDULE, "dst_fold": "last"}, "dst_fold"),
        ("POST", "/v1/schedules", {**SCHEDULE, "kind": "hourly"}, "kind"),
        ("GET", "/v1/runs?status=done", None, "status"),
        ("GET", "/v1/preview?expression=*+*+*+*+*&kind=crontab", None, "kind"),
        ("GET", "/v1/preview?expression=*+*+*+*+*&dst_gap=later", None, "dst_gap"),
    ],
)
async def test_enumerated_fields_and_filters_take_only_their_values(
    api: Api, alice: dict[str, str], method: str, path: str, body: Any, field: str
) -> None:
    reply = await api.request(method, path, alice, json=body)
    assert (reply.status, reply.body["error"]["field"]) == (422, field), reply.body
    assert "must be one of" in reply.body["error"]["message"]


# --- trigger on a paused schedule -----------------------------------------------------------


async def test_triggering_a_paused_schedule_is_a_409_that_says_so_and_creates_nothing(
    api: Api, alice: dict[str, str], pool: asyncpg.Pool[Any]
) -> None:
    sid = (await api.post("/v1/schedules", alice, json=SCHEDULE)).body["id"]
    paused = await api.post(f"/v1/schedules/{sid}/pause", alice, json={"reason": "migration"})
    assert paused.status == 200
    before = await api_support.snapshot(pool)
    refused = await api.post(f"/v1/schedules/{sid}/trigger", alice)
    assert refused.status == 409, refused.body
    message = refused.body["error"]["message"]
    assert "paused" in message and "migration" in message and "resume" in message
    assert await api_support.snapshot(pool) == before

    assert (await api.post(f"/v1/schedules/{sid}/resume", alice)).status == 200
    run = await api.post(f"/v1/schedules/{sid}/trigger", alice)
    assert run.status == 201
    await factories.worker_pool(pool, Clock()).run_once()
    done = await api.get(f"/v1/runs/{run.body['id']}", alice)
    assert (done.body["status"], done.body["skip_reason"]) == ("succeeded", None)


# --- the event loop -------------------------------------------------------------------------


async def test_healthz_does_no_database_work(pool: asyncpg.Pool[Any]) -> None:
    """An app without a database at all still answers: nothing on /healthz can queue
    behind a busy pool."""
    app = api_app.build(None, Metrics(), lambda: True, mounts=(console_routes.mount,))  # type: ignore[arg-type]
    async with TestClient(TestServer(app)) as client:
        async with client.get("/healthz") as response:
            assert response.status == 200
            assert await response.json() == {"status": "ok"}


async def test_readyz_tells_an_anonymous_caller_no_driver_details(dsn: str) -> None:
    closed = await pools.create_pool(dsn, min_size=1, max_size=1)
    await closed.close()
    app = api_app.build(closed, Metrics(), lambda: True, mounts=(console_routes.mount,))
    async with TestClient(TestServer(app)) as client:
        async with client.get("/readyz") as response:
            assert response.status == 503
            body = await response.json()
    assert body == {"status": "unavailable", "error": "the database is unreachable"}


async def test_the_loop_probe_measures_how_long_the_loop_was_held() -> None:
    metrics = Metrics()
    probe = LoopProbe(metrics, interval=0.05)
    lags: list[float] = []

    async def probe_once() -> None:
        lags.append(await probe.run_once())

    async with anyio.create_task_group() as tg:
        tg.start_soon(probe_once)
        await anyio.wait_all_tasks_blocked()  # the probe is asleep
        held_until = time.monotonic() + 0.3
        while time.monotonic() < held_until:  # a computation that holds the loop
            pass
    assert lags[0] >= 0.25
    registry = metrics.registry
    assert registry.get_sample_value("promptsched_event_loop_lag_seconds_count") == 1
    assert (
        registry.get_sample_value("promptsched_event_loop_lag_seconds_bucket", {"le": "0.1"}) == 0
    )
    assert (registry.get_sample_value("promptsched_event_loop_lag_seconds_sum") or 0) >= 0.25


async def test_tokens_minted_here_look_like_what_the_log_redaction_looks_for() -> None:
    token = auth.new_token()
    line = json.dumps(
        {"header": f"Bearer {token}", "cookie": f"s={token}", "query": f"?t%3D{token}"}
    )
    assert token not in logs.redact(line) and token[4:] not in logs.redact(line)


# --- the console's params field parses the same way -----------------------------------------

CONSOLE_FORM = {
    "name": "n", "kind": "auto", "expression": "0 9 * * *", "timezone": "UTC", "prompt": "p",
    "provider": "echo", "model": "", "misfire": "run_once", "overlap": "skip",
    "max_attempts": "3", "timeout": "5m",
}  # fmt: skip


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ("[" * 5000 + "]" * 5000, "nests deeper than 32"),
        ('{"seed": ' + "7" * 5000 + "}", "5000 digits"),
        ('{"x": NaN}', "NaN is not JSON"),
        ('{"x": ', "line 1, column 7"),
    ],
    ids=["deep", "huge-integer", "nan", "truncated"],
)
async def test_the_consoles_params_field_fails_in_our_words_too(
    pool: asyncpg.Pool[Any], params: str, words: str
) -> None:
    async with console_support.console(pool) as ui:
        await ui.login_as("alice")
        page = await ui.post("/schedules/new", {**CONSOLE_FORM, "params": params})
    assert page.status == 422, page.text[:500]
    assert words in page.text
    assert not any(internal in page.text for internal in INTERNALS)
