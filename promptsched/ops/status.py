"""The fleet at a glance (``promptsched status``, ``GET /v1/status``, the console's status
page): the replicas with their version, uptime, duties, attempts in flight, last renewal and
configuration drift; each provider's state as the claim meets it (breaker, room, pacing); the
queue; the outbox. One document, read in one go from the database."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from asyncpg import Record

from promptsched.clock import Clock
from promptsched.ops import fleet
from promptsched.ops import schedules as schedule_ops
from promptsched.store import queries

# Replicas that stopped (or went silent) this recently are still listed, as not alive.
RECENT = timedelta(minutes=10)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _seconds(delta: timedelta) -> float:
    return round(max(0.0, delta.total_seconds()), 1)


def _listed(row: Record, now: datetime, fleet_shared: Mapping[str, Any] | None) -> dict[str, Any]:
    """A replica as status shows it; one whose row this release cannot read (another
    release's configuration document) is still listed, with what could be read and why the
    rest could not, never dropped and never failing the whole status."""
    try:
        return _replica(row, now, fleet_shared)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        alive = bool(row["alive"])
        return {
            "id": str(row["id"]), "host": str(row["host"]), "version": str(row["version"]),
            "roles": [str(r) for r in row["roles"] or []], "slots": int(row["slots"] or 0),
            "in_flight": 0, "started_at": _iso(row["started_at"]),
            "uptime_seconds": _seconds((row["stopped_at"] or now) - row["started_at"]),
            "seen_at": _iso(row["seen_at"]), "seen_seconds_ago": _seconds(now - row["seen_at"]),
            "alive": alive, "stopped_at": _iso(row["stopped_at"]), "leads": [],
            "fingerprint": str(row["fingerprint"]), "drift": alive,
            "differs": [f"its published configuration could not be read ({type(exc).__name__}):"
                        " it may be of another release"],
        }  # fmt: skip


def _replica(row: Record, now: datetime, fleet_shared: Mapping[str, Any] | None) -> dict[str, Any]:
    shared = (row["config"] or {}).get("shared") or {}
    drift = row["alive"] and fleet_shared is not None and shared != fleet_shared
    return {
        "id": row["id"],
        "host": row["host"],
        "version": row["version"],
        "roles": list(row["roles"]),
        "slots": row["slots"],
        "in_flight": row["in_flight"] if row["alive"] else 0,
        "started_at": _iso(row["started_at"]),
        "uptime_seconds": _seconds((row["stopped_at"] or now) - row["started_at"]),
        "seen_at": _iso(row["seen_at"]),
        "seen_seconds_ago": _seconds(now - row["seen_at"]),
        "alive": row["alive"],
        "stopped_at": _iso(row["stopped_at"]),
        "leads": list(row["leads"]),
        "fingerprint": row["fingerprint"],
        "drift": bool(drift),
        "differs": fleet.differences(shared, fleet_shared) if drift and fleet_shared else [],
    }


def _limits(config: Mapping[str, Any]) -> dict[str, tuple[int, queries.ProviderLimits]]:
    """The fleet-wide limited providers of a published configuration, each asked for as many
    runs as its limit, so the room the claim would admit now is its answer."""
    wanted = {}
    for name, provider in ((config.get("shared") or {}).get("providers") or {}).items():
        limits = provider.get("limits") or {}
        if not limits.get("fleet_wide"):
            continue
        wanted[name] = (
            int(limits["max_concurrency"]),
            queries.ProviderLimits(
                int(limits["max_concurrency"]), limits.get("rate_per_second"),
                float(limits.get("burst") or 1), limits.get("tokens_per_minute"),
            ),
        )  # fmt: skip
    return wanted


def _breaker(room: Record | None) -> str:
    if room is None:
        return "closed"
    if (room.get("open_for") or 0) > 0:
        return "open"
    return "half_open" if room.get("half_open") else "closed"


def _provider(
    name: str, provider: Mapping[str, Any], room: Record | None, pending: Record | None
) -> dict[str, Any]:
    limits = provider.get("limits") or {}
    ramp = room.get("ramp") if room is not None else None
    return {
        "name": name,
        "kind": provider.get("kind"),
        "fleet_wide": bool(limits.get("fleet_wide")),
        "max_concurrency": limits.get("max_concurrency"),
        "rate_per_second": limits.get("rate_per_second"),
        "tokens_per_minute": limits.get("tokens_per_minute"),
        "running": room["running"] if room is not None else None,
        "admitted_now": room["allowed"] if room is not None else None,
        "breaker": _breaker(room),
        "open_for_seconds": round(room.get("open_for") or 0.0, 1) if room is not None else 0.0,
        # After the breaker opened, the concurrency the fleet allows ramps back (floor(ramp)).
        "allowed_concurrency": _allowed(limits.get("max_concurrency"), ramp),
        "failures": room["failures"] if room is not None else None,
        "rate_tokens": _round(room.get("tokens")) if room is not None else None,
        "llm_tokens": _round(room.get("llm_tokens")) if room is not None else None,
        "paced_for_seconds": _round(room.get("paced_for")) if room is not None else None,
        "ready": pending["ready"] if pending is not None else 0,
        "waiting": pending["waiting"] if pending is not None else 0,
        "scheduled": pending["scheduled"] if pending is not None else 0,
        "oldest_ready_seconds": round(pending["oldest_ready"], 1) if pending is not None else 0.0,
    }


def _allowed(limit: int | None, ramp: float | None) -> int | None:
    if limit is None or ramp is None:
        return limit
    return max(0, min(limit, int(ramp)))


def _round(value: float | None) -> float | None:
    return round(value, 2) if value is not None else None


async def gather(db: queries.DB, clock: Clock) -> dict[str, Any]:
    """The status document (docs/cli.md, ``promptsched status``)."""
    now_arg = clock.sql_now()
    rows = await queries.replica_list(db, now_arg, RECENT)
    now = rows[0]["db_now"] if rows else await schedule_ops.db_now(db, clock)
    alive = [row for row in rows if row["alive"]]
    lead = fleet.leading(alive)
    chosen = lead["fingerprint"] if lead is not None else None
    source = lead or (rows[0] if rows else None)
    config = source["config"] if source is not None else {}
    if not isinstance(config, Mapping) or not isinstance(config.get("shared") or {}, Mapping):
        config = {}  # a document of another release: its replicas are listed all the same
    fleet_shared = config.get("shared") if chosen is not None else None
    wanted = _limits(config)
    rooms = {row["provider"]: row for row in await queries.stats_provider_room(db, now_arg, wanted)}
    pending = {row["provider"]: row for row in await queries.stats_pending_runs(db, now_arg)}
    depth = await queries.stats_queue_depth(db, now_arg)
    outbox = {row["status"]: row["count"] for row in await queries.stats_outbox_depth(db)}
    providers = (config.get("shared") or {}).get("providers") or {}
    return {
        "now": _iso(now),
        "fleet": {
            "replicas": len(alive),
            "fingerprints": len({row["fingerprint"] for row in alive}),
            "drift": len({row["fingerprint"] for row in alive}) > 1,
            "fingerprint": chosen,
            "versions": sorted({row["version"] for row in alive}),
        },
        "replicas": [_listed(row, now, fleet_shared) for row in rows],
        "providers": [
            _provider(name, providers[name], rooms.get(name), pending.get(name))
            for name in sorted(providers)
        ],
        "queue": {
            "ready": sum(row["ready"] for row in pending.values()),
            "waiting": sum(row["waiting"] for row in pending.values()),
            "scheduled": sum(row["scheduled"] for row in pending.values()),
            "running": depth["running"],
            "lease_expired": depth["lease_expired"],
            "deadline_passed": depth["deadline_passed"],
        },
        "outbox": {status: outbox.get(status, 0) for status in ("pending", "sending", "dead")},
    }
