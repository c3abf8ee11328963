"""What the LLM-API kinds (``openai``, ``anthropic``, ``gemini``) share: one attempt as a
conversation, asked over one pooled HTTP session per provider, its errors and rate-limit
headers read by one classifier (``http_client``, ``ratelimit``), an answer in a schema checked
the one way (``structured``), and agent runs through the one tool loop (``agent``).

Inside, a conversation is a list of chat messages in OpenAI's shape (``system``, ``user``,
``assistant`` with ``tool_calls``, ``tool``), and a reply is an ``agent.ChatReply`` in the same
shape; each kind only says how that goes on its wire and comes back (``ChatExecutor.payload``,
``ChatExecutor.read``), which params it takes and how it asks for an answer in a schema.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from promptsched.errors import ExecutorError, PermanentError, ValidationError
from promptsched.executors import agent, http_client, http_pool, ratelimit, structured
from promptsched.executors import budget as budgets
from promptsched.executors.base import ExecutionRequest, ExecutionResult
from promptsched.executors.settings import ProviderSettings

SYSTEM_PARAM = "system"


def build_messages(prompt: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A fresh conversation: the optional system prompt, then the rendered prompt."""
    messages: list[dict[str, Any]] = []
    system = params.get(SYSTEM_PARAM)
    if isinstance(system, str) and system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": prompt})
    return messages


def number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError("must be a number")
    try:
        number = float(value)
    except ValueError:
        raise ValueError("must be a number") from None
    if not math.isfinite(number):
        raise ValueError("must be a finite number")
    return number


def between(low: float, high: float) -> Callable[[Any], float]:
    """A number in [low, high], the range the provider's API documents for the parameter."""

    def convert(value: Any) -> float:
        found = number(value)
        if not low <= found <= high:
            raise ValueError(f"must be between {low:g} and {high:g}")
        return found

    return convert


def whole(value: Any) -> int:
    found = number(value)
    if not found.is_integer():
        raise ValueError("must be a whole number")
    if abs(found) >= 2**63:
        raise ValueError("is too large")
    return int(found)


def positive(value: Any) -> int:
    found = whole(value)
    if found < 1:
        raise ValueError("must be at least 1")
    return found


def stop(value: Any) -> str | list[str]:
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        return list(value)
    raise ValueError("must be a string or a list of strings")


def convert_params(
    params: Mapping[str, Any], known: Mapping[str, Callable[[Any], Any]]
) -> dict[str, Any]:
    """A schedule's params as the request's generation fields, each converted by its entry
    of ``known`` (``system`` and the agent params are not generation fields: skipped).
    Raises ``ValidationError`` naming ``params.KEY`` for an unknown key or a bad value, so the
    API can reject it when the schedule is saved."""
    body: dict[str, Any] = {}
    for key, value in params.items():
        if key == SYSTEM_PARAM:
            if not isinstance(value, str):
                raise ValidationError(f"params.{key}", "must be a string")
            continue
        if key in budgets.AGENT_PARAMS:
            continue
        convert = known.get(key)
        if convert is None:
            names = ", ".join([SYSTEM_PARAM, *known, *budgets.AGENT_PARAMS])
            raise ValidationError(f"params.{key}", f"unknown parameter; known: {names}")
        try:
            body[key] = convert(value)
        except ValueError as exc:
            shown = repr(value)
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            raise ValidationError(f"params.{key}", f"{exc} (got {shown})") from None
    return body


def usage_counts(usage: Any) -> dict[str, int]:
    """The whole-number entries of a provider's usage object."""
    if not isinstance(usage, dict):
        return {}
    return {
        key: value
        for key, value in usage.items()
        if isinstance(value, int) and not isinstance(value, bool)
    }


class ChatExecutor:
    """One provider of an LLM-API kind. Subclasses say how its wire looks: ``url``,
    ``headers``, ``generation_params``, ``ask_in_schema``, ``payload`` and ``read``. Its
    ``aiohttp`` session opens on first use and closes with ``aclose``; errors never contain
    the API key."""

    # The kind's own ways of saying "not now" (http_client.Pushback).
    pushback: ClassVar[http_client.Pushback] = http_client.SHARED
    # Its model list (``promptsched doctor`` asks for it): the path under base_url, and the
    # field of the answer that lists them.
    models_path: ClassVar[str] = "/models"
    models_field: ClassVar[str] = "data"

    @staticmethod
    def key_refused(status: int | None, message: str) -> bool:
        """Whether an error answer means the key was refused (``doctor`` names its variable)."""
        return status in (401, 403)

    def __init__(self, settings: ProviderSettings, tools: agent.ToolSource | None = None) -> None:
        if not settings.base_url:
            raise ValueError(f"provider {settings.name!r} has no base_url")
        self.name = settings.name
        self._settings = settings
        self._tools = tools
        self._base_url = settings.base_url.rstrip("/")
        self._http = http_pool.LazySession(
            connect_timeout=settings.connect_timeout.total_seconds(),
            max_concurrency=settings.max_concurrency,
        )

    # --- the wire, per kind -------------------------------------------------------------------

    def url(self, model: str) -> str:
        raise NotImplementedError

    @staticmethod
    def headers(settings: ProviderSettings) -> dict[str, str]:
        """The request's headers, the key among them: build them per request, never log them."""
        raise NotImplementedError

    @staticmethod
    def generation_params(params: Mapping[str, Any]) -> dict[str, Any]:
        """The request's generation fields from a schedule's params; ``ValidationError``
        naming ``params.KEY`` for an unknown key or a bad value."""
        raise NotImplementedError

    def ask_in_schema(
        self,
        schema: Mapping[str, Any],
        params: dict[str, Any],
        messages: list[dict[str, Any]],
        *,
        agent_run: bool,
    ) -> dict[str, Any]:
        """The params that ask for an answer in ``schema`` (``messages`` may gain a system
        message saying it in words)."""
        raise NotImplementedError

    def payload(
        self, messages: Sequence[Mapping[str, Any]], model: str, params: Mapping[str, Any]
    ) -> dict[str, Any]:
        raise NotImplementedError

    def read(self, data: Any, params: Mapping[str, Any]) -> agent.ChatReply:
        """The reply of a 2xx body; anything unexpected is a permanent invalid response."""
        raise NotImplementedError

    # --- shared ---------------------------------------------------------------------------------

    async def chat_completion(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str,
        params: Mapping[str, Any],
    ) -> agent.ChatReply:
        """One request of the conversation so far. ``params`` are wire-ready generation fields
        (``generation_params``). A tool-calling loop calls this once per turn."""
        settings = self._settings
        try:
            reply = await http_client.post_json(
                self._http,
                self.url(model),
                self.payload(messages, model, params),
                headers=self.headers(settings),
                provider=self.name,
                request_timeout=settings.request_timeout.total_seconds(),
                connect_timeout=settings.connect_timeout.total_seconds(),
                pushback=self.pushback,
            )
            parsed = self.read(reply.json(self.name), params)
            pace = ratelimit.pace_of(reply.headers)
            return parsed if pace is None else dataclasses.replace(parsed, pace=pace)
        except ExecutorError as exc:
            raise http_client.redact_error(exc, settings.api_key) from None

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        model = request.model or self._settings.default_model
        if not model:
            raise PermanentError(
                f"{self.name}: no model (set the schedule's model or the provider's default_model)"
            )
        try:
            params = self.generation_params(request.params)
        except ValidationError as exc:
            raise PermanentError(f"{self.name}: {exc}") from None
        messages = build_messages(request.prompt, request.params)
        schema = request.output_schema
        agent_run = budgets.is_agent_run(request.params)
        if schema is not None:
            params = self.ask_in_schema(schema, params, messages, agent_run=agent_run)
        if agent_run:
            return await agent.run(
                self.chat_completion, request, provider=self.name, model=model, params=params,
                messages=messages, tools=self._tools,
            )  # fmt: skip

        async def ask() -> ExecutionResult:
            reply = await self.chat_completion(messages, model=model, params=params)
            return ExecutionResult(
                agent.answer_text(reply, self.name), usage=reply.usage or None, pace=reply.pace
            )

        if schema is None:
            return await ask()
        return await structured.answer(
            schema, ask, lambda first, why: agent.ask_again(messages, first, why, ask),
            provider=self.name,
        )  # fmt: skip

    async def aclose(self) -> None:
        await self._http.aclose()
