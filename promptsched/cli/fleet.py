"""``promptsched status``: the fleet at a glance, from the database (direct mode) or through
``GET /v1/status`` (remote mode, an admin token); ``promptsched doctor``: this shell's
configuration checked (direct mode) or a replica's (``GET /v1/doctor``); text or ``--json``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

import anyio

from promptsched import config as configuration
from promptsched.cli import backend, common, remote
from promptsched.cli.backend import Backend
from promptsched.errors import PromptschedError
from promptsched.human import fleet as words

# The replica's id (host:random:pid/token) last: it is the one cell of no fixed width.
REPLICA_COLUMNS = (
    ("CONFIG", "state", 7), ("VERSION", "version", 8), ("UP", "up", 8),
    ("LAST SEEN", "seen", 10), ("SLOTS", "slots", 5), ("IN FLIGHT", "in_flight", 9),
    ("LEADS", "leads_text", 6), ("ROLES", "roles_text", 36), ("REPLICA", "id", 0),
)  # fmt: skip
PROVIDER_COLUMNS = (
    ("PROVIDER", "name", 12), ("KIND", "kind", 7), ("BREAKER", "breaker_text", 10),
    ("RUNNING", "running", 7), ("ALLOWED", "allowed", 7), ("LIMIT", "limit", 12),
    ("ROOM", "admitted_now", 5), ("READY", "ready", 5), ("WAITING", "waiting", 7),
    ("LATER", "scheduled", 5), ("PACING", "pacing", 0),
)  # fmt: skip


def print_status(data: Mapping[str, Any]) -> None:
    print(words.headline(data))
    print()
    common.table(words.replica_rows(data["replicas"]), REPLICA_COLUMNS)
    for replica in data["replicas"]:
        for line in replica["differs"]:
            print(f"  {replica['id']} differs: {line}")
    print()
    common.table(words.provider_rows(data["providers"]), PROVIDER_COLUMNS)
    print()
    print(words.queue_line(data["queue"]))
    print(words.outbox_line(data["outbox"]))


def cmd_status(args: argparse.Namespace, config: configuration.Config) -> int:
    async def action(api: Backend) -> int:
        data = await api.status()
        if args.json:
            print(json.dumps(data))
        else:
            print_status(data)
        return 0

    return backend.run(args, config, action)


def print_doctor(data: Mapping[str, Any]) -> None:
    """One line per check, the fix after it when it did not pass."""
    for check in data["checks"]:
        line = f"{words.MARKS.get(check['status'], check['status']):<5} {check['name']}: "
        line += check["message"]
        if check["fix"] and check["status"] in ("fail", "warn"):
            line += f" -> fix: {check['fix']}"
        print(line)
    if data.get("shell"):
        print(f"(the service is judged by what {data['judged_by']} publish)")
        print("this shell's own settings (they only matter to commands run here):")
        for check in data["shell"]:
            line = f"  {words.MARKS.get(check['status'], check['status']):<5} "
            print(line + f"{check['name'].removeprefix('this shell: ')}: {check['message']}")
    broken = [c["name"] for c in data["checks"] if c["status"] == "fail"]
    print(f"broken: {', '.join(broken)}" if broken else "nothing is broken")


async def _doctor_direct(config: configuration.Config) -> dict[str, Any]:
    from promptsched.executors.settings import parse_providers
    from promptsched.ops import doctor, fleet, probes

    providers = parse_providers(config.env, config.providers_raw)
    published = fleet.describe(config, providers, roles=config.roles, slots=config.workers)
    try:
        with common.database(config) as dsn:
            return await doctor.run(config, dsn, published, from_outside=True)
    except PromptschedError as exc:  # no database to reach (the embedded one does not exist)
        fix = "start the service with `promptsched run`, or set PROMPTSCHED_DATABASE_URL"
        return doctor.report([probes.Check("database", "fail", str(exc), fix)])


def cmd_doctor(args: argparse.Namespace, config: configuration.Config) -> int:
    where = backend.remote_target(args, config)
    if where is None:
        data = anyio.run(_doctor_direct, config)
    else:
        target = where

        async def ask() -> dict[str, Any]:
            async with remote.RemoteBackend(target) as api:
                return await api.doctor()

        data = anyio.run(ask)
    if args.json:
        print(json.dumps(data))
    else:
        print_doctor(data)
    return 0 if data["ok"] else 1


def register(sub: Any) -> None:
    status = sub.add_parser(
        "status",
        help="the fleet at a glance: replicas, drift, providers, queue, outbox",
        description="Replicas with their version, uptime, duties, attempts in flight, last "
        "renewal and configuration drift; each provider's breaker, room and pacing; the queue; "
        "the outbox. Remote mode needs an admin token.",
    )
    status.add_argument("--json", action="store_true", help="one JSON object")
    status.set_defaults(func=cmd_status)
    doctor = sub.add_parser(
        "doctor",
        help="check the configuration against what it needs; exit 1 when something is broken",
        description="One line per check, with the fix when it fails: the database and its "
        "schema, the clock, the pooler and the direct URL, each provider (one cheap request; "
        "PROMPTSCHED_PROVIDER_<NAME>_PROBE=false skips it), SMTP (connect, TLS, login, "
        "nothing sent), the webhook and chat targets in use against the allowlist, the public "
        "URL, and this configuration against the running fleet's. Direct mode judges the "
        "service by what its running replicas publish (mail, providers, allowlist) and reports "
        "this shell's own settings apart (they only matter to commands run here), or checks "
        "this shell's configuration when no replica runs; remote mode (an admin token) the "
        "answering replica's.",
    )
    doctor.add_argument("--json", action="store_true", help="one JSON object")
    doctor.set_defaults(func=cmd_doctor)
