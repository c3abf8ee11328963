"""The fleet's one truth: the configuration each replica publishes (its effective settings
without a secret, and a fingerprint of the part every replica should share), and the view of
the running fleet the CLI and the console check input against (docs/deploying.md)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol
from urllib.parse import urlsplit

from asyncpg import Record

from promptsched import __version__, netguard
from promptsched.clock import Clock
from promptsched.config import Config
from promptsched.delivery.email import EmailSettings
from promptsched.durations import format_duration
from promptsched.executors.providers import build_limiter
from promptsched.executors.settings import ProviderSettings, parse_providers
from promptsched.store import queries
from promptsched.tools.base import Catalog
from promptsched.tools.settings import parse_mcp_servers

VERSION = __version__
# The settings every replica should share, by their names in the published document; a
# difference in any of them is drift. (The roles, slots and version of a replica are its own.)
_SHARED_DURATIONS = (
    "lease", "heartbeat", "drain_grace", "retry_base", "retry_max", "retention",
    "notifier_timeout", "notifier_lease", "digest_period", "fleet_interval",
)  # fmt: skip
LOCAL_NOTE = (
    "no replica is running: input is checked against this shell's own environment "
    "(PROMPTSCHED_PROVIDERS, PROMPTSCHED_WEBHOOK_ALLOW, ...), which the service may not share"
)


@dataclass(frozen=True, slots=True)
class Published:
    """One replica's description of itself: ``config`` (no secret in it) and the fingerprint
    of ``config["shared"]``."""

    config: dict[str, Any]
    fingerprint: str


def _url_base(url: str | None) -> str | None:
    """Scheme, host and path of a URL: a query or a fragment may hold a credential."""
    if url is None:
        return None
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


def _provider(p: ProviderSettings, priced: Sequence[str | None]) -> dict[str, Any]:
    models = sorted({m for m in (p.default_model, *priced) if m})
    return {
        "kind": p.kind,
        "base_url": _url_base(p.base_url),
        "default_model": p.default_model,
        "models": models,
        "key": p.api_key_env is not None,  # a key is configured (never the key, nor its name)
        "limits": {
            "max_concurrency": p.max_concurrency,
            "rate_per_second": p.rate_per_second,
            "tokens_per_minute": p.tokens_per_minute,
            "burst": build_limiter(p).burst,
            "fleet_wide": p.fleet,
        },
        "timeout": format_duration(p.request_timeout),
        # how an output_schema is asked for: replicas that differ answer differently
        "structured_output": p.structured_output,
        "fallbacks": [],  # providers name no fallbacks of their own: schedules do
    }


def _email(config: Config) -> dict[str, Any]:
    if not config.smtp_host:
        return {"configured": False}
    smtp = EmailSettings.from_config(config)
    return {
        "configured": True,
        "host": smtp.host,
        "port": smtp.port,
        "tls": smtp.tls,
        "login": smtp.username is not None,
        "from": smtp.sender,
    }


def shared(config: Config, providers: Mapping[str, ProviderSettings]) -> dict[str, Any]:
    """What every replica of one fleet should have alike."""
    priced: dict[str, list[str | None]] = {}
    for provider, model in config.prices.table:
        priced.setdefault(provider, []).append(model)
    return {
        "providers": {
            name: _provider(p, priced.get(name, [])) for name, p in sorted(providers.items())
        },
        "webhook_allow": str(config.webhook_allow).split(",") if str(config.webhook_allow) else [],
        "tools_allow": str(config.tools_allow).split(",") if str(config.tools_allow) else [],
        "mcp_servers": sorted(parse_mcp_servers(config.mcp_servers, config.mcp_raw)),
        "notify": {"email": _email(config), "webhook": True, "slack": True, "discord": True,
                   "ntfy": True},
        "public_url": config.public_url,
        "trusted_proxies": [str(network) for network in config.trusted_proxies],
        "http": {
            "idle_timeout": format_duration(config.http_idle_timeout),
            "header_timeout": format_duration(config.http_header_timeout),
            "body_timeout": format_duration(config.http_body_timeout),
            "max_connections": config.http_max_connections,
        },
        "prices": sorted(f"{p}:{m}" if m else p for p, m in config.prices.table),
        **{name: format_duration(getattr(config, name)) for name in _SHARED_DURATIONS},
        "notifier_max_attempts": config.notifier_max_attempts,
    }  # fmt: skip


def fingerprint(shared_part: Mapping[str, Any]) -> str:
    """The first 16 hex digits of the SHA-256 of the canonical JSON."""
    text = json.dumps(shared_part, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def describe(
    config: Config,
    providers: Mapping[str, ProviderSettings],
    *,
    roles: Sequence[str],
    slots: int,
    catalog: Catalog | None = None,
) -> Published:
    """The document a replica publishes. The tool catalog (what its MCP servers offer now)
    is published for save-time checks but is not part of the fingerprint: it is state."""
    common = shared(config, providers)
    document: dict[str, Any] = {
        "version": VERSION,
        "roles": list(roles),
        "slots": slots,
        "shared": common,
        "tools": None
        if catalog is None
        else {"tools": dict(catalog.tools), "unavailable": dict(catalog.unavailable)},
    }
    return Published(document, fingerprint(common))


def flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``("providers.echo.limits.max_concurrency", 5)`` for each leaf of a document."""
    if isinstance(value, Mapping) and value:
        for key in sorted(value):
            yield from flatten(value[key], f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, value


def differences(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[str]:
    """Each setting whose value differs, as ``path: mine (fleet: theirs)``."""
    a, b = dict(flatten(mine)), dict(flatten(theirs))
    shown = []
    for path in sorted(set(a) | set(b)):
        if a.get(path, "(unset)") != b.get(path, "(unset)"):
            left = json.dumps(a.get(path, "(unset)"), default=str)
            right = json.dumps(b.get(path, "(unset)"), default=str)
            shown.append(f"{path}: {left} (fleet: {right})")
    return shown


@dataclass(frozen=True, slots=True)
class FleetView:
    """What input is checked against: the configuration most live replicas publish (``source``
    ``fleet``), or this process's own when none is up (``local``, with ``note`` saying so)."""

    providers: dict[str, str]  # name -> kind
    webhook_allow: netguard.Allowlist
    catalog: Catalog | None
    can_email: bool  # some replica that sends notifications has SMTP configured
    priced: frozenset[str]  # providers with a price (for any model)
    source: str  # fleet | local
    replicas: int
    fingerprints: int

    def checks(self, tools: Catalog | None = None) -> dict[str, Any]:
        """The keyword arguments input is checked with (``inputs.validate`` and the operations
        that call it): the fleet's providers and webhook allowlist, and ``tools``."""
        return {
            "providers": list(self.providers),
            "provider_kinds": self.providers,
            "webhook_allow": self.webhook_allow,
            "tools": tools,
        }

    @property
    def note(self) -> str | None:
        if self.source == "local":
            return LOCAL_NOTE
        if self.fingerprints > 1:
            return (
                f"the {self.replicas} running replicas publish {self.fingerprints} different "
                "configurations: input is checked against the one most of them share "
                "(`promptsched status` shows what differs)"
            )
        return None


def from_document(document: Mapping[str, Any], **facts: Any) -> FleetView:
    """The view a published document gives (``facts``: can_email, source, replicas,
    fingerprints)."""
    shared_part = document.get("shared") or {}
    providers = shared_part.get("providers") or {}
    tools = document.get("tools")
    catalog = None
    if isinstance(tools, Mapping):
        catalog = Catalog(dict(tools.get("tools") or {}), dict(tools.get("unavailable") or {}))
    return FleetView(
        providers={name: str(p.get("kind")) for name, p in providers.items()},
        webhook_allow=netguard.Allowlist.parse(
            shared_part.get("webhook_allow") or [], variable=netguard.WEBHOOK_ALLOW
        ),
        catalog=catalog,
        priced=frozenset(str(entry).split(":", 1)[0] for entry in shared_part.get("prices", [])),
        **facts,
    )


def own(document: Mapping[str, Any]) -> FleetView:
    """The view of one process's own published document."""
    email = ((document.get("shared") or {}).get("notify") or {}).get("email") or {}
    return from_document(
        document, can_email=bool(email.get("configured")), source="local", replicas=0,
        fingerprints=0,
    )  # fmt: skip


def local(config: Config) -> FleetView:
    """This process's own view, from its environment and config file: what the CLI checks
    against when no replica is running."""
    providers = parse_providers(config.env, config.providers_raw)
    return own(describe(config, providers, roles=(), slots=0).config)


def bare_document(
    provider_kinds: Mapping[str, str], webhook_allow: netguard.Allowlist
) -> dict[str, Any]:
    """A document with only providers and the webhook allowlist, for an application built
    without a replica behind it."""
    return {
        "shared": {
            "providers": {name: {"kind": kind} for name, kind in provider_kinds.items()},
            "webhook_allow": str(webhook_allow).split(",") if str(webhook_allow) else [],
            "notify": {"email": {"configured": False}},
        },
    }


async def current(
    db: queries.DB, clock: Clock, published: Callable[[], Mapping[str, Any]]
) -> FleetView:
    """The fleet's view for a replica's API or console: its own when none is published."""
    return await view(db, clock, lambda: own(published()))


def emails(document: Mapping[str, Any]) -> bool:
    """Whether the replica that published ``document`` sends mail (notifier role, SMTP)."""
    return _emails(document)


def _emails(document: Mapping[str, Any]) -> bool:
    email = ((document.get("shared") or {}).get("notify") or {}).get("email") or {}
    return "notifier" in (document.get("roles") or []) and bool(email.get("configured"))


def leading(alive: Sequence[Record]) -> Record | None:
    """Of the live replicas' rows (newest first, as ``replica_list`` gives them), the one
    whose fingerprint most publish; among equals, the newest replica's (a rolling change
    starts with the new one). None without any."""
    counts: dict[str, int] = {}
    for row in alive:
        counts[row["fingerprint"]] = counts.get(row["fingerprint"], 0) + 1
    if not counts:
        return None
    chosen = max(counts, key=lambda f: counts[f])  # the first of equals: the newest
    return next(row for row in alive if row["fingerprint"] == chosen)


async def alive(db: queries.DB, clock: Clock) -> list[Record]:
    """The live replicas' rows, newest first."""
    return [row for row in await queries.replica_list(db, clock.sql_now(), timedelta(0))
            if row["alive"]]  # fmt: skip


async def workers_running(db: queries.DB, clock: Clock) -> bool:
    """Whether a live replica runs the worker role: without one, a pending run waits."""
    return any("worker" in (row["config"].get("roles") or []) for row in await alive(db, clock))


def idle_words(run_id: int) -> str:
    """What a run waits for when no replica runs the worker role."""
    return (
        f"no replica is running the worker role: run {run_id} waits as pending until one "
        "starts (promptsched run)"
    )


async def view(db: queries.DB, clock: Clock, fallback: Callable[[], FleetView]) -> FleetView:
    """The running fleet's view: the configuration of ``leading``; ``fallback()`` when no
    replica is alive."""
    rows = await alive(db, clock)
    lead = leading(rows)
    if lead is None:
        return fallback()
    return from_document(
        lead["config"], can_email=any(_emails(row["config"]) for row in rows), source="fleet",
        replicas=len(rows), fingerprints=len({row["fingerprint"] for row in rows}),
    )  # fmt: skip


def email_warning(view_: FleetView, notify: Mapping[str, Any] | None) -> str | None:
    """The warning a schedule that emails gets when no replica can send mail."""
    if not notify or not notify.get("email") or view_.can_email:
        return None
    if view_.source == "fleet":
        who = "no running replica can send mail (none running the notifier role has"
    else:
        who = "no replica is running, and this environment cannot send mail (it has no"
    return (
        f"email: {who} PROMPTSCHED_SMTP_HOST): the emails this schedule owes will not be sent; set "
        "PROMPTSCHED_SMTP_HOST (and PROMPTSCHED_SMTP_TLS) on the replicas and restart them"
    )


def cost_warning(
    view_: FleetView, budget: Mapping[str, Any] | None, provider: str | None, field: str
) -> str | None:
    """The warning a cost limit gets when no price makes a cost known: the limit would never
    be reached. ``provider`` None: an owner's budget (any provider's runs count)."""
    limits = sorted(key for key in (budget or {}) if key.startswith("cost"))
    if not limits:
        return None
    named = ", ".join(f"{field}.{key}" for key in limits)
    if not view_.priced:
        return (
            f"{named}: there is no price table (PROMPTSCHED_PRICES is not set on the "
            "replicas), so no run has a cost and a cost limit is never reached; set "
            "PROMPTSCHED_PRICES, or limit tokens instead"
        )
    if provider is not None and provider not in view_.priced:
        return (
            f"{named}: provider {provider!r} has no price in PROMPTSCHED_PRICES, so its runs "
            "have no cost and this limit is never reached; add a price for it"
        )
    return None


class Planned(Protocol):
    """What the warnings read of a schedule (its checked input or its stored row)."""

    @property
    def provider(self) -> str: ...
    @property
    def notify(self) -> Mapping[str, Any]: ...
    @property
    def budget(self) -> Mapping[str, Any] | None: ...


def schedule_warnings(view_: FleetView, schedule: Planned) -> list[str]:
    """What will not work as the schedule asks, though it is valid: its emails when no replica
    can send mail, its cost limits when no price makes a cost known."""
    found = [
        email_warning(view_, schedule.notify),
        cost_warning(view_, schedule.budget, schedule.provider, "budget"),
    ]
    return [warning for warning in found if warning is not None]
