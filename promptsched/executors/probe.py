"""A provider's cheap check for ``promptsched doctor``: can it be reached, and does it accept
its key, without running a prompt or spending a token.

An LLM-API provider is asked for its model list with the key the runs send: ``openai``
``GET {base_url}/models`` (OpenAI, LiteLLM's proxy, vLLM and Ollama answer it without a
completion, and answer 401 to a wrong key), ``anthropic`` ``GET {base_url}/v1/models``,
``gemini`` ``GET {base_url}/v1beta/models``. A ``webhook`` provider is only connected to
(any request to it runs a prompt), through the address guard its runs use. ``echo`` is built
in."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio

from promptsched import netguard
from promptsched.errors import ExecutorError
from promptsched.executors import http_client, http_pool, providers
from promptsched.executors.settings import ProviderSettings

PROBE_TIMEOUT = 10.0  # seconds, whatever the provider's own request timeout


@dataclass(frozen=True, slots=True)
class Probed:
    """``ok`` None: not probed (built in, or opted out), with why."""

    ok: bool | None
    message: str
    status: int | None = None  # the HTTP status of a refusal
    key_refused: bool = False  # the refusal was of the key (the API's way of saying so)


async def probe(provider: ProviderSettings, webhook_allow: netguard.Allowlist) -> Probed:
    if provider.kind == "echo":
        return Probed(None, "built in: nothing to reach")
    if not provider.probe:
        where = f"{provider.name}.probe" if provider.base_url_field else "its PROBE setting"
        return Probed(None, f"not probed ({where} is false)")
    if provider.kind == "webhook":
        return await _connect(provider, webhook_allow)
    return await _models(provider)


async def _models(provider: ProviderSettings) -> Probed:
    kind = providers.CHAT_EXECUTORS[provider.kind]
    url = f"{(provider.base_url or '').rstrip('/')}{kind.models_path}"
    session = http_pool.open_session(connect_timeout=PROBE_TIMEOUT, max_concurrency=1)
    try:
        reply = await http_client.get(
            session, url, headers=kind.headers(provider), provider=provider.name,
            request_timeout=PROBE_TIMEOUT, connect_timeout=PROBE_TIMEOUT, pushback=kind.pushback,
        )  # fmt: skip
    except ExecutorError as exc:
        error = http_client.redact_error(exc, provider.api_key)
        status = _status(error.message)
        return Probed(False, error.message, status, kind.key_refused(status, error.message))
    finally:
        await session.close()
    try:
        listed = len(reply.json(provider.name).get(kind.models_field) or [])
    except (ExecutorError, AttributeError):
        listed = 0
    key = "its key accepted" if provider.api_key else "no key sent"
    return Probed(True, f"{url} answered {reply.status}, {key} ({listed} models listed)")


def _status(message: str) -> int | None:
    """The status of an ``http_client.classify_status`` message (``name: HTTP 401 ...``)."""
    _, _, rest = message.partition(": HTTP ")
    code = rest[:3]
    return int(code) if code.isdigit() else None


async def _connect(provider: ProviderSettings, allow: netguard.Allowlist) -> Probed:
    parts = urlsplit(provider.base_url or "")
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with anyio.fail_after(PROBE_TIMEOUT):
            addresses = await netguard.resolve(host, port, allow)
            stream = await anyio.connect_tcp(addresses[0][1], port)
        await stream.aclose()
    except netguard.AddressRefused as exc:
        return Probed(False, f"{host}: {exc}")
    except (OSError, TimeoutError) as exc:
        return Probed(False, f"cannot connect to {host}:{port}: {str(exc) or type(exc).__name__}")
    return Probed(True, f"{host}:{port} accepts connections (a webhook provider is not sent a "
                        "request: any request runs a prompt)")  # fmt: skip
