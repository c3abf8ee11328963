"""The dependencies one aiohttp application carries, built once by the composition root and
read by the API's handlers and the console's pages alike."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import asyncpg
from aiohttp import web

from promptsched import netguard
from promptsched.clock import Clock
from promptsched.metrics import Metrics
from promptsched.tools.base import Catalog
from promptsched.web.progress import ProgressHub
from promptsched.web.ratelimit import TokenRates


@dataclass(frozen=True, slots=True)
class Deps:
    """What handlers need, built once by ``app.build``."""

    pool: asyncpg.Pool[Any]
    clock: Clock
    metrics: Metrics
    ready: Callable[[], bool]
    providers: tuple[str, ...]
    provider_kinds: dict[str, str] = field(default_factory=dict)
    webhook_allow: netguard.Allowlist = netguard.NO_WEBHOOK_ALLOW
    document: dict[str, Any] = field(default_factory=dict)
    tools: Callable[[], Catalog] | None = None  # this server's tools now, for save-time checks
    progress: ProgressHub = field(default_factory=ProgressHub)
    retention: timedelta | None = None  # history retention; explain answers "purged" beyond it
    # This replica's published configuration (ops/fleet.py): what input is checked against
    # when no replica has published one (an application built without a supervisor).
    published: Callable[[], Mapping[str, Any]] = dict
    # ``promptsched doctor`` as this replica runs it (ops/doctor.py); None: no replica behind.
    doctor: Callable[[], Awaitable[dict[str, Any]]] | None = None
    # Per-owner quotas (docs/deploying.md, "Quotas"): schedules an owner may have (0: none),
    # and the API requests a token may make a second in this process.
    max_schedules: int = 0
    rates: TokenRates = field(default_factory=lambda: TokenRates(0.0, 1))

    def tool_catalog(self) -> Catalog | None:
        return self.tools() if self.tools is not None else None


DEPS: web.AppKey[Deps] = web.AppKey("deps", Deps)
