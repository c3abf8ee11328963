"""The fleet's status in words, the same in ``promptsched status`` and the console's status
page: the headline, a row per replica and per provider, the queue and the outbox."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from promptsched.human.times import span


def headline(data: Mapping[str, Any]) -> str:
    fleet = data["fleet"]
    alive = fleet["replicas"]
    if not alive:
        return "Fleet: no replica is running (none has renewed its row lately)"
    versions = ", ".join(fleet["versions"])
    words = f"Fleet: {alive} replica{'s' if alive != 1 else ''} alive, version {versions}"
    if len(fleet["versions"]) > 1:
        words += " (versions differ)"
    if fleet["drift"]:
        return f"{words}; configuration DRIFT: {fleet['fingerprints']} different fingerprints"
    return f"{words}; one configuration ({fleet['fingerprint']})"


def replica_rows(replicas: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in replicas:
        state = "DRIFT" if r["drift"] else "ok" if r["alive"] else "stopped"
        if not r["alive"] and r["stopped_at"] is None:
            state = "silent"  # its renewals stopped without a clean stop (a crash, a freeze)
        rows.append({
            **r,
            "up": span(r["uptime_seconds"]),
            "roles_text": ",".join(r["roles"]),
            "leads_text": ",".join(r["leads"]),
            "seen": f"{span(r['seen_seconds_ago'])} ago",
            "state": state,
        })  # fmt: skip
    return rows


def provider_rows(providers: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for p in providers:
        breaker = p["breaker"]
        if breaker == "open":
            breaker = f"open {span(p['open_for_seconds'])}"
        pacing = []
        if p.get("rate_per_second") is not None and p.get("rate_tokens") is not None:
            pacing.append(f"{p['rate_tokens']:g} of {p['rate_per_second']:g}/s")
        if p.get("llm_tokens") is not None:
            pacing.append(f"{p['llm_tokens']:g} LLM tokens")
        if p.get("paced_for_seconds"):
            pacing.append(f"held {span(p['paced_for_seconds'])} by its headers")
        rows.append({
            **p,
            "breaker_text": breaker if p["fleet_wide"] else "-",
            "limit": p["max_concurrency"] if p["fleet_wide"] else f"{p['max_concurrency']}/replica",
            "allowed": p["allowed_concurrency"] if p["fleet_wide"] else None,
            "pacing": "; ".join(pacing),
        })  # fmt: skip
    return rows


def queue_line(queue: Mapping[str, Any]) -> str:
    q = queue
    return (
        f"Queue: {q['ready']} ready, {q['waiting']} waiting behind their schedule, "
        f"{q['scheduled']} due later, {q['running']} running ({q['lease_expired']} with an "
        f"expired lease, {q['deadline_passed']} past their deadline)"
    )


def outbox_line(outbox: Mapping[str, Any]) -> str:
    o = outbox
    return f"Outbox: {o['pending']} pending, {o['sending']} sending, {o['dead']} dead"


# ``promptsched doctor``'s verdicts as a line starts them.
MARKS = {"ok": "ok", "warn": "warn", "fail": "FAIL", "skip": "skip"}
