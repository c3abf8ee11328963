"""User input checked into a ScheduleInput: every error names its field, and params that
would fail every attempt fail at save time instead."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from datetime import timedelta
from typing import Any

from promptsched import budgets, fallback, netguard
from promptsched.domain import ScheduleInput
from promptsched.durations import parse_duration
from promptsched.errors import ValidationError
from promptsched.executors import budget, echo, openai, providers, template
from promptsched.executors.settings import CHAT_KINDS
from promptsched.monitor import conditions
from promptsched.monitor import schema as output_schemas
from promptsched.ops import notify_targets
from promptsched.schedule import overlap, spec
from promptsched.tools.base import Catalog

EDITABLE = frozenset({
    "name", "prompt", "timezone", "provider", "model", "params", "misfire", "misfire_cap",
    "misfire_grace", "catchup_window", "overlap", "max_attempts", "timeout", "jitter",
    "dst_gap", "dst_fold", "pause_after_failures", "cron", "rrule", "at", "every", "kind",
    "expression", "notify", "budget", "output_schema", "notify_when", "give_up_after",
    "fallback",
})  # fmt: skip


MAX_NAME = 200


MAX_PROMPT = 100_000


MAX_GIVE_UP = timedelta(days=30)


MISFIRE_POLICIES = ("run_once", "skip", "run_all")


KINDS = ("cron", "rrule", "at", "every")


def spec_of(values: ScheduleInput) -> spec.Spec:
    """The schedule's timing as the schedule math reads it (raises naming expression/zone)."""
    return spec.parse(
        values.kind, values.expression, values.timezone,
        dst_gap=values.dst_gap, dst_fold=values.dst_fold,
    )  # fmt: skip


def _text(raw: Mapping[str, Any], key: str, *, limit: int, required: bool = True) -> str | None:
    value = raw.get(key)
    if value is None:
        if required:
            raise ValidationError(key, "is required")
        return None
    if not isinstance(value, str):
        raise ValidationError(key, f"must be a string, got {type(value).__name__}")
    if required and not value.strip():
        raise ValidationError(key, "must not be empty")
    if len(value) > limit:
        raise ValidationError(key, f"is too long ({len(value)} characters, at most {limit})")
    if "\x00" in value:
        raise ValidationError(key, "must not contain NUL characters")
    return value


def _int(raw: Mapping[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValidationError(key, "must be a whole number")
    try:
        number = int(value)
    except ValueError:
        raise ValidationError(key, f"must be a whole number, got {value!r}") from None
    if not low <= number <= high:
        raise ValidationError(key, f"must be between {low} and {high}, got {number}")
    return number


def _duration(raw: Mapping[str, Any], key: str, default: timedelta | None) -> timedelta | None:
    value = raw.get(key)
    if value is None:
        return default
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise ValidationError(key, "must be a duration such as 30s, 5m, 1h")
    return parse_duration(value, field=key)


def _choice(raw: Mapping[str, Any], key: str, default: str, choices: Collection[str]) -> str:
    value = raw.get(key, default)
    if value not in choices:
        raise ValidationError(key, f"must be one of {', '.join(choices)}; got {value!r}")
    return str(value)


def _provider(raw: Mapping[str, Any], providers: Collection[str]) -> str:
    """A provider this server has: they are configured on the server, never in a request."""
    value = raw.get("provider", "echo")
    if value in providers:
        return str(value)
    shown = f"{str(value)[:60]!r}" if isinstance(value, str) else "not a name"
    raise ValidationError(
        "provider",
        f"this server has no provider {shown} (it has: {', '.join(providers)}); providers are "
        "set up on the server with PROMPTSCHED_PROVIDERS, see docs/providers.md",
    )


def _zone_name(raw: Mapping[str, Any]) -> str:
    """The schedule's zone: UTC when absent; an empty one is an error, not UTC."""
    zone = _text(raw, "timezone", limit=100, required=False)
    return "UTC" if zone is None else zone


def _kind_and_expression(raw: Mapping[str, Any]) -> tuple[str, str]:
    given = [kind for kind in KINDS if raw.get(kind) is not None]
    if raw.get("kind") is not None or raw.get("expression") is not None:
        if given:  # never silently drop one of two expressions
            raise ValidationError(given[0], "give either kind + expression or this, not both")
        kind = _choice(raw, "kind", "cron", KINDS)
        expression = _text(raw, "expression", limit=2000)
        assert expression is not None
        return kind, expression
    if len(given) != 1:
        raise ValidationError("schedule", "give exactly one of cron, rrule, at, every")
    expression = _text(raw, given[0], limit=2000)
    assert expression is not None
    return given[0], expression


def validate(
    raw: Mapping[str, Any],
    *,
    providers: Collection[str],
    provider_kinds: Mapping[str, str] | None = None,
    webhook_allow: netguard.Allowlist = netguard.NO_WEBHOOK_ALLOW,
    current_notify: Mapping[str, Any] | None = None,
    tools: Catalog | None = None,
    template_vars: frozenset[str] = frozenset(),
) -> ScheduleInput:
    """Turn user input into a checked ScheduleInput, or raise naming the first bad field.

    ``provider_kinds`` (provider name -> kind) enables the kind-specific checks of params,
    e.g. an ``openai`` provider's generation params. ``tools`` (this server's tool catalog)
    enables the check that an agent schedule's ``params.tools`` exist and may be used.
    """
    name = _text(raw, "name", limit=MAX_NAME)
    kind, expression = _kind_and_expression(raw)
    prompt = _text(raw, "prompt", limit=MAX_PROMPT)
    assert name is not None and prompt is not None
    template.validate(prompt, field="prompt", extra=template_vars)
    provider = _provider(raw, providers)
    params = raw.get("params") or {}
    if not isinstance(params, Mapping) or not all(isinstance(k, str) for k in params):
        raise ValidationError("params", "must be an object of string keys")
    if provider == "echo" or (provider_kinds or {}).get(provider) == "echo":
        echo.validate_params(params)
    values = ScheduleInput(
        name=name.strip(),
        kind=kind,
        expression=expression,
        prompt=prompt,
        timezone=_zone_name(raw),
        provider=provider,
        model=_text(raw, "model", limit=200, required=False),
        params=dict(params),
        misfire=_choice(raw, "misfire", "run_once", MISFIRE_POLICIES),
        misfire_cap=_int(raw, "misfire_cap", 100, 1, 10_000),
        misfire_grace=_duration(raw, "misfire_grace", timedelta(seconds=60)) or timedelta(0),
        catchup_window=_duration(raw, "catchup_window", None),
        overlap=_choice(raw, "overlap", "skip", overlap.POLICIES),
        max_attempts=_int(raw, "max_attempts", 3, 1, 100),
        timeout=_duration(raw, "timeout", None)
        or (timedelta(minutes=5) if raw.get("timeout") is None else timedelta(0)),
        jitter=_duration(raw, "jitter", None),
        dst_gap=_choice(raw, "dst_gap", "shift", ("shift", "skip")),
        dst_fold=_choice(raw, "dst_fold", "first", ("first", "both")),
        enabled=bool(raw.get("enabled", True)),
        pause_after_failures=(
            None
            if raw.get("pause_after_failures") is None
            else _int(raw, "pause_after_failures", 1, 1, 1000)
        ),
        notify=notify_targets.validate_targets(
            raw.get("notify"), allow=webhook_allow, current=current_notify
        ),
        budget=budgets.validate(raw.get("budget")),
        **monitor_fields(raw, params),
        **_weather(raw, provider, providers),
    )
    if values.timeout < timedelta(seconds=1):
        raise ValidationError("timeout", "must be at least 1s")
    spec_of(values)  # raises naming expression / timezone
    _check_provider_params(values, provider_kinds or {}, tools)
    return values


def _weather(raw: Mapping[str, Any], provider: str, providers: Collection[str]) -> dict[str, Any]:
    """``give_up_after`` and ``fallback`` (docs/providers.md, "When the provider pushes
    back")."""
    give_up = _duration(raw, "give_up_after", None) or timedelta(hours=1)
    if not timedelta(seconds=1) <= give_up <= MAX_GIVE_UP:
        raise ValidationError("give_up_after", "must be between 1s and 30d")
    return {
        "give_up_after": give_up,
        "fallback": fallback.validate(raw.get("fallback"), providers=providers, primary=provider),
    }


def monitor_fields(raw: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """``output_schema`` and ``notify_when``, checked together (docs/monitors.md); the
    console checks them as they are typed."""
    schema = output_schemas.check(raw.get("output_schema"))
    condition = conditions.parse(raw.get("notify_when"))
    if condition.structured and schema is None:
        raise ValidationError(
            "notify_when",
            f"{conditions.text(condition)!r} reads the structured output: set an output_schema",
        )
    if schema is not None and "response_format" in params:
        raise ValidationError(
            "params.response_format", "the output_schema sets the response format: remove this"
        )
    return {"output_schema": schema, "notify_when": conditions.text(condition)}


def schema_text(text: str) -> dict[str, Any] | None:
    """An output schema typed as text (the console's field): JSON, or None when empty."""
    if not text.strip():
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValidationError("output_schema", f"is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValidationError("output_schema", "must be a JSON object (a JSON Schema)")
    return value


def _check_provider_params(
    values: ScheduleInput, provider_kinds: Mapping[str, str], tools: Catalog | None
) -> None:
    """Params that would fail every attempt fail at save time instead: the generation params
    of an LLM-API provider (``openai``, ``anthropic``, ``gemini``), the schedule's own and its
    fallbacks' (an attempt may go to any of them), and agent params (its tools exist here and
    are allowed), and the tags of a ``system`` prompt (the worker renders it with the
    prompt's context)."""
    kind = provider_kinds.get(values.provider)
    route = [values.provider, *(fallback.split(entry)[0] for entry in values.fallback)]
    for number, name in enumerate(dict.fromkeys(route)):
        check = providers.PARAM_CHECKS.get(provider_kinds.get(name, ""))
        if check is None:
            continue
        try:
            check(values.params)
        except ValidationError as exc:
            if number == 0:
                raise
            raise ValidationError(
                exc.field, f"{exc.message} (for the fallback provider {name!r})"
            ) from None
    if budget.is_agent_run(values.params) and kind != "webhook":  # webhook params are opaque
        if kind not in (None, *CHAT_KINDS):
            raise ValidationError(
                f"params.{budget.TOOLS}",
                f"tools and agent budgets need a provider of kind {', '.join(CHAT_KINDS)}",
            )
        budget.validate(values.params, tools)
    system = values.params.get(openai.SYSTEM_PARAM)
    if isinstance(system, str):
        template.validate(system, field=f"params.{openai.SYSTEM_PARAM}")
