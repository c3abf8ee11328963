"""Provider configuration from the environment and TOML: values, precedence, errors that name
the variable or key, secrets that never show, and the registry built from it."""

from __future__ import annotations

import copy
import pickle
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from promptsched import netguard
from promptsched.errors import ConfigError
from promptsched.executors import echo, openai, providers, settings, webhook_provider
from promptsched.secret import Secret

KEY = "sk-live-abcdef0123456789"


def test_echo_is_always_present() -> None:
    providers = settings.parse_providers({})
    assert list(providers) == ["echo"]
    assert providers["echo"].kind == "echo"
    assert providers["echo"].max_concurrency == settings.ECHO_MAX_CONCURRENCY


def test_providers_from_the_environment() -> None:
    env = {
        "PROMPTSCHED_PROVIDERS": "openai, local-llm,hook",
        "PROMPTSCHED_PROVIDER_OPENAI_API_KEY_ENV": "OPENAI_API_KEY",
        "OPENAI_API_KEY": KEY,
        "PROMPTSCHED_PROVIDER_OPENAI_MODEL": "gpt-4o-mini",
        "PROMPTSCHED_PROVIDER_OPENAI_TIMEOUT": "45s",
        "PROMPTSCHED_PROVIDER_OPENAI_CONNECT_TIMEOUT": "500ms",
        "PROMPTSCHED_PROVIDER_OPENAI_MAX_CONCURRENCY": "4",
        "PROMPTSCHED_PROVIDER_OPENAI_RATE": "2.5",
        "PROMPTSCHED_PROVIDER_OPENAI_TOKENS_PER_MINUTE": "90000",
        "PROMPTSCHED_PROVIDER_LOCAL_LLM_KIND": "openai",
        "PROMPTSCHED_PROVIDER_LOCAL_LLM_BASE_URL": "http://localhost:11434/v1/",
        "PROMPTSCHED_PROVIDER_HOOK_KIND": "webhook",
        "PROMPTSCHED_PROVIDER_HOOK_BASE_URL": "https://hooks.example.com/llm",
    }
    providers = settings.parse_providers(env)

    assert sorted(providers) == ["echo", "hook", "local-llm", "openai"]
    main = providers["openai"]
    assert main.kind == "openai"
    assert main.base_url == settings.DEFAULT_OPENAI_URL
    assert main.api_key is not None and main.api_key.reveal() == KEY
    assert main.api_key_env == "OPENAI_API_KEY"
    assert main.default_model == "gpt-4o-mini"
    assert main.request_timeout == timedelta(seconds=45)
    assert main.connect_timeout == timedelta(milliseconds=500)
    assert main.max_concurrency == 4
    assert main.rate_per_second == 2.5
    assert main.tokens_per_minute == 90_000
    local = providers["local-llm"]
    assert local.tokens_per_minute is None  # no limit unless set
    assert (local.kind, local.base_url, local.api_key) == (
        "openai",
        "http://localhost:11434/v1",
        None,
    )
    assert providers["hook"].kind == "webhook"
    assert providers["hook"].base_url == "https://hooks.example.com/llm"


def test_providers_from_toml_with_env_overrides() -> None:
    toml = {  # the config file's [providers.NAME] sections
        "fast": {
            "kind": "openai",
            "base_url": "https://llm.internal/v1",
            "api_key_env": "FAST_KEY",
            "default_model": "small",
            "timeout": 30,
            "connect_timeout": "2s",
            "max_concurrency": 16,
            "rate_per_second": 10,
            "tokens_per_minute": 30000,
            "headers": {"X-Team": "data"},
        }
    }
    env = {
        "FAST_KEY": KEY,
        "PROMPTSCHED_PROVIDER_FAST_MODEL": "large",
        "PROMPTSCHED_PROVIDER_FAST_MAX_CONCURRENCY": "2",
    }
    fast = settings.parse_providers(env, toml)["fast"]

    assert fast.default_model == "large"  # env wins
    assert fast.max_concurrency == 2
    assert fast.request_timeout == timedelta(seconds=30)  # TOML numbers are seconds
    assert fast.connect_timeout == timedelta(seconds=2)
    assert fast.rate_per_second == 10.0
    assert fast.tokens_per_minute == 30_000
    assert dict(fast.headers) == {"X-Team": "data"}
    assert fast.api_key == Secret(KEY)


def test_a_short_timeout_also_bounds_the_default_connect_timeout() -> None:
    env = {"PROMPTSCHED_PROVIDERS": "openai", "PROMPTSCHED_PROVIDER_OPENAI_TIMEOUT": "3s"}
    provider = settings.parse_providers(env)["openai"]
    assert provider.request_timeout == provider.connect_timeout == timedelta(seconds=3)


ENV_ERRORS: list[tuple[dict[str, str], str, str]] = [
    (
        {"PROMPTSCHED_PROVIDERS": "llm"},
        "PROMPTSCHED_PROVIDER_LLM_KIND",
        "needs a kind: openai, anthropic, gemini, webhook, echo",
    ),
    (
        {"PROMPTSCHED_PROVIDERS": "llm", "PROMPTSCHED_PROVIDER_LLM_KIND": "claude"},
        "PROMPTSCHED_PROVIDER_LLM_KIND",
        "unknown kind 'claude'",
    ),
    (
        {"PROMPTSCHED_PROVIDERS": "openai", "PROMPTSCHED_PROVIDER_OPENAI_BASE_URL": "ftp://x"},
        "PROMPTSCHED_PROVIDER_OPENAI_BASE_URL",
        "not an http(s) URL",
    ),
    (
        {"PROMPTSCHED_PROVIDERS": "webhook"},
        "PROMPTSCHED_PROVIDER_WEBHOOK_BASE_URL",
        "a webhook provider needs a URL",
    ),
    (
        {"PROMPTSCHED_PROVIDERS": "openai", "PROMPTSCHED_PROVIDER_OPENAI_API_KEY_ENV": "NOPE"},
        "PROMPTSCHED_PROVIDER_OPENAI_API_KEY_ENV",
        "environment variable NOPE is not set or empty",
    ),
    (
        {"PROMPTSCHED_PROVIDERS": "openai", "PROMPTSCHED_PROVIDER_OPENAI_TIMEOUT": "soon"},
        "PROMPTSCHED_PROVIDER_OPENAI_TIMEOUT",
        "not a duration",
    ),
    (
        {"PROMPTSCHED_PROVIDERS": "openai", "PROMPTSCHED_PROVIDER_OPENAI_TIMEOUT": "0s"},
        "PROMPTSCHED_PROVIDER_OPENAI_TIMEOUT",
        "must be positive",
    ),
    (
        {
            "PROMPTSCHED_PROVIDERS": "openai",
            "PROMPTSCHED_PROVIDER_OPENAI_TIMEOUT": "5s",
            "PROMPTSCHED_PROVIDER_OPENAI_CONNECT_TIMEOUT": "10s",
        },
        "PROMPTSCHED_PROVIDER_OPENAI_CONNECT_TIMEOUT",
        "must not exceed the timeout",
    ),
    (
        {"PROMPTSCHED_PROVIDERS": "openai", "PROMPTSCHED_PROVIDER_OPENAI_MAX_CONCURRENCY": "0"},
        "PROMPTSCHED_PROVIDER_OPENAI_MAX_CONCURRENCY",
        "must be at least 1",
    ),
    (
        {"PROMPTSCHED_PROVIDERS": "openai", "PROMPTSCHED_PROVIDER_OPENAI_MAX_CONCURRENCY": "x"},
        "PROMPTSCHED_PROVIDER_OPENAI_MAX_CONCURRENCY",
        "must be a whole number",
    ),
    (
        {"PROMPTSCHED_PROVIDERS": "openai", "PROMPTSCHED_PROVIDER_OPENAI_RATE": "-1"},
        "PROMPTSCHED_PROVIDER_OPENAI_RATE",
        "must be a positive number",
    ),
    (
        {"PROMPTSCHED_PROVIDERS": "openai", "PROMPTSCHED_PROVIDER_OPENAI_TOKENS_PER_MINUTE": "0"},
        "PROMPTSCHED_PROVIDER_OPENAI_TOKENS_PER_MINUTE",
        "must be at least 1",
    ),
    (
        {"PROMPTSCHED_PROVIDERS": "openai", "PROMPTSCHED_PROVIDER_OPENAI_TOKENS_PER_MINUTE": "9k"},
        "PROMPTSCHED_PROVIDER_OPENAI_TOKENS_PER_MINUTE",
        "must be a whole number",
    ),
    (
        {"PROMPTSCHED_PROVIDERS": "OpenAI"},
        "PROMPTSCHED_PROVIDERS",
        "must be lowercase",
    ),
    (
        {"PROMPTSCHED_PROVIDERS": "a-b,a_b"},
        "PROMPTSCHED_PROVIDERS",
        "share PROMPTSCHED_PROVIDER_A_B_*",
    ),
    (
        {"PROMPTSCHED_PROVIDER_OPENAI_MODEL": "gpt"},
        "PROMPTSCHED_PROVIDER_OPENAI_MODEL",
        "not a setting of a configured provider",
    ),
    (
        {"PROMPTSCHED_PROVIDERS": "openai", "PROMPTSCHED_PROVIDER_OPENAI_BASEURL": "http://x"},
        "PROMPTSCHED_PROVIDER_OPENAI_BASEURL",
        "settings: KIND, BASE_URL",
    ),
]


@pytest.mark.parametrize(("env", "field", "message"), ENV_ERRORS)
def test_env_errors_name_the_variable(env: dict[str, str], field: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        settings.parse_providers(env)
    assert caught.value.field == field
    assert message in caught.value.message


TOML_ERRORS: list[tuple[Any, str, str]] = [
    ({"x": {"kind": "webhook"}}, "providers.x.base_url", "needs a URL"),
    ({"x": {"base_url": "http://h"}}, "providers.x.kind", "needs a kind"),
    ({"openai": {"model": "m"}}, "providers.openai.model", "'default_model'"),
    ({"openai": {"timout": "1s"}}, "providers.openai.timout", "'timeout'"),
    ({"openai": {"max_concurrency": True}}, "providers.openai.max_concurrency", "whole number"),
    ({"openai": {"tpm": 1000}}, "providers.openai.tpm", "'tokens_per_minute'"),
    ({"openai": {"headers": {"X": 1}}}, "providers.openai.headers", "string"),
    ({"openai": "yes"}, "providers.openai", "must be a table"),
    ({"Big": {"kind": "echo"}}, "providers.Big", "must be lowercase"),
    (["openai"], "providers", "must be a table"),
]


@pytest.mark.parametrize(("toml", "field", "message"), TOML_ERRORS)
def test_toml_errors_name_the_key(toml: Any, field: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        settings.parse_providers({}, toml)
    assert caught.value.field == field
    assert message in caught.value.message


@pytest.mark.parametrize(
    ("env", "toml", "field"),
    [
        ({}, {"openai": {"api_key": KEY}}, "providers.openai.api_key"),
        (
            {"PROMPTSCHED_PROVIDERS": "openai", "PROMPTSCHED_PROVIDER_OPENAI_API_KEY_ENV": KEY},
            None,
            "PROMPTSCHED_PROVIDER_OPENAI_API_KEY_ENV",
        ),
        (
            {"PROMPTSCHED_PROVIDERS": "openai", "PROMPTSCHED_PROVIDER_OPENAI_API_KEY": KEY},
            None,
            "PROMPTSCHED_PROVIDER_OPENAI_API_KEY",
        ),
        (
            {
                "PROMPTSCHED_PROVIDERS": "openai",
                "PROMPTSCHED_PROVIDER_OPENAI_BASE_URL": f"https://user:{KEY}@api.example.com",
            },
            None,
            "PROMPTSCHED_PROVIDER_OPENAI_BASE_URL",
        ),
    ],
)
def test_a_key_in_the_wrong_place_is_rejected_without_echoing_it(
    env: dict[str, str], toml: dict[str, Any] | None, field: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        settings.parse_providers(env, toml)
    assert caught.value.field == field
    assert KEY not in str(caught.value)


def test_secrets_never_show_in_reprs() -> None:
    env = {
        "PROMPTSCHED_PROVIDERS": "openai",
        "PROMPTSCHED_PROVIDER_OPENAI_API_KEY_ENV": "K",
        "K": KEY,
    }
    provider = settings.parse_providers(env)["openai"]
    secret = provider.api_key
    assert secret is not None
    for text in (
        repr(provider),
        str(provider),
        repr(secret),
        str(secret),
        f"{secret}",
        f"{secret!r:>40}",
    ):
        assert KEY not in text
    assert "api_key=Secret('********')" in repr(provider)
    assert secret.redact(f"bad key {KEY}!") == "bad key ********!"
    assert copy.deepcopy(secret) is secret
    with pytest.raises(TypeError):
        pickle.dumps(secret)


@given(st.text(min_size=1).filter(lambda value: value not in "Secret('********')"))
def test_no_secret_value_shows_in_its_repr(value: str) -> None:
    secret = Secret(value)
    assert value not in repr(secret) and value not in str(secret)
    assert secret.reveal() == value


async def test_build_registry_makes_executors_and_limiters() -> None:
    env = {
        "PROMPTSCHED_PROVIDERS": "openai,hook,demo",
        "PROMPTSCHED_PROVIDER_OPENAI_MAX_CONCURRENCY": "3",
        "PROMPTSCHED_PROVIDER_OPENAI_RATE": "5",
        "PROMPTSCHED_PROVIDER_HOOK_KIND": "webhook",
        "PROMPTSCHED_PROVIDER_HOOK_BASE_URL": "http://127.0.0.1:9/hook",
        "PROMPTSCHED_PROVIDER_DEMO_KIND": "echo",
        "PROMPTSCHED_PROVIDER_DEMO_TOKENS_PER_MINUTE": "6000",
    }
    loopback = netguard.Allowlist.parse("127.0.0.1/32", variable=netguard.WEBHOOK_ALLOW)
    registry, limiters = providers.build_registry(
        settings.parse_providers(env), webhook_allow=loopback
    )
    try:
        assert registry.names() == ["demo", "echo", "hook", "openai"]
        assert isinstance(registry.get("openai"), openai.OpenAIExecutor)
        assert isinstance(registry.get("hook"), webhook_provider.WebhookExecutor)
        assert isinstance(registry.get("demo"), echo.EchoExecutor)
        assert registry.get("demo").name == "demo"
        assert registry.get("echo").name == "echo"
        assert limiters["openai"].max_concurrency == 3
        assert limiters["openai"].rate_per_second == 5.0
        assert limiters["openai"].tokens_per_minute is None
        # A tokens-per-minute limit makes an echo provider's limits fleet-wide.
        assert (limiters["demo"].tokens_per_minute, limiters["demo"].fleet) == (6000, True)
        assert not limiters["echo"].fleet
        assert limiters["echo"].max_concurrency == settings.ECHO_MAX_CONCURRENCY
    finally:
        await registry.aclose()
