"""Connections are bounded, against a real ``promptsched run`` process and real sockets: 2,000
idle keep-alive connections and 100 slow senders (headers, or a body, a byte at a time) leave
``/healthz`` and another owner's API calls answering fast and are all closed by their
deadlines; the service started under systemd's default open-files limit (1,024) raises it to
the hard limit; past its cap of open connections a new one is answered 503 at once."""

from __future__ import annotations

import json
import re
import resource
import socket
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from promptsched import config as configuration
from promptsched import errors
from promptsched.api import protocol
from promptsched.web import auth, logins
from tests.helpers import Service, wait_until

DEPLOYING = Path(__file__).resolve().parent.parent / "docs" / "deploying.md"

IDLE, SLOW_HEADERS, SLOW_BODIES = 2000, 80, 20
SYSTEMD_SOFT_LIMIT = 1024
FAST = 0.1  # seconds: what /healthz and an API call must answer within, under that load
SAMPLES = 20


@dataclass
class Conn:
    """One client connection, read without blocking: what came back and when it closed."""

    sock: socket.socket
    kind: str
    opened: float = field(default_factory=time.monotonic)
    received: bytearray = field(default_factory=bytearray)
    closed: float | None = None

    def poll(self) -> None:
        while self.closed is None:
            try:
                chunk = self.sock.recv(65536)
            except BlockingIOError:
                return
            except OSError:  # reset by the server
                chunk = b""
            if not chunk:
                self.closed = time.monotonic()
                self.sock.close()
                return
            self.received += chunk

    def drip(self) -> None:
        """One more byte of a slow sender's headers or body (idle connections send nothing)."""
        data = {"slow_headers": b"X", "slow_body": b" "}.get(self.kind)
        if data and self.closed is None:
            try:
                self.sock.send(data)
            except OSError:
                self.poll()

    @property
    def status(self) -> int | None:
        line = bytes(self.received).split(b"\r\n", 1)[0].split()
        return int(line[1]) if len(line) > 1 else None


def _open(port: int, kind: str, first: bytes = b"") -> Conn:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    if first:
        sock.sendall(first)
    sock.setblocking(False)
    return Conn(sock, kind)


def _request(path: str, *, token: str | None = None, close: bool = True, extra: str = "") -> bytes:
    auth_line = f"Authorization: Bearer {token}\r\n" if token else ""
    connection = "close" if close else "keep-alive"
    head = f"GET {path} HTTP/1.1\r\nHost: t\r\n{auth_line}Connection: {connection}\r\n{extra}\r\n"
    return head.encode()


def exchange(port: int, request: bytes) -> tuple[float, int, dict[str, str], bytes]:
    """One request on a new connection: seconds to the whole answer, status, headers, body."""
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = bytearray()
        while chunk := sock.recv(65536):
            data += chunk
    took = time.perf_counter() - started
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return took, int(lines[0].split()[1]), headers, body


def scrape(port: int, series: str) -> float:
    """One series' value on ``/metrics`` (``name{label="value"}``)."""
    _, status, _, body = exchange(port, _request("/metrics"))
    assert status == 200
    for line in body.decode().splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} is not exported")


def _raise_own_open_files(needed: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.fail(f"this test needs a hard open-files limit of {needed} (ulimit -Hn): {hard}")
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    return hard


@pytest.fixture
def crowd() -> Iterator[list[Conn]]:
    conns: list[Conn] = []
    yield conns
    for conn in conns:
        conn.sock.close()


LIMITS = {"idle": 10.0, "headers": 5.0, "body": 5.0}  # the test's timeouts, in seconds
DEADLINE = {"idle": LIMITS["idle"], "slow_headers": LIMITS["headers"],
            "slow_body": LIMITS["body"]}  # fmt: skip


async def open_crowd(port: int, token: str, crowd: list[Conn]) -> None:
    """Half the idle connections never send a byte; the other half had one keep-alive request
    answered first. Slow senders send a request's first line at once, then a byte at a time:
    the rest of their headers, or a declared 2,000-byte body."""
    for index in range(IDLE):
        first = _request("/healthz", close=False) if index % 2 else b""
        crowd.append(_open(port, "idle", first))
    asked = crowd[1::2]

    async def answered() -> bool:  # the keep-alive requests, before anything is measured
        for conn in asked:
            conn.poll()
        return all(conn.status == 200 for conn in asked)

    await wait_until(answered, timeout=5, what="the idle connections' first answers")
    slow_body = (
        f"POST /v1/schedules HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\nContent-Length: 2000\r\n\r\n{"
    ).encode()
    for _ in range(SLOW_HEADERS):
        crowd.append(_open(port, "slow_headers", b"GET /healthz HTTP/1.1\r\n"))
    for _ in range(SLOW_BODIES):
        crowd.append(_open(port, "slow_body", slow_body))


def measure(port: int, token: str, crowd: list[Conn]) -> dict[str, list[float]]:
    """Seconds each ``/healthz`` and another owner's API call took on a new connection, while
    the crowd stays open and the slow senders keep sending (one of each first, not counted:
    the first answers after the crowd came in)."""
    exchange(port, _request("/healthz"))
    exchange(port, _request("/v1/schedules", token=token))
    timings: dict[str, list[float]] = {"healthz": [], "api": []}
    for _ in range(SAMPLES):
        for conn in crowd:
            conn.drip()
        took, status, _, _ = exchange(port, _request("/healthz"))
        assert status == 200
        timings["healthz"].append(took)
        took, status, _, body = exchange(port, _request("/v1/schedules", token=token))
        assert status == 200, body
        timings["api"].append(took)
    for conn in crowd:
        conn.poll()
    first_due = min(conn.opened + DEADLINE[conn.kind] for conn in crowd)
    assert time.monotonic() < first_due, "the machine is too slow to tell"
    early = [(c.kind, round(c.closed - c.opened, 2), bytes(c.received[:120])) for c in crowd
             if c.closed is not None]  # fmt: skip
    assert not early, f"closed before its deadline: {len(early)}, {early[:3]}"
    return timings


async def wait_all_closed(crowd: list[Conn]) -> None:
    """Every connection of the crowd closed by its deadline, the slow ones answered 408."""

    async def all_closed() -> bool:
        for conn in crowd:
            conn.drip()
            conn.poll()
        return all(conn.closed is not None for conn in crowd)

    await wait_until(all_closed, timeout=LIMITS["idle"] + 5, interval=0.5,
                     what="every idle and slow connection closed")  # fmt: skip
    for kind, due in DEADLINE.items():
        ends = [c.closed - c.opened for c in crowd if c.kind == kind and c.closed is not None]
        assert due - 0.5 <= min(ends) and max(ends) <= due + 3, (kind, sorted(ends)[-5:])
    for conn in crowd:
        if conn.kind == "idle":
            assert conn.status in (None, 200)  # nothing, or the answer it asked for
        else:
            assert conn.status == 408, (conn.kind, bytes(conn.received[:200]))
            assert b'"request_timeout"' in conn.received


@pytest.mark.slow
async def test_idle_and_slow_connections_are_closed_and_others_answer_fast(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path, crowd: list[Conn]
) -> None:
    hard = _raise_own_open_files(8192)
    token_a, _ = await auth.create_token(pool, owner="alice")  # the slow and idle clients
    token_b, _ = await auth.create_token(pool, owner="bob")
    service = Service(
        dsn,
        tmp_path / "service.log",
        env={
            "PROMPTSCHED_HTTP_IDLE_TIMEOUT": f"{LIMITS['idle']:g}s",
            "PROMPTSCHED_HTTP_HEADER_TIMEOUT": f"{LIMITS['headers']:g}s",
            "PROMPTSCHED_HTTP_BODY_TIMEOUT": f"{LIMITS['body']:g}s",
            "PROMPTSCHED_WORKERS": "1",
        },
        # as systemd starts a service: soft limit 1,024, a hard limit far above it
        command=("prlimit", f"--nofile={SYSTEMD_SOFT_LIMIT}:{hard}", sys.executable, "-m",
                 "promptsched"),
    )  # fmt: skip
    try:
        await service.ready()
        raised = await service.wait_event("supervisor.open_files")
        assert (raised["raised_from"], raised["limit"]) == (SYSTEMD_SOFT_LIMIT, hard)
        listening = await service.wait_event("api.listening")
        port = listening["port"]
        assert listening["max_connections"] == min(4096, hard // 2)

        await open_crowd(port, token_a, crowd)
        timings = measure(port, token_b, crowd)
        print(  # the numbers docs/deploying.md quotes: median and max, in ms
            {name: (round(statistics.median(ts) * 1000, 1), round(max(ts) * 1000, 1))
             for name, ts in timings.items()}
        )  # fmt: skip
        for name, taken in timings.items():
            # Each within 100 ms; one in twenty may meet the other programs of a shared machine.
            assert sorted(taken)[-2] < FAST and max(taken) < 5 * FAST, (name, taken)

        await wait_all_closed(crowd)
        took, status, _, _ = exchange(port, _request("/healthz"))
        assert status == 200 and took < FAST
        timeouts = "promptsched_http_request_timeouts_total"
        assert scrape(port, f'{timeouts}{{phase="headers"}}') == SLOW_HEADERS
        assert scrape(port, f'{timeouts}{{phase="body"}}') == SLOW_BODIES

        async def counted() -> bool:  # the scrape's own, once the last close is seen
            return scrape(port, "promptsched_http_connections") == 1

        await wait_until(counted, timeout=5, what="no connection left open")
    finally:
        service.stop()


@pytest.mark.slow
async def test_over_the_cap_a_connection_is_answered_503_at_once_and_healthz_200(
    dsn: str, tmp_path: Path, crowd: list[Conn]
) -> None:
    cap = 20
    service = Service(
        dsn, tmp_path / "service.log", env={"PROMPTSCHED_HTTP_MAX_CONNECTIONS": str(cap)}
    )
    try:
        await service.ready()
        listening = await service.wait_event("api.listening")
        port = listening["port"]
        # The documented defaults, as the process applies them (docs/deploying.md).
        assert listening["max_connections"] == cap
        assert (listening["idle_timeout"], listening["header_timeout"]) == (75.0, 10.0)
        assert listening["body_timeout"] == 60.0

        crowd.extend(_open(port, "idle") for _ in range(cap))
        asked = ["/readyz", "/v1/schedules", "/metrics", "/login", "/readyz"]
        answers = [exchange(port, _request(path)) for path in asked]
        assert [status for _, status, _, _ in answers] == [503] * 5
        taken = sorted(took for took, _, _, _ in answers)
        assert taken[2] < FAST and taken[-1] < 5 * FAST, taken  # at once, on a shared machine
        _, _, headers, body = answers[0]
        assert json.loads(body)["error"]["code"] == "busy"
        assert headers["retry-after"] == "1" and headers["connection"] == "close"
        assert headers["server"] == "promptsched"
        assert headers["x-content-type-options"] == "nosniff"
        await service.wait_event("api.connections_full", cap=cap)
        # The liveness probe alone is answered: the process is full, not dead.
        took, status, headers, _ = exchange(port, _request("/healthz", close=False))
        assert status == 200 and headers["connection"] == "close" and took < 5 * FAST

        # Over the cap, a connection that sends nothing is answered 503 after a second; past
        # the cap's overflow (16 here) a new one is closed at once, unanswered.
        silent = [_open(port, "silent") for _ in range(16)]
        crowd.extend(silent)
        refused = _open(port, "refused")
        crowd.append(refused)

        async def closed(conns: list[Conn]) -> bool:
            for conn in conns:
                conn.poll()
            return all(conn.closed is not None for conn in conns)

        await wait_until(lambda: closed([refused]), timeout=2, what="the refused connection")
        assert refused.received == b""
        await wait_until(lambda: closed(silent), timeout=5, what="the over-cap connections")
        assert all(conn.status == 503 for conn in silent)

        # Room again once some idle connections go.
        for conn in crowd[:5]:
            conn.sock.close()

        async def ready() -> bool:
            return exchange(port, _request("/readyz"))[1] == 200

        await wait_until(ready, timeout=5, what="/readyz served again")
        refused = "promptsched_http_connections_refused_total"
        # (the closes above may reach the server after a first /readyz of the wait: >=)
        assert scrape(port, f'{refused}{{reason="over_cap"}}') >= 5 + 1 + 16
        assert scrape(port, f'{refused}{{reason="overflow"}}') == 1

        async def counted() -> bool:  # the 15 idle connections left, and the scrape's own
            return scrape(port, "promptsched_http_connections") == cap - 5 + 1

        await wait_until(counted, timeout=5, what="the open connections counted")
    finally:
        service.stop()


def test_the_defaults_are_the_documented_ones() -> None:
    """docs/deploying.md's tables and words against what the code applies."""
    text = DEPLOYING.read_text()
    table = dict(re.findall(r"^\| `(PROMPTSCHED_[A-Z_]+)` \| `?([^`|]+?)`? \|", text, re.M))
    config = configuration.load({}).api
    limits = protocol.Limits()
    assert table["PROMPTSCHED_HTTP_IDLE_TIMEOUT"] == "75s"
    assert config.idle_timeout.total_seconds() == limits.idle == 75
    assert table["PROMPTSCHED_HTTP_HEADER_TIMEOUT"] == "10s"
    assert config.header_timeout.total_seconds() == limits.headers == 10
    assert table["PROMPTSCHED_HTTP_BODY_TIMEOUT"] == "60s"
    assert config.body_timeout.total_seconds() == limits.body == 60
    assert table["PROMPTSCHED_HTTP_MAX_CONNECTIONS"] == "4096"
    assert config.max_connections == limits.max_connections == 4096
    assert table["PROMPTSCHED_TRUSTED_PROXIES"] == "(none)" and config.trusted_proxies == ()
    # what the words say: half the open-files limit, an eighth of the cap over it, the backlog
    assert limits.cap(1024) == 512 and limits.cap(1_048_576) == 4096
    assert "an eighth of the cap (16 at least)" in text and "backlog of 1,024" in text
    assert protocol.BACKLOG == 1024 and protocol.OVER_CAP_GRACE == 1.0
    said = ("the first 5 failures cost nothing", "wait 1 s", "at most 60 s", "15 minutes",
            "at most 10,000 clients", "max-age=31536000")  # fmt: skip
    assert all(words in " ".join(text.split()) for words in said), said
    assert (logins.FREE, logins.FIRST, logins.LONGEST) == (5, 1.0, 60.0)
    assert (logins.FORGET, logins.CLIENTS) == (15 * 60, 10_000)


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("PROMPTSCHED_HTTP_IDLE_TIMEOUT", "0", "between 100ms and 1h"),
        ("PROMPTSCHED_HTTP_HEADER_TIMEOUT", "2h", "between 100ms and 1h"),
        ("PROMPTSCHED_HTTP_BODY_TIMEOUT", "soon", "soon"),
        ("PROMPTSCHED_HTTP_MAX_CONNECTIONS", "0", "between 1 and 1000000"),
        ("PROMPTSCHED_HTTP_MAX_CONNECTIONS", "many", "whole number"),
        ("PROMPTSCHED_TRUSTED_PROXIES", "proxy.internal", "is a host name"),
        ("PROMPTSCHED_TRUSTED_PROXIES", "10.0.0.1/8", "did you mean 10.0.0.0/8"),
    ],
)
def test_a_bad_limit_or_proxy_list_is_refused_naming_its_variable(
    variable: str, value: str, said: str
) -> None:
    with pytest.raises(errors.ConfigError) as refused:
        configuration.load({"HOME": "/nonexistent", variable: value})
    assert variable in str(refused.value) and said in str(refused.value), str(refused.value)
