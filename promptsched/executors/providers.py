"""Building the executors of the configured providers: one executor per provider and one
``Limiter`` each, for one process (the composition root calls ``build_registry``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from promptsched import netguard
from promptsched.executors import agent, anthropic, chat, echo, gemini, openai, webhook_provider
from promptsched.executors.base import Executor, Registry
from promptsched.executors.limiter import Limiter
from promptsched.executors.settings import ProviderSettings, check_webhook_url

# The executor of each LLM-API kind.
CHAT_EXECUTORS: Mapping[str, type[chat.ChatExecutor]] = {
    "openai": openai.OpenAIExecutor,
    "anthropic": anthropic.AnthropicExecutor,
    "gemini": gemini.GeminiExecutor,
}
# What each kind checks of a schedule's params when it is saved (ValidationError naming
# params.KEY); the webhook kind's params are opaque.
PARAM_CHECKS: Mapping[str, Callable[[Mapping[str, Any]], None]] = {
    "openai": openai.validate_params,
    "anthropic": anthropic.validate_params,
    "gemini": gemini.validate_params,
}


def build_executor(
    settings: ProviderSettings,
    tools: agent.ToolSource | None = None,
    *,
    webhook_allow: netguard.Allowlist = netguard.NO_WEBHOOK_ALLOW,
) -> Executor:
    """The executor for one provider (its HTTP session opens lazily on first use); the
    LLM-API kinds run agent schedules with ``tools``. ``webhook`` ones connect only where
    ``webhook_allow`` lets them (the LLM-API kinds are not guarded: see docs/providers.md)."""
    chat_kind = CHAT_EXECUTORS.get(settings.kind)
    if chat_kind is not None:
        return chat_kind(settings, tools)
    if settings.kind == "webhook":
        check_webhook_url(settings, webhook_allow)
        return webhook_provider.WebhookExecutor(settings, allow=webhook_allow)
    executor = echo.EchoExecutor()
    executor.name = settings.name
    return executor


def build_registry(
    settings: Mapping[str, ProviderSettings],
    tools: agent.ToolSource | None = None,
    *,
    webhook_allow: netguard.Allowlist = netguard.NO_WEBHOOK_ALLOW,
) -> tuple[Registry, dict[str, Limiter]]:
    """The registry of executors and one ``Limiter`` per provider, for one process. Raises
    ``ConfigError`` for a webhook provider whose address ``webhook_allow`` refuses."""
    executors = {
        name: build_executor(provider, tools, webhook_allow=webhook_allow)
        for name, provider in settings.items()
    }
    limiters = {name: build_limiter(provider) for name, provider in settings.items()}
    return Registry(executors), limiters


def build_limiter(provider: ProviderSettings) -> Limiter:
    """The provider's limits as one process meets them (``fleet``: they hold fleet-wide)."""
    return Limiter(
        provider.max_concurrency,
        provider.rate_per_second,
        fleet=provider.fleet,
        tokens_per_minute=provider.tokens_per_minute,
    )
