"""The ``echo`` provider: deterministic output with optional latency and injected failures."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any

import anyio

from promptsched.durations import parse_duration
from promptsched.errors import PermanentError, RetryableError, ValidationError
from promptsched.executors import structured
from promptsched.executors.base import ExecutionRequest, ExecutionResult


def _fraction(*parts: object) -> float:
    """A stable number in [0, 1) from the parts, so failure injection is reproducible."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _float_param(params: Mapping[str, Any], key: str, default: float) -> float:
    value = params.get(key, default)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise PermanentError(f"echo param {key} must be a number, got {value!r}") from None


_TRUTHY = ("1", "true", "yes")
_BOOLEANS = (*_TRUTHY, "0", "false", "no", "")


def validate_params(params: Mapping[str, Any]) -> None:
    """Raise ``ValidationError`` naming ``params.KEY`` for a value the echo provider would
    refuse (or misread) at run time; other keys are ignored, as the provider ignores them."""
    if "latency" in params:
        parse_duration(str(params["latency"]), field="params.latency")
    for key, low, high in (("fail_rate", 0.0, 1.0), ("fail_attempts", 0.0, 1000.0)):
        if key not in params:
            continue
        value = params[key]
        try:
            number = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            number = math.nan
        if not low <= number <= high or (key == "fail_attempts" and not number.is_integer()):
            kind = "a whole number" if key == "fail_attempts" else "a number"
            raise ValidationError(
                f"params.{key}", f"must be {kind} between {low:g} and {high:g}, got {value!r:.40}"
            )
    if "fail_permanent" in params and str(params["fail_permanent"]).lower() not in _BOOLEANS:
        raise ValidationError("params.fail_permanent", "must be true or false")


class EchoExecutor:
    """Echoes the prompt. Params: ``latency`` (duration), ``fail_rate`` (0..1),
    ``fail_attempts`` (fail the first N attempts of every run), ``fail_permanent`` (bool)."""

    name = "echo"

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        params = request.params
        failing = False
        if params:  # most echo schedules set none: no parsing per run
            latency = params.get("latency")
            if latency:
                await anyio.sleep(parse_duration(str(latency), field="latency").total_seconds())
            fail_attempts = int(_float_param(params, "fail_attempts", 0))
            fail_rate = _float_param(params, "fail_rate", 0.0)
            failing = request.attempt <= fail_attempts or (
                fail_rate > 0 and _fraction(request.run_id, request.attempt) < fail_rate
            )
        # Usage as a paid provider reports it, in words: the prompt was read even when the
        # attempt then fails, so a failed attempt reports its prompt tokens.
        prompt_tokens = len(request.prompt.split())
        if failing:
            message = f"echo: injected failure on attempt {request.attempt}"
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 0,
                     "total_tokens": prompt_tokens}  # fmt: skip
            if str(params.get("fail_permanent", "")).lower() in _TRUTHY:
                raise PermanentError(message, usage=usage)
            raise RetryableError(message, usage=usage)
        # With an output_schema the answer is the prompt itself, so a JSON prompt is a valid
        # answer (demos and tests of monitors); a second ask answers the same.
        schema = request.output_schema
        output = request.prompt if schema is not None else f"echo: {request.prompt}"
        completion_tokens = len(output.split())
        result = ExecutionResult(
            output=output,
            usage={"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                   "total_tokens": prompt_tokens + completion_tokens},
        )  # fmt: skip
        if schema is None:
            return result

        async def same(*_: object) -> ExecutionResult:
            return result

        return await structured.answer(schema, same, same, provider=self.name)

    async def aclose(self) -> None:
        return None
