"""The ``anthropic`` and ``gemini`` kinds in a real ``promptsched run`` (docs/providers.md): runs
through a real LiteLLM proxy's Anthropic-format and Gemini-format endpoints (tests/
litellm_support.py) succeed with the mock text and the usage the proxy reported, priced; a
refused key is dead after one attempt; a key limit's 429s kill no run; an ``anthropic``
schedule falls back to ``openai``, and an ``openai`` one to ``anthropic``. A server of ours
(tests/fakes/native_llm.py) sends what the proxy cannot: Gemini's ``RetryInfo`` and
Anthropic's 529, which the worker treats as weather."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests import litellm_support
from tests.fakes import native_llm
from tests.helpers import Service
from tests.test_executors_native import MOCK_TEXT, _reported_usage
from tests.test_provider_weather import _attempts, _burst, _metric, _settled, _statuses

pytestmark = pytest.mark.slow

PRICES = "claude=3/15, gem=0.30/2.50"


def _provider(name: str, kind: str, base_url: str, key: str, model: str) -> dict[str, str]:
    upper = name.upper()
    return {
        f"PROMPTSCHED_PROVIDER_{upper}_KIND": kind,
        f"PROMPTSCHED_PROVIDER_{upper}_BASE_URL": base_url,
        f"PROMPTSCHED_PROVIDER_{upper}_MODEL": model,
        f"PROMPTSCHED_PROVIDER_{upper}_API_KEY_ENV": f"KEY_{upper}",
        f"KEY_{upper}": key,
    }


def _env(*providers: dict[str, str], **extra: str) -> dict[str, str]:
    env: dict[str, str] = {"PROMPTSCHED_RETRY_BASE": "200ms", **extra}
    names = []
    for provider in providers:
        env.update(provider)
        names += [k.split("_")[2].lower() for k in provider if k.endswith("_KIND")]
    env["PROMPTSCHED_PROVIDERS"] = ",".join(names)
    return env


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[litellm_support.LiteLLMProxy]:
    running = litellm_support.LiteLLMProxy(tmp_path_factory.mktemp("litellm"))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
async def root(proxy: litellm_support.LiteLLMProxy) -> str:
    await proxy.ready()
    return proxy.base_url.removesuffix("/v1")


@pytest.fixture
async def native() -> AsyncIterator[native_llm.NativeLLM]:
    async with native_llm.start_native_llm() as server:
        yield server


def _answers(proxy: litellm_support.LiteLLMProxy, path: str) -> list[int]:
    """The statuses the proxy logged for ``path`` (uvicorn's access log), in order."""
    pattern = re.compile(rf'"POST {re.escape(path)} HTTP/1.1" (\d+)')
    return [int(m.group(1)) for m in pattern.finditer(proxy.log.read_text(errors="replace"))]


async def test_runs_through_the_proxy_succeed_priced_die_on_a_refused_key_and_fall_back(
    dsn: str,
    pool: asyncpg.Pool[Any],
    tmp_path: Path,
    proxy: litellm_support.LiteLLMProxy,
    root: str,
) -> None:
    env = _env(
        _provider("claude", "anthropic", root, "sk-free", "mock"),
        _provider("gem", "gemini", root, "sk-free", "mock"),
        _provider("wrong", "anthropic", root, "sk-refused", "mock"),
        _provider("tiny", "anthropic", root, "sk-tiny", "mock"),
        _provider("gpt", "openai", proxy.base_url, "sk-free", "mock"),
        _provider("gtiny", "openai", proxy.base_url, "sk-tiny", "mock"),
        PROMPTSCHED_PRICES=PRICES,
    )
    service = Service(dsn, tmp_path / "service.log", env=env, args=("--workers", "8"))
    try:
        await service.ready()
        claude = await _burst(pool, "claude", 1)
        gem = await _burst(pool, "gem", 1)
        wrong = await _burst(pool, "wrong", 1, max_attempts=3)
        tiny = await _burst(pool, "tiny", 4, fallback=["gpt"])
        for sid, count in ((claude, 1), (gem, 1), (wrong, 1), (tiny, 4)):
            await _settled(pool, sid, count, timeout=60)
        claude_tokens = await _metric(
            [service], "promptsched_llm_tokens_total", provider="claude", kind="prompt"
        )
        moved = await _metric(
            [service], "promptsched_provider_fallbacks_total",
            from_provider="tiny", to_provider="gpt",
        )  # fmt: skip
        back = await _burst(pool, "gtiny", 4, fallback=["claude"])  # and the other way
        await _settled(pool, back, 4, timeout=60)
    finally:
        service.stop()
    for sid, kind, (price_in, price_out) in ((claude, "anthropic", (3, 15)),
                                             (gem, "gemini", (0.30, 2.50))):  # fmt: skip
        run = await pool.fetchrow(
            "SELECT status, output, usage FROM runs WHERE schedule_id = $1", sid
        )
        assert run is not None and run["status"] == "succeeded" and run["output"] == MOCK_TEXT
        reported = await _reported_usage(root, kind)
        cost = reported["prompt_tokens"] * price_in + reported["completion_tokens"] * price_out
        assert run["usage"] == {**reported, "cost": pytest.approx(cost / 1_000_000)}, run["usage"]
    assert claude_tokens == (await _reported_usage(root, "anthropic"))["prompt_tokens"]
    # A refused key is the user's to fix: dead after one attempt of the three allowed.
    dead = await pool.fetchrow(
        "SELECT status, attempts, error FROM runs WHERE schedule_id = $1", wrong
    )
    assert dead is not None and (dead["status"], dead["attempts"]) == ("dead", 1)
    assert "HTTP 401" in dead["error"] and "sk-refused" not in dead["error"]
    # sk-tiny lets one request through per window; the runs it throttled went to openai.
    assert await _statuses(pool, tiny) == {"succeeded": 4}
    attempts = await _attempts(pool, tiny)
    on_gpt = [a for a in attempts if a["provider"] == "gpt" and a["status"] == "succeeded"]
    throttled = [a for a in attempts if a["throttled"]]
    assert on_gpt and throttled and all(a["provider"] == "tiny" for a in throttled)
    assert moved == len(on_gpt)
    assert 429 in _answers(proxy, "/v1/messages")
    assert await _statuses(pool, back) == {"succeeded": 4}
    winners = [a for a in await _attempts(pool, back) if a["status"] == "succeeded"]
    assert any(a["provider"] == "claude" for a in winners), winners


async def test_a_key_limit_on_the_messages_endpoint_kills_no_run(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path, proxy: litellm_support.LiteLLMProxy,
    root: str,
) -> None:  # fmt: skip
    """sk-limited allows 3 requests per 2 s: 4 runs of ONE counted attempt each, sent at once,
    all succeed; the proxy's 429s are throttled attempts, never counted. (Its 429s here carry
    no retry-after, so the fleet learns the allowance over a minute's window: a fifth run would
    wait ~20 s for its paced turn, and add nothing to what this test shows.)"""
    before = len(_answers(proxy, "/v1/messages"))
    env = _env(_provider("limited", "anthropic", root, "sk-limited", "mock"))
    service = Service(dsn, tmp_path / "service.log", env=env, args=("--workers", "8"))
    try:
        await service.ready()
        sid = await _burst(pool, "limited", 4)
        await _settled(pool, sid, 4, timeout=60)
    finally:
        service.stop()
    assert await _statuses(pool, sid) == {"succeeded": 4}
    throttled = [a for a in await _attempts(pool, sid) if a["throttled"]]
    answers = _answers(proxy, "/v1/messages")[before:]
    assert throttled and answers.count(429) == len(throttled) and answers.count(200) == 4
    assert all("HTTP 429" in a["error"] for a in throttled)


async def test_retry_info_and_overloaded_are_weather_for_the_worker(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path, native: native_llm.NativeLLM
) -> None:
    """Gemini's 429 asks for 1 s in its RetryInfo, Anthropic's 529 says overloaded: each run
    (one counted attempt) is throttled once and succeeds, the Gemini one no sooner than asked."""
    env = _env(
        _provider("gem", "gemini", native.base_url, native.key, "gemini-2.5-flash"),
        _provider("claude", "anthropic", native.base_url, native.key, "claude-sonnet-4-5"),
    )
    service = Service(dsn, tmp_path / "service.log", env=env, args=("--workers", "8"))
    try:
        await service.ready()
        native.script(native_llm.gemini_exhausted("1s"))
        gem = await _burst(pool, "gem", 1)
        await _settled(pool, gem, 1, timeout=30)
        native.script(native_llm.anthropic_overloaded())
        claude = await _burst(pool, "claude", 1)
        await _settled(pool, claude, 1, timeout=30)
    finally:
        service.stop()
    for sid in (gem, claude):
        assert await _statuses(pool, sid) == {"succeeded": 1}
        first, second = await _attempts(pool, sid)
        assert first["throttled"] and not second["throttled"]
    gem_first = (await _attempts(pool, gem))[0]
    assert gem_first["wait"].total_seconds() >= 1.0 and "retry after 1s" in gem_first["error"]
    arrivals = [r.at for r in native.requests if r.path.startswith("/v1beta/")]
    assert len(arrivals) == 2 and arrivals[1] - arrivals[0] >= 1.0, arrivals
    overloaded = (await _attempts(pool, claude))[0]
    assert "HTTP 529 Overloaded" in overloaded["error"]
