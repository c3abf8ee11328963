"""One validated, frozen configuration, built from ``PROMPTSCHED_*`` variables and an optional
TOML file, identical on every replica."""

from __future__ import annotations

import math
import os
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from promptsched import eventloop, netguard
from promptsched.durations import parse_duration
from promptsched.errors import ConfigError
from promptsched.prices import Prices
from promptsched.secret import Secret

IPNetwork = netguard.IPNetwork

ROLES = ("scheduler", "worker", "reaper", "notifier", "api")
LOG_LEVELS = ("debug", "info", "warning", "error")
SMTP_TLS = ("none", "starttls", "tls")


# What each role is handed by the composition root (supervisor.py): a frozen group of the
# settings it reads, so a role's constructor names exactly what it depends on. ``Config``
# below is the parsed, validated edge (one field per variable, TOML key and ``run`` flag);
# its properties of the same names build these groups.


@dataclass(frozen=True, slots=True)
class DatabaseSettings:
    url: str | None = None
    # A session connection (never a transaction pooler) for LISTEN; None: ``url``.
    direct_url: str | None = None
    statement_cache_size: int = 100
    data_dir: Path | None = None


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    batch: int = 2000
    max_sleep: timedelta = timedelta(seconds=5)
    pipeline: int = 2
    owner_runs_per_minute: int = 20_000  # PROMPTSCHED_OWNER_RUNS_PER_MINUTE; 0: no quota
    # The batches after a full one, while a rush lasts (never fewer than ``batch``): a tick's
    # first batch stays small so the rush's first runs start soon, the rest go in larger ones.
    rush_batch: int = 5000


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    slots: int = 4
    worker_id: str | None = None  # None: default_worker_id() (host, a random part, pid)
    lease: timedelta = timedelta(seconds=30)
    heartbeat: timedelta = timedelta(seconds=10)
    drain_grace: timedelta = timedelta(seconds=10)
    retry_base: timedelta = timedelta(seconds=2)
    retry_max: timedelta = timedelta(hours=1)
    max_sleep: timedelta = timedelta(seconds=5)
    prices: Prices = field(default_factory=Prices)  # the cost of every attempt's usage


@dataclass(frozen=True, slots=True)
class ReaperSettings:
    # The worker enforces the timeout itself; the reaper steps in only after this grace.
    deadline_grace: timedelta = timedelta(seconds=30)
    batch: int = 500
    max_sleep: timedelta = timedelta(seconds=5)
    # Finished runs older than this are deleted by the retention role (0 keeps them forever).
    retention: timedelta = timedelta(days=30)


@dataclass(frozen=True, slots=True)
class NotifierSettings:
    lease: timedelta = timedelta(minutes=2)
    timeout: timedelta = timedelta(seconds=30)
    max_attempts: int = 10
    retry_base: timedelta = timedelta(seconds=10)
    retry_max: timedelta = timedelta(hours=1)
    batch: int = 20
    max_sleep: timedelta = timedelta(seconds=5)
    # Dropped ticks are told to owners as one digest per schedule and period (this long).
    digest_period: timedelta = timedelta(hours=1)
    crash_after_send: bool = False  # the test hook (roles/notifier.py CRASH_AFTER_SEND_ENV)


@dataclass(frozen=True, slots=True)
class ApiSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    webhook_allow: netguard.Allowlist = netguard.NO_WEBHOOK_ALLOW
    retention: timedelta | None = timedelta(days=30)  # None: runs are kept forever
    # the connections' bounds (api/protocol.py, docs/deploying.md#connections)
    idle_timeout: timedelta = timedelta(seconds=75)
    header_timeout: timedelta = timedelta(seconds=10)
    body_timeout: timedelta = timedelta(seconds=60)
    max_connections: int = 4096
    # who may say a request came over https, and for whom (web/edge.py)
    trusted_proxies: tuple[IPNetwork, ...] = ()
    public_https: bool = False  # PROMPTSCHED_PUBLIC_URL is https
    max_schedules: int = 10_000  # per owner (PROMPTSCHED_OWNER_MAX_SCHEDULES); 0: no quota
    rate: float = 50.0  # requests per second per token (PROMPTSCHED_API_RATE); 0: no limit
    burst: int = 200


# Set in the environment of `promptsched run` to make the notifier SIGKILL its own process
# right after a batch was sent and before it is marked sent (roles/notifier.py). Never set it
# in production.
CRASH_AFTER_SEND_ENV = "PROMPTSCHED_TEST_CRASH_AFTER_SEND"


@dataclass(frozen=True, slots=True)
class Config:
    database_url: str | None = None
    # A session connection (never a transaction pooler) for LISTEN; default: database_url.
    direct_database_url: str | None = None
    # asyncpg's prepared-statement cache on pooled connections; 0 for poolers without
    # prepared-statement support (PgBouncer < 1.21 in transaction mode).
    statement_cache_size: int = 100
    # The one embedded data directory: every command resolves the same one (default_data_dir).
    data_dir: Path = field(default_factory=lambda: default_data_dir(os.environ))
    http_host: str = "127.0.0.1"
    http_port: int = 8080
    workers: int = 4
    roles: tuple[str, ...] = ROLES
    lease: timedelta = timedelta(seconds=30)
    heartbeat: timedelta = timedelta(seconds=10)
    drain_grace: timedelta = timedelta(seconds=10)
    retry_base: timedelta = timedelta(seconds=2)
    retry_max: timedelta = timedelta(hours=1)
    scheduler_batch: int = 2000
    scheduler_rush_batch: int = 5000
    scheduler_max_sleep: timedelta = timedelta(seconds=5)
    worker_max_sleep: timedelta = timedelta(seconds=5)
    reaper_max_sleep: timedelta = timedelta(seconds=5)
    # Finished runs older than this are deleted (0 keeps them forever).
    retention: timedelta = timedelta(days=30)
    log_level: str = "info"
    log_format: str = "auto"
    # the service's event loop: uvloop where installed (auto), or asyncio's own (eventloop.py)
    event_loop: str = "auto"
    worker_id: str | None = None
    # notifications (docs/notifications.md)
    smtp_host: str | None = None
    smtp_port: int | None = None  # default by smtp_tls: 25 (none), 587 (starttls), 465 (tls)
    smtp_username: str | None = None
    smtp_password: Secret | None = None
    smtp_tls: str = "starttls"
    smtp_from: str = "promptsched@localhost"
    # The console's address as people reach it, for links in notifications (none: no links).
    public_url: str | None = None
    # Proxies whose X-Forwarded-Proto and X-Forwarded-For are believed (addresses or CIDRs).
    trusted_proxies: tuple[IPNetwork, ...] = ()
    # The API's connections (docs/deploying.md#connections): an idle keep-alive connection
    # closes after the first; a request's headers, then its body, must arrive within the next
    # two; at most this many client connections are open at once (fewer when the open-files
    # limit is low), the next is answered 503.
    http_idle_timeout: timedelta = timedelta(seconds=75)
    http_header_timeout: timedelta = timedelta(seconds=10)
    http_body_timeout: timedelta = timedelta(seconds=60)
    http_max_connections: int = 4096
    allow_private_webhooks: bool = False  # deprecated: adds netguard.LEGACY_PRIVATE below
    # address guard (docs/notifications.md, docs/agents.md): non-public hosts/CIDRs let through
    webhook_allow: netguard.Allowlist = netguard.NO_WEBHOOK_ALLOW
    tools_allow: netguard.Allowlist = netguard.NO_TOOLS_ALLOW
    notifier_max_attempts: int = 10
    notifier_retry_base: timedelta = timedelta(seconds=10)
    notifier_retry_max: timedelta = timedelta(hours=1)
    notifier_lease: timedelta = timedelta(minutes=2)
    notifier_timeout: timedelta = timedelta(seconds=30)
    notifier_batch: int = 20
    notifier_max_sleep: timedelta = timedelta(seconds=5)
    digest_period: timedelta = timedelta(hours=1)
    # How often each replica renews its row in `replicas` (ops/fleet.py, roles/presence.py):
    # its configuration for the CLI and the console, and its liveness for `status`.
    fleet_interval: timedelta = timedelta(seconds=10)
    # Per-owner quotas (docs/deploying.md, "Quotas"); 0 turns one off.
    owner_max_schedules: int = 10_000  # schedules an owner may have (follow-ups apart)
    owner_runs_per_minute: int = 20_000  # runs the scheduler makes due for an owner a minute
    api_rate: float = 50.0  # API requests per second per token, in each replica
    api_burst: int = 200  # ... of which this many at once
    # agent tools (docs/agents.md): MCP servers as JSON, over the TOML file's [mcp.NAME] tables
    mcp_servers: str | None = None
    # PROVIDER[:MODEL]=INPUT/OUTPUT per million tokens (prices.py); empty: costs are not known.
    prices: Prices = field(default_factory=Prices)
    providers_raw: Mapping[str, Any] = field(default_factory=dict)
    mcp_raw: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict, repr=False)

    def validate(self) -> Config:
        if self.workers < 0 or self.workers > 10_000:
            raise ConfigError("PROMPTSCHED_WORKERS", "must be between 0 and 10000")
        if not 0 <= self.http_port <= 65535:
            raise ConfigError("PROMPTSCHED_HTTP_PORT", "must be a port number (0 picks a free one)")
        if self.lease < timedelta(seconds=1):
            raise ConfigError("PROMPTSCHED_LEASE", "must be at least 1s")
        if self.heartbeat <= timedelta(0) or self.heartbeat * 2 > self.lease:
            raise ConfigError(
                "PROMPTSCHED_HEARTBEAT",
                f"must be positive and at most half of PROMPTSCHED_LEASE ({self.lease}), so one "
                "late heartbeat does not lose the lease",
            )
        unknown = sorted(set(self.roles) - set(ROLES))
        if unknown or not self.roles:
            raise ConfigError("PROMPTSCHED_ROLES", f"roles are {', '.join(ROLES)}; got {unknown}")
        self._validate_database()
        if self.log_level not in LOG_LEVELS:
            raise ConfigError("PROMPTSCHED_LOG_LEVEL", f"one of {', '.join(LOG_LEVELS)}")
        if self.log_format not in ("json", "console", "auto"):
            raise ConfigError("PROMPTSCHED_LOG_FORMAT", "json or console")
        if self.event_loop not in eventloop.LOOPS:
            raise ConfigError("PROMPTSCHED_EVENT_LOOP", f"one of {', '.join(eventloop.LOOPS)}")
        if self.event_loop == "uvloop" and not eventloop.uvloop_installed():
            raise ConfigError("PROMPTSCHED_EVENT_LOOP", "uvloop is not installed here")
        self._validate_notifier()
        self._validate_http()
        if not timedelta(milliseconds=100) <= self.fleet_interval <= timedelta(minutes=5):
            raise ConfigError("PROMPTSCHED_FLEET_INTERVAL", "must be between 100ms and 5m")
        self._validate_quotas()
        return self

    def _validate_http(self) -> None:
        for name, value in (
            ("PROMPTSCHED_HTTP_IDLE_TIMEOUT", self.http_idle_timeout),
            ("PROMPTSCHED_HTTP_HEADER_TIMEOUT", self.http_header_timeout),
            ("PROMPTSCHED_HTTP_BODY_TIMEOUT", self.http_body_timeout),
        ):
            if not timedelta(milliseconds=100) <= value <= timedelta(hours=1):
                raise ConfigError(name, "must be between 100ms and 1h")
        if not 1 <= self.http_max_connections <= 1_000_000:
            raise ConfigError("PROMPTSCHED_HTTP_MAX_CONNECTIONS", "must be between 1 and 1000000")

    def _validate_quotas(self) -> None:
        for name, value in (
            ("PROMPTSCHED_OWNER_MAX_SCHEDULES", self.owner_max_schedules),
            ("PROMPTSCHED_OWNER_RUNS_PER_MINUTE", self.owner_runs_per_minute),
        ):
            if not 0 <= value <= 100_000_000:
                raise ConfigError(name, "must be between 0 (no quota) and 100000000")
        if not 0 <= self.api_rate <= 1_000_000:
            raise ConfigError("PROMPTSCHED_API_RATE", "must be between 0 (no limit) and 1000000")
        if not 1 <= self.api_burst <= 1_000_000:
            raise ConfigError("PROMPTSCHED_API_BURST", "must be between 1 and 1000000")

    def _validate_database(self) -> None:
        if not 0 <= self.statement_cache_size <= 100_000:
            raise ConfigError(
                "PROMPTSCHED_STATEMENT_CACHE_SIZE",
                "must be between 0 and 100000 (0 turns the cache off, for transaction poolers)",
            )
        if self.direct_database_url and not self.database_url:
            raise ConfigError(
                "PROMPTSCHED_DIRECT_DATABASE_URL",
                "needs PROMPTSCHED_DATABASE_URL too (the embedded server needs neither)",
            )

    def _validate_notifier(self) -> None:
        if self.smtp_tls not in SMTP_TLS:
            raise ConfigError("PROMPTSCHED_SMTP_TLS", f"one of {', '.join(SMTP_TLS)}")
        if self.smtp_port is not None and not 1 <= self.smtp_port <= 65535:
            raise ConfigError("PROMPTSCHED_SMTP_PORT", "must be a port number")
        if "@" not in self.smtp_from or any(ch in self.smtp_from for ch in "\r\n<>"):
            raise ConfigError("PROMPTSCHED_SMTP_FROM", "must be an email address")
        if self.public_url is not None and (
            not self.public_url.startswith(("http://", "https://"))
            or any(ch.isspace() for ch in self.public_url)
        ):
            raise ConfigError("PROMPTSCHED_PUBLIC_URL", "must be an http:// or https:// URL")
        if bool(self.smtp_username) != bool(self.smtp_password):
            raise ConfigError(
                "PROMPTSCHED_SMTP_PASSWORD", "set both PROMPTSCHED_SMTP_USERNAME and the password"
            )
        if not 1 <= self.notifier_max_attempts <= 100:
            raise ConfigError("PROMPTSCHED_NOTIFIER_MAX_ATTEMPTS", "must be between 1 and 100")
        if not timedelta(minutes=1) <= self.digest_period <= timedelta(days=7):
            raise ConfigError("PROMPTSCHED_DIGEST_PERIOD", "must be between 1m and 7d")
        if not 1 <= self.notifier_batch <= 1000:
            raise ConfigError("PROMPTSCHED_NOTIFIER_BATCH", "must be between 1 and 1000")
        if self.notifier_timeout <= timedelta(0) or self.notifier_timeout >= self.notifier_lease:
            raise ConfigError(
                "PROMPTSCHED_NOTIFIER_TIMEOUT",
                f"must be positive and shorter than PROMPTSCHED_NOTIFIER_LEASE "
                f"({self.notifier_lease}), so a send ends before its claim expires",
            )

    @property
    def database(self) -> DatabaseSettings:
        return DatabaseSettings(
            url=self.database_url,
            direct_url=self.direct_database_url,
            statement_cache_size=self.statement_cache_size,
            data_dir=self.data_dir,
        )

    @property
    def scheduler(self) -> SchedulerSettings:
        return SchedulerSettings(
            batch=self.scheduler_batch,
            max_sleep=self.scheduler_max_sleep,
            rush_batch=self.scheduler_rush_batch,
            owner_runs_per_minute=self.owner_runs_per_minute,
        )

    @property
    def worker(self) -> WorkerSettings:
        return WorkerSettings(
            slots=self.workers,
            worker_id=self.worker_id,
            lease=self.lease,
            heartbeat=self.heartbeat,
            drain_grace=self.drain_grace,
            retry_base=self.retry_base,
            retry_max=self.retry_max,
            max_sleep=self.worker_max_sleep,
            prices=self.prices,
        )

    @property
    def reaper(self) -> ReaperSettings:
        return ReaperSettings(
            deadline_grace=self.lease, max_sleep=self.reaper_max_sleep, retention=self.retention
        )

    @property
    def notifier(self) -> NotifierSettings:
        return NotifierSettings(
            lease=self.notifier_lease,
            timeout=self.notifier_timeout,
            max_attempts=self.notifier_max_attempts,
            retry_base=self.notifier_retry_base,
            retry_max=self.notifier_retry_max,
            batch=self.notifier_batch,
            max_sleep=self.notifier_max_sleep,
            digest_period=self.digest_period,
            crash_after_send=self.env.get(CRASH_AFTER_SEND_ENV) == "1",
        )

    @property
    def api(self) -> ApiSettings:
        return ApiSettings(
            host=self.http_host,
            port=self.http_port,
            webhook_allow=self.webhook_allow,
            retention=self.retention if self.retention > timedelta(0) else None,
            idle_timeout=self.http_idle_timeout,
            header_timeout=self.http_header_timeout,
            body_timeout=self.http_body_timeout,
            max_connections=self.http_max_connections,
            trusted_proxies=self.trusted_proxies,
            public_https=(self.public_url or "").lower().startswith("https://"),
            max_schedules=self.owner_max_schedules,
            rate=self.api_rate,
            burst=self.api_burst,
        )

    def resolved_log_format(self) -> str:
        if self.log_format != "auto":
            return self.log_format
        return "console" if sys.stderr.isatty() else "json"


def default_data_dir(env: Mapping[str, str]) -> Path:
    """Where the embedded database lives without ``PROMPTSCHED_DATA_DIR``: the user's XDG data
    home (``$XDG_DATA_HOME/promptsched``, else ``~/.local/share/promptsched``), whatever the
    working directory."""
    xdg = env.get("XDG_DATA_HOME", "")
    if xdg and Path(xdg).is_absolute():  # the XDG spec: relative values are ignored
        return Path(xdg) / "promptsched"
    home = env.get("HOME") or str(Path.home())
    return Path(home) / ".local" / "share" / "promptsched"


# variable suffix -> (field, parser)
def _int(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(name, f"must be a whole number, got {text!r}") from None


def _float(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(name, f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise ConfigError(name, f"must be a number, got {text!r}")
    return value


def _duration(name: str, text: str) -> timedelta:
    try:
        return parse_duration(text, field=name)
    except ConfigError:
        raise
    except Exception as exc:  # ValidationError from the duration parser
        raise ConfigError(name, str(exc).split(": ", 1)[-1]) from None


def _roles(name: str, text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _str(name: str, text: str) -> str:
    return text


def _bool(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(name, f"must be true or false, got {text!r}")


def _allowlist(variable: str) -> Any:
    def parse(name: str, text: str) -> netguard.Allowlist:
        try:
            return netguard.Allowlist.parse(text, variable=variable)
        except ValueError as exc:
            raise ConfigError(name, f"{exc}; expected comma-separated hosts or CIDRs") from None

    return parse


def _proxies(name: str, text: str) -> tuple[IPNetwork, ...]:
    try:
        listed = netguard.Allowlist.parse(text, variable="PROMPTSCHED_TRUSTED_PROXIES")
    except ValueError as exc:
        raise ConfigError(name, f"{exc}; expected comma-separated addresses or CIDRs") from None
    if listed.hosts:
        raise ConfigError(
            name,
            f"{sorted(listed.hosts)[0]!r} is a host name: list the proxies' addresses or CIDRs "
            "(a request's peer is an address)",
        )
    return listed.networks


def _toml_text(value: Any) -> str:
    """A TOML value as the text its variable would hold (a list becomes comma-separated)."""
    return ",".join(str(item) for item in value) if isinstance(value, list) else str(value)


_PARSERS: dict[str, Any] = {
    "database_url": _str,
    "direct_database_url": _str,
    "statement_cache_size": _int,
    "data_dir": lambda name, text: Path(text),
    "http_host": _str,
    "http_port": _int,
    "workers": _int,
    "roles": _roles,
    "lease": _duration,
    "heartbeat": _duration,
    "drain_grace": _duration,
    "retry_base": _duration,
    "retry_max": _duration,
    "scheduler_batch": _int,
    "scheduler_rush_batch": _int,
    "scheduler_max_sleep": _duration,
    "worker_max_sleep": _duration,
    "reaper_max_sleep": _duration,
    "retention": _duration,
    "log_level": lambda name, text: text.lower(),
    "log_format": lambda name, text: text.lower(),
    "event_loop": lambda name, text: text.lower(),
    "worker_id": _str,
    "smtp_host": _str,
    "smtp_port": _int,
    "smtp_username": _str,
    "smtp_password": lambda name, text: Secret(text),
    "smtp_tls": lambda name, text: text.lower(),
    "smtp_from": _str,
    "public_url": _str,
    "trusted_proxies": _proxies,
    "http_idle_timeout": _duration,
    "http_header_timeout": _duration,
    "http_body_timeout": _duration,
    "http_max_connections": _int,
    "allow_private_webhooks": _bool,
    "webhook_allow": _allowlist(netguard.WEBHOOK_ALLOW),
    "tools_allow": _allowlist(netguard.TOOLS_ALLOW),
    "notifier_max_attempts": _int,
    "notifier_retry_base": _duration,
    "notifier_retry_max": _duration,
    "notifier_lease": _duration,
    "notifier_timeout": _duration,
    "notifier_batch": _int,
    "notifier_max_sleep": _duration,
    "digest_period": _duration,
    "fleet_interval": _duration,
    "owner_max_schedules": _int,
    "owner_runs_per_minute": _int,
    "api_rate": _float,
    "api_burst": _int,
    "mcp_servers": _str,
    "prices": lambda name, text: Prices.parse(text, name),
}

SETTINGS = tuple(_PARSERS)


def env_name(setting: str) -> str:
    return f"PROMPTSCHED_{setting.upper()}"


def load(
    env: Mapping[str, str] | None = None, overrides: Mapping[str, str | None] | None = None
) -> Config:
    """Build the config: defaults < TOML file (``PROMPTSCHED_CONFIG``) < environment < flags."""
    env = dict(os.environ if env is None else env)
    values: dict[str, Any] = {}
    toml: dict[str, Any] = {}
    config_file = env.get("PROMPTSCHED_CONFIG")
    if config_file:
        try:
            toml = tomllib.loads(Path(config_file).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError("PROMPTSCHED_CONFIG", f"cannot read {config_file}: {exc}") from None
        for key, value in toml.items():
            if key in _PARSERS:
                values[key] = _PARSERS[key](f"{config_file}: {key}", _toml_text(value))
            elif key not in ("providers", "mcp"):
                raise ConfigError(f"{config_file}: {key}", f"unknown setting (known: {SETTINGS})")
    for setting, parser in _PARSERS.items():
        text = env.get(env_name(setting))
        if text is not None and text != "":
            values[setting] = parser(env_name(setting), text)
    for setting, text in (overrides or {}).items():
        if text is not None:
            values[setting] = _PARSERS[setting](f"--{setting.replace('_', '-')}", str(text))
    values.setdefault("data_dir", default_data_dir(env))
    known = {f.name for f in fields(Config)}
    config = Config(**{k: v for k, v in values.items() if k in known})
    if config.allow_private_webhooks:  # the deprecated flag: webhooks only, never tools
        config = replace(config, webhook_allow=config.webhook_allow.union(netguard.LEGACY_PRIVATE))
    return replace(
        config, providers_raw=toml.get("providers", {}), mcp_raw=toml.get("mcp", {}), env=env
    ).validate()
