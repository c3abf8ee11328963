"""The ``webhook`` provider: POST the rendered prompt and run context as JSON to a URL and take
the response body as the output."""

from __future__ import annotations

import json
from datetime import UTC
from typing import Any
from urllib.parse import urlsplit

from promptsched import netguard, storable
from promptsched.errors import ExecutorError, PermanentError
from promptsched.executors import http_client, http_pool, structured
from promptsched.executors.base import ExecutionRequest, ExecutionResult
from promptsched.executors.settings import ProviderSettings


def idempotency_key(run_id: int) -> str:
    """The same on every attempt of a run, so the receiver can drop duplicates."""
    return f"promptsched-run-{run_id}"


def build_payload(request: ExecutionRequest, model: str | None) -> dict[str, Any]:
    return {
        "run_id": request.run_id,
        "schedule_id": request.schedule_id,
        "schedule_name": request.schedule_name,
        "slot": request.slot.astimezone(UTC).isoformat(),
        "timezone": request.timezone,
        "attempt": request.attempt,
        "attempt_id": str(request.attempt_id),
        "prompt": request.prompt,
        "model": model,
        "params": dict(request.params),
        # the JSON Schema the answer must match (docs/monitors.md), or null: free text
        "output_schema": dict(request.output_schema) if request.output_schema else None,
        # a follow-up's check: its key and vars, so the endpoint knows which event it is
        # about without parsing the prompt (docs/followups.md); null for a schedule's run
        "followup": (
            {"key": request.followup["key"], "vars": dict(request.followup.get("vars") or {})}
            if request.followup
            else None
        ),
    }


def parse_reply(
    reply: http_client.HttpReply, provider: str, *, structured_answer: bool = False
) -> ExecutionResult:
    """A JSON object with a string ``output`` gives that (and its ``usage``); any other body is
    the output as text. A JSON object is also the answer a follow-up's check reads its
    decision from (``recheck_in``, ``recheck_at``). With ``structured_answer`` (a schedule with
    an output_schema) the answer's JSON is ``output`` when that is an object, else the body
    itself when it has no ``output``; a string ``output`` is read as JSON text."""
    text = reply.text()
    if structured_answer:
        return _structured_reply(text)
    try:
        data = storable.clean(json.loads(text))  # a \u0000 or \ud800 escape read, and cleaned
    except ValueError:
        return ExecutionResult(output=text)
    if not isinstance(data, dict):
        return ExecutionResult(output=text)
    if "output" not in data:
        return ExecutionResult(output=text, answer=data)
    output = data["output"]
    if not isinstance(output, str):
        raise http_client.invalid_response(provider, '"output" must be a string')
    usage = data.get("usage")
    counts = {
        key: value
        for key, value in (usage.items() if isinstance(usage, dict) else ())
        if isinstance(value, int) and not isinstance(value, bool)
    }
    return ExecutionResult(output=output, usage=counts or None, answer=data)


def _structured_reply(text: str) -> ExecutionResult:
    try:
        data = storable.clean(json.loads(text))
    except ValueError:
        return ExecutionResult(output=text)
    if not isinstance(data, dict):
        return ExecutionResult(output=text)
    usage = data.get("usage")
    counts = {
        key: value
        for key, value in (usage.items() if isinstance(usage, dict) else ())
        if isinstance(value, int) and not isinstance(value, bool)
    } or None
    output = data.get("output", data)
    if isinstance(output, dict):
        return ExecutionResult(
            output=json.dumps(output, ensure_ascii=False), usage=counts, answer=data, data=output
        )
    return ExecutionResult(output=str(output), usage=counts, answer=data)


class WebhookExecutor:
    """POSTs ``{run_id, schedule_id, schedule_name, slot, timezone, attempt, attempt_id, prompt,
    model, params}`` with an ``Idempotency-Key`` stable for the run.

    Connects only where the address guard lets ``allow`` (``PROMPTSCHED_WEBHOOK_ALLOW``) through:
    the host is checked before each request and every address DNS gives is checked before the
    connection (DNS rebinding); a refusal is a permanent error naming the rule."""

    def __init__(
        self, settings: ProviderSettings, *, allow: netguard.Allowlist = netguard.NO_WEBHOOK_ALLOW
    ) -> None:
        if not settings.base_url:
            raise ValueError(f"provider {settings.name!r} has no base_url")
        self.name = settings.name
        self.allow = allow
        self._settings = settings
        self._url = settings.base_url
        self._host = urlsplit(settings.base_url).hostname or ""
        self._http = http_pool.LazySession(
            connect_timeout=settings.connect_timeout.total_seconds(),
            max_concurrency=settings.max_concurrency,
            resolver=lambda: netguard.GuardedResolver(self.allow),
        )

    def _refused(self, exc: netguard.AddressRefused) -> PermanentError:
        return PermanentError(f"{self.name}: {exc}")

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        settings = self._settings
        try:
            # aiohttp never asks the resolver about an IP literal: check the host itself too.
            netguard.check_host(self._host, self.allow)
        except netguard.AddressRefused as exc:
            raise self._refused(exc) from None
        headers = http_client.request_headers(settings.headers, settings.api_key)
        headers["Idempotency-Key"] = idempotency_key(request.run_id)
        payload = build_payload(request, request.model or settings.default_model)
        schema = request.output_schema
        if schema is None:
            return await self._post(payload, headers)

        async def again(first: ExecutionResult, why: str) -> ExecutionResult:
            # The second chance: the same request, told what was wrong with the first answer.
            retry = {**payload, "validation_error": why, "previous_output": first.output}
            return await self._post(retry, headers, structured_answer=True)

        return await structured.answer(
            schema, lambda: self._post(payload, headers, structured_answer=True), again,
            provider=self.name,
        )  # fmt: skip

    async def _post(
        self, payload: dict[str, Any], headers: dict[str, str], *, structured_answer: bool = False
    ) -> ExecutionResult:
        settings = self._settings
        try:
            reply = await http_client.post_json(
                self._http,
                self._url,
                payload,
                headers=headers,
                provider=self.name,
                request_timeout=settings.request_timeout.total_seconds(),
                connect_timeout=settings.connect_timeout.total_seconds(),
            )
            return parse_reply(reply, self.name, structured_answer=structured_answer)
        except netguard.AddressRefused as exc:  # from the resolver, after DNS
            raise self._refused(exc) from None
        except ExecutorError as exc:
            raise http_client.redact_error(exc, settings.api_key) from None

    async def aclose(self) -> None:
        await self._http.aclose()
