"""Provider configuration: named providers read from TOML ``[providers.NAME]`` tables and
``PROMPTSCHED_PROVIDER_<NAME>_*`` variables, validated once at startup, and the registry built
from them."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from types import MappingProxyType
from typing import Any, Literal, cast
from urllib.parse import urlsplit

from promptsched import netguard
from promptsched.durations import parse_duration
from promptsched.errors import ConfigError, ValidationError
from promptsched.secret import Secret

Kind = Literal["openai", "anthropic", "gemini", "webhook", "echo"]
KINDS: tuple[Kind, ...] = ("openai", "anthropic", "gemini", "webhook", "echo")
# The kinds that speak an LLM API (they take generation params, output schemas and agent runs).
CHAT_KINDS: tuple[Kind, ...] = ("openai", "anthropic", "gemini")
DEFAULT_OPENAI_URL = "https://api.openai.com/v1"
DEFAULT_URLS: Mapping[str, str] = MappingProxyType({
    "openai": DEFAULT_OPENAI_URL,
    "anthropic": "https://api.anthropic.com",
    "gemini": "https://generativelanguage.googleapis.com",
})  # fmt: skip
# The ``anthropic-version`` header an anthropic provider sends unless ``api_version`` says.
DEFAULT_ANTHROPIC_VERSION = "2023-06-01"
DEFAULT_CONNECT_TIMEOUT = timedelta(seconds=10)
DEFAULT_TIMEOUT = timedelta(seconds=120)
DEFAULT_MAX_CONCURRENCY = 8
ECHO_MAX_CONCURRENCY = 1000
ENV_LIST = "PROMPTSCHED_PROVIDERS"
ENV_PREFIX = "PROMPTSCHED_PROVIDER_"

# TOML key -> environment suffix (None: TOML only).
_KEYS: dict[str, str | None] = {
    "kind": "KIND",
    "base_url": "BASE_URL",
    "api_key_env": "API_KEY_ENV",
    "default_model": "MODEL",
    "timeout": "TIMEOUT",
    "connect_timeout": "CONNECT_TIMEOUT",
    "max_concurrency": "MAX_CONCURRENCY",
    "rate_per_second": "RATE",
    "tokens_per_minute": "TOKENS_PER_MINUTE",
    "structured_output": "STRUCTURED_OUTPUT",
    "probe": "PROBE",
    "api_version": "API_VERSION",
    "headers": None,
}
# How a provider is asked for an answer in a schedule's output_schema (docs/monitors.md):
# openai: strict json_schema where the schema allows it, json_schema, or the json_object
# fallback (the schema in the conversation); anthropic and gemini: their own way (a forced
# tool, a response schema) unless json_object; every answer is checked here anyway.
StructuredOutput = Literal["strict", "json_schema", "json_object"]
STRUCTURED_OUTPUTS: tuple[StructuredOutput, ...] = ("strict", "json_schema", "json_object")
_HINTS = {
    "model": "default_model",
    "request_timeout": "timeout",
    "rate": "rate_per_second",
    "concurrency": "max_concurrency",
    "tpm": "tokens_per_minute",
    "url": "base_url",
}
# The settings that make a provider's limits fleet-wide when set on ``echo``.
_LIMITS = ("max_concurrency", "rate_per_second", "tokens_per_minute")
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class ProviderSettings:
    """One named provider. ``api_key`` was read from the variable named by ``api_key_env``."""

    name: str
    kind: Kind
    base_url: str | None = None
    api_key: Secret | None = None
    api_key_env: str | None = None
    default_model: str | None = None
    connect_timeout: timedelta = DEFAULT_CONNECT_TIMEOUT
    request_timeout: timedelta = DEFAULT_TIMEOUT
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    rate_per_second: float | None = None
    # LLM tokens (prompt + completion, as the provider reports them) per minute, fleet-wide.
    tokens_per_minute: int | None = None
    # The limits hold for the whole fleet (checked in Postgres at claim time): always for a
    # real provider; for ``echo`` only when a limit was set (its default is a local cap).
    fleet: bool = True
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    structured_output: StructuredOutput = "strict"
    # `promptsched doctor` sends it one cheap request (the model list); false: never.
    probe: bool = True
    # anthropic: the ``anthropic-version`` header it sends
    api_version: str | None = None
    # Where base_url was set (TOML key or variable), for startup errors about it.
    base_url_field: str | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class _Value:
    value: Any
    field: str  # where it came from, for error messages


def _env_prefix(name: str) -> str:
    return f"{ENV_PREFIX}{name.upper().replace('-', '_')}_"


def variable(provider: str, setting: str) -> str:
    """The environment variable of one of a provider's settings, e.g.
    ``PROMPTSCHED_PROVIDER_OPENAI_RATE`` for ``("openai", "rate")``."""
    return _env_prefix(provider) + setting.upper()


def _check_name(name: str, field_name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ConfigError(
            field_name, f"provider name {name!r} must be lowercase letters, digits, '-' or '_'"
        )
    return name


def _toml_tables(providers: Mapping[str, Any] | None) -> dict[str, dict[str, _Value]]:
    providers = {} if providers is None else providers
    if not isinstance(providers, Mapping):
        raise ConfigError("providers", "must be a table of [providers.NAME] tables")
    tables: dict[str, dict[str, _Value]] = {}
    for name, table in providers.items():
        where = f"providers.{name}"
        _check_name(str(name), where)
        if not isinstance(table, Mapping):
            raise ConfigError(where, "must be a table (kind, base_url, api_key_env, ...)")
        for key in table:
            _check_toml_key(str(key), f"{where}.{key}")
        tables[name] = {key: _Value(value, f"{where}.{key}") for key, value in table.items()}
    return tables


def _check_toml_key(key: str, where: str) -> None:
    if key in _KEYS:
        return
    if key == "api_key":
        raise ConfigError(
            where,
            "API keys are never read from the config file; set api_key_env to the name of "
            "an environment variable that holds the key",
        )
    close = _HINTS.get(key) or next(iter(difflib.get_close_matches(key, list(_KEYS), n=1)), None)
    hint = f" (did you mean {close!r}?)" if close else ""
    raise ConfigError(where, f"unknown setting{hint}; known: {', '.join(_KEYS)}")


def _env_tables(env: Mapping[str, str], known: set[str]) -> dict[str, dict[str, _Value]]:
    listed = [part.strip() for part in env.get(ENV_LIST, "").split(",") if part.strip()]
    names = sorted(known | {_check_name(name, ENV_LIST) for name in listed})
    prefixes: dict[str, str] = {}
    for name in names:
        prefix = _env_prefix(name)
        if prefix in prefixes:
            raise ConfigError(
                ENV_LIST, f"providers {prefixes[prefix]!r} and {name!r} share {prefix}*"
            )
        prefixes[prefix] = name
    tables: dict[str, dict[str, _Value]] = {name: {} for name in listed}
    suffixes = {suffix: key for key, suffix in _KEYS.items() if suffix}
    for variable, value in env.items():
        if not variable.startswith(ENV_PREFIX):
            continue
        for prefix, name in prefixes.items():
            key = suffixes.get(variable[len(prefix) :]) if variable.startswith(prefix) else None
            if key is not None:
                tables.setdefault(name, {})[key] = _Value(value, variable)
                break
        else:
            raise _stray_variable(variable, names, list(suffixes))
    return tables


def _stray_variable(variable: str, names: list[str], suffixes: list[str]) -> ConfigError:
    # Never echo the value: a stray ..._API_KEY variable holds a key.
    if variable.endswith("_API_KEY"):
        return ConfigError(
            variable,
            "API keys are read from the variable named by ..._API_KEY_ENV "
            "(e.g. PROMPTSCHED_PROVIDER_OPENAI_API_KEY_ENV=OPENAI_API_KEY)",
        )
    return ConfigError(
        variable,
        f"not a setting of a configured provider (providers: {', '.join(names) or 'none'}; "
        f"list names in {ENV_LIST}; settings: {', '.join(suffixes)})",
    )


def parse_providers(
    env: Mapping[str, str], toml: Mapping[str, Any] | None = None
) -> dict[str, ProviderSettings]:
    """Every configured provider by name; ``echo`` is always present.

    ``toml`` is the config file's ``providers`` table (``{NAME: {kind: ..., ...}}``, from
    ``[providers.NAME]`` sections). Environment values override TOML ones key by key.
    Raises ``ConfigError`` naming the variable or key.
    """
    tables = _toml_tables(toml)
    for name, overrides in _env_tables(env, set(tables)).items():
        tables.setdefault(name, {}).update(overrides)
    providers = {name: _build(name, raw, env) for name, raw in sorted(tables.items())}
    providers.setdefault("echo", _build("echo", {}, env))
    return providers


def _missing_field(name: str, raw: Mapping[str, _Value], key: str) -> str:
    """Where the user should add a missing setting: the TOML table it came from, else env."""
    if any(item.field.startswith("providers.") for item in raw.values()):
        return f"providers.{name}.{key}"
    return f"{_env_prefix(name)}{_KEYS[key]}"


def _kind(name: str, raw: Mapping[str, _Value]) -> Kind:
    item = raw.get("kind")
    if item is None:
        if name in KINDS:
            return name
        message = f"provider {name!r} needs a kind: {', '.join(KINDS)}"
        raise ConfigError(_missing_field(name, raw, "kind"), message)
    if item.value not in KINDS:
        raise ConfigError(item.field, f"unknown kind {item.value!r}; use one of {', '.join(KINDS)}")
    return cast(Kind, item.value)


def _build(name: str, raw: Mapping[str, _Value], env: Mapping[str, str]) -> ProviderSettings:
    kind = _kind(name, raw)
    default_concurrency = ECHO_MAX_CONCURRENCY if kind == "echo" else DEFAULT_MAX_CONCURRENCY
    connect_timeout = _duration(raw.get("connect_timeout"), DEFAULT_CONNECT_TIMEOUT)
    request_timeout = _duration(raw.get("timeout"), DEFAULT_TIMEOUT)
    if connect_timeout > request_timeout:
        if "connect_timeout" in raw:
            raise ConfigError(raw["connect_timeout"].field, "must not exceed the timeout")
        connect_timeout = request_timeout  # a short timeout bounds the default connect one
    api_key_env = _api_key_env(raw.get("api_key_env"))
    return ProviderSettings(
        name=name,
        kind=kind,
        base_url=_base_url(kind, name, raw),
        api_key=_api_key(raw.get("api_key_env"), api_key_env, env),
        api_key_env=api_key_env,
        default_model=_text(raw.get("default_model")),
        connect_timeout=connect_timeout,
        request_timeout=request_timeout,
        max_concurrency=_positive_int(raw.get("max_concurrency"), default_concurrency),
        rate_per_second=_rate(raw.get("rate_per_second")),
        tokens_per_minute=_optional_positive_int(raw.get("tokens_per_minute")),
        fleet=kind != "echo" or any(key in raw for key in _LIMITS),
        headers=_headers(raw.get("headers")),
        structured_output=_structured_output(raw.get("structured_output")),
        probe=_flag(raw.get("probe"), default=True),
        api_version=_api_version(kind, raw.get("api_version")),
        base_url_field=raw["base_url"].field if "base_url" in raw else None,
    )


def _text(item: _Value | None) -> str | None:
    if item is None:
        return None
    if not isinstance(item.value, str) or not item.value.strip():
        raise ConfigError(item.field, "must be a non-empty string")
    return item.value.strip()


def _base_url(kind: Kind, name: str, raw: Mapping[str, _Value]) -> str | None:
    item = raw.get("base_url")
    url = _text(item)
    if url is None:
        if kind == "webhook":
            raise ConfigError(
                _missing_field(name, raw, "base_url"), "a webhook provider needs a URL"
            )
        return DEFAULT_URLS.get(kind)
    assert item is not None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(item.field, f"not an http(s) URL: {url!r}")
    if parts.username or parts.password:
        # Do not echo the URL: it holds a credential.
        raise ConfigError(item.field, "credentials in the URL are not allowed; use api_key_env")
    return url.rstrip("/") if kind in CHAT_KINDS else url


def _api_version(kind: Kind, item: _Value | None) -> str | None:
    version = _text(item)
    if kind != "anthropic":
        if item is not None:
            raise ConfigError(item.field, "only an anthropic provider has an API version")
        return None
    return version or DEFAULT_ANTHROPIC_VERSION


def _api_key_env(item: _Value | None) -> str | None:
    variable = _text(item)
    if variable is not None and not _ENV_NAME.fullmatch(variable):
        assert item is not None
        # Do not echo the value: someone may have pasted the key itself here.
        raise ConfigError(
            item.field, "must be the NAME of an environment variable (e.g. OPENAI_API_KEY)"
        )
    return variable


def _api_key(item: _Value | None, variable: str | None, env: Mapping[str, str]) -> Secret | None:
    if item is None or variable is None:
        return None
    value = env.get(variable, "")
    if not value.strip():
        raise ConfigError(item.field, f"environment variable {variable} is not set or empty")
    return Secret(value.strip())


def _convert(item: _Value, convert: Callable[[Any], Any], expected: str) -> Any:
    if isinstance(item.value, bool):
        raise ConfigError(item.field, f"must be {expected}, got {item.value!r}")
    try:
        return convert(item.value)
    except (TypeError, ValueError):
        raise ConfigError(item.field, f"must be {expected}, got {item.value!r}") from None


def _duration(item: _Value | None, default: timedelta) -> timedelta:
    if item is None:
        return default
    try:
        value = _convert(item, lambda v: parse_duration(str(v), field=item.field), "a duration")
    except ValidationError as exc:
        raise ConfigError(item.field, exc.message) from None
    if value <= timedelta(0):
        raise ConfigError(item.field, "must be positive")
    return cast(timedelta, value)


def _positive_int(item: _Value | None, default: int) -> int:
    if item is None:
        return default
    value = _convert(item, lambda v: int(str(v).strip()), "a whole number")
    if value < 1:
        raise ConfigError(item.field, "must be at least 1")
    return cast(int, value)


def _optional_positive_int(item: _Value | None) -> int | None:
    if item is None or (isinstance(item.value, str) and not item.value.strip()):
        return None
    return _positive_int(item, 1)


def _rate(item: _Value | None) -> float | None:
    if item is None or (isinstance(item.value, str) and not item.value.strip()):
        return None
    value = _convert(item, float, "requests per second (a number)")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(item.field, "must be a positive number (unset it for no rate limit)")
    return cast(float, value)


def _flag(item: _Value | None, *, default: bool) -> bool:
    if item is None:
        return default
    if isinstance(item.value, bool):
        return item.value
    text = str(item.value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(item.field, f"must be true or false, got {item.value!r}")


def _structured_output(item: _Value | None) -> StructuredOutput:
    if item is None:
        return "strict"
    value = str(item.value).strip().lower()
    if value not in STRUCTURED_OUTPUTS:
        raise ConfigError(item.field, f"must be one of {', '.join(STRUCTURED_OUTPUTS)}")
    return value


def _headers(item: _Value | None) -> Mapping[str, str]:
    if item is None:
        return MappingProxyType({})
    value = item.value
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigError(item.field, "must be a table of string header values")
    return MappingProxyType(dict(value))


def check_webhook_url(
    settings: ProviderSettings, allow: netguard.Allowlist = netguard.NO_WEBHOOK_ALLOW
) -> None:
    """Refuse at startup a webhook provider whose ``base_url`` is an address (or a local name)
    that ``allow`` refuses, with a ``ConfigError`` naming where base_url was set and the
    allowlist. Other host names are checked after DNS, at each request."""
    host = urlsplit(settings.base_url or "").hostname or ""
    try:
        netguard.check_host(host, allow)
    except netguard.AddressRefused as exc:
        where = settings.base_url_field or f"{_env_prefix(settings.name)}BASE_URL"
        raise ConfigError(
            where, f"{exc} (the webhook provider connects only where {allow.variable} allows)"
        ) from None
