"""``promptsched schedules ...``: add, list, show, edit, pause, resume, trigger, delete, backfill,
history and explain; each renders the API's JSON, whether it came over HTTP or from the
database."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any

from promptsched import config as configuration
from promptsched import errors
from promptsched.cli import backend, common, lookup, render, schedule_flags
from promptsched.cli.backend import Backend
from promptsched.cli.common import CliError, instant, now_of, table
from promptsched.errors import ValidationError
from promptsched.human import schedules as human_schedules
from promptsched.human import times
from promptsched.web import auth

SCHEDULE_HELP = "its id, or its name (unique per owner)"
OWNER_HELP = (
    "direct mode only: the owner the new schedule belongs to (default: 'default'); "
    "in remote mode a schedule belongs to the token's owner"
)
_COLUMNS = (
    ("ID", "id", 6),
    ("OWNER", "owner", 12),
    ("NAME", "name", 24),
    ("KIND", "kind", 5),
    ("EXPRESSION", "expression", 22),
    ("TZ", "timezone", 16),
    ("STATE", "state", 8),
    ("NEXT FIRE", "next", 0),
)
_HISTORY_COLUMNS = (
    ("ID", "id", 6),
    ("AT", "when", 44),
    ("ACTOR", "actor", 12),
    ("ACTION", "action", 8),
    ("CHANGES", "words", 0),
)
_RUN_COLUMNS = (("RUN", "id", 8), ("ORIGIN", "origin", 8), ("STATUS", "status", 9),
                ("DETAIL", "detail", 0))  # fmt: skip


def _print_schedule(args: argparse.Namespace, data: dict[str, Any], prefix: str = "") -> None:
    render.warn(data)
    if args.json:
        print(json.dumps(data))
        return
    print(prefix + render.schedule_line(data, now_of(args)))
    hook = (data.get("notify") or {}).get("webhook")
    if isinstance(hook, dict) and hook.get("secret"):
        # Shown once: the secret promptsched generated (one from a file, the user has).
        from_file = getattr(args, "webhook_secret_file", None)
        print(f"  notify: {render.notify_words(data['notify'], secret_from=from_file)}")


def cmd_add(args: argparse.Namespace, config: configuration.Config) -> int:
    body = schedule_flags.fields(args)
    body["params"] = schedule_flags.params(args.param)
    notify = schedule_flags.notify(args, {})
    if notify is not None:
        body["notify"] = notify
    if args.owner is not None:
        if backend.remote_target(args, config) is not None:
            raise CliError("--owner: in remote mode a schedule belongs to the token's owner")
        auth.check_owner(args.owner, "--owner")

    async def action(api: Backend) -> int:
        _print_schedule(args, await api.create_schedule(body, args.owner), "created ")
        return 0

    return backend.run(args, config, action, migrate_first=True)


def cmd_edit(args: argparse.Namespace, config: configuration.Config) -> int:
    """Read, change, write back conditioned on the version read (or ``--version``): a change
    made by someone else meanwhile is a conflict, never silently overwritten."""
    patch = schedule_flags.fields(args)
    if not (patch or args.param or args.unset_param or args.no_notify
            or schedule_flags.notify_flags_given(args)):  # fmt: skip
        raise ValidationError("edit", "nothing to change: give at least one field flag")

    async def action(api: Backend) -> int:
        sid = await lookup.schedule_id(api, args.schedule)
        current = await api.get_schedule(sid)
        if args.param or args.unset_param:
            params = {**(current.get("params") or {}), **schedule_flags.params(args.param)}
            for key in args.unset_param:
                params.pop(key, None)
            patch["params"] = params
        notify = schedule_flags.notify(args, current.get("notify") or {})
        if notify is not None:
            patch["notify"] = notify
        version = args.version if args.version is not None else current["version"]
        data = await api.update_schedule(sid, patch, version)
        _print_schedule(args, data, "updated ")
        return 0

    return backend.run(args, config, action)


def cmd_pause(args: argparse.Namespace, config: configuration.Config) -> int:
    if args.until:
        instant(args.until, "--until")

    async def action(api: Backend) -> int:
        sid = await lookup.schedule_id(api, args.schedule)
        _print_schedule(args, await api.pause_schedule(sid, args.until, args.reason))
        return 0

    return backend.run(args, config, action)


def cmd_resume(args: argparse.Namespace, config: configuration.Config) -> int:
    """The next fire time is computed from the server's answer after the resume, and is
    never in the past (slots missed meanwhile are the misfire policy's, and said so)."""

    async def action(api: Backend) -> int:
        sid = await lookup.schedule_id(api, args.schedule)
        _print_schedule(args, await api.resume_schedule(sid))
        return 0

    return backend.run(args, config, action)


def cmd_show(args: argparse.Namespace, config: configuration.Config) -> int:
    async def action(api: Backend) -> int:
        sid = await lookup.schedule_id(api, args.schedule)
        data = await api.get_schedule(sid)
        print(json.dumps(data) if args.json else render.schedule_details(data, now_of(args)))
        return 0

    return backend.run(args, config, action)


def _list_words(item: dict[str, Any], now: datetime) -> dict[str, str]:
    """The STATE and NEXT FIRE cells: a paused schedule with an end shows its first slot
    after the pause; a one-shot that fired, done."""
    state = human_schedules.state_key(item["enabled"], times.instant(item.get("next_fire_at")))
    found = render.next_fire(item, now)
    if found is None:
        return {"state": state, "next": f"- ({state})" if state != "enabled" else "-"}
    after = ", after the pause" if state == "paused" else ""
    return {"state": state, "next": times.when(found, item["timezone"], now) + after}


def cmd_list(args: argparse.Namespace, config: configuration.Config) -> int:
    if not 1 <= args.limit <= 10_000:
        raise ValidationError("--limit", "must be between 1 and 10000")

    async def action(api: Backend) -> int:
        data = await api.list_schedules(owner=args.owner, name=args.name, limit=args.limit)
        if args.json:
            print(json.dumps(data))
            return 0
        now = now_of(args)
        table([{**item, **_list_words(item, now)} for item in data], _COLUMNS)
        return 0

    return backend.run(args, config, action)


def cmd_trigger(args: argparse.Namespace, config: configuration.Config) -> int:
    async def action(api: Backend) -> int:
        sid = await lookup.schedule_id(api, args.schedule)
        data = await api.trigger_schedule(sid)
        render.warn(data)
        if args.json:
            print(json.dumps(data))
            return 0
        named = (await lookup.names(api, [sid]))[sid].words
        print(f"triggered run {data['id']} of {named} ({data['status']}); "
              f"promptsched runs watch {data['id']} follows it")  # fmt: skip
        return 0

    return backend.run(args, config, action)


def cmd_backfill(args: argparse.Namespace, config: configuration.Config) -> int:
    instant(args.start, "--start")
    instant(args.end, "--end")

    async def action(api: Backend) -> int:
        sid = await lookup.schedule_id(api, args.schedule)
        data = await api.backfill_schedule(sid, args.start, args.end)
        data = {**data, "slots": [run["slot"] for run in data["runs"]]}
        print(json.dumps(data) if args.json else f"created {data['created']} backfill runs")
        return 0

    return backend.run(args, config, action)


def cmd_delete(args: argparse.Namespace, config: configuration.Config) -> int:
    async def action(api: Backend) -> int:
        sid = await lookup.schedule_id(api, args.schedule)
        await api.delete_schedule(sid)
        print(
            json.dumps({"deleted": sid})
            if args.json
            else f"deleted schedule {sid} and its runs; its change history stays "
            f"(promptsched schedules history {sid})"
        )
        return 0

    return backend.run(args, config, action)


async def _zone(api: Backend, schedule_id: int) -> str:
    """The schedule's zone, UTC once it is deleted (its history outlives it)."""
    try:
        zone: str = (await api.get_schedule(schedule_id))["timezone"]
    except (CliError, errors.NotFound):
        return "UTC"
    return zone


def cmd_history(args: argparse.Namespace, config: configuration.Config) -> int:
    if not 1 <= args.limit <= 10_000:
        raise ValidationError("--limit", "must be between 1 and 10000")

    async def action(api: Backend) -> int:
        sid = await lookup.schedule_id(api, args.schedule)
        data = await api.schedule_history(sid, args.limit)
        if args.json:
            print(json.dumps(data))
            return 0
        zone, now = await _zone(api, sid), now_of(args)
        table(
            [{**c, "when": times.when(c["at"], zone, now), "words": render.change_words(c)}
             for c in data],
            _HISTORY_COLUMNS,
        )  # fmt: skip
        return 0

    return backend.run(args, config, action)


def cmd_explain(args: argparse.Namespace, config: configuration.Config) -> int:
    async def action(api: Backend) -> int:
        sid = await lookup.schedule_id(api, args.schedule)
        data = await api.explain(sid, args.at)
        if args.json:
            print(json.dumps(data))
            return 0
        now, expression = now_of(args), data["expression"]
        zone = expression["timezone"]
        print(f"{times.when(data['at'], zone, now)}: {data['verdict'].replace('_', ' ')}")
        print(f"  {data['message']}")
        print(f"  expression then: {expression['kind']} {expression['expression']} ({zone})")
        print(f"  previous fire time: {times.when(data['previous_fire_time'], zone, now)}")
        print(f"  next fire time:     {times.when(data['next_fire_time'], zone, now)}")
        if data["runs"]:
            print()
            runs = [{**r, "detail": r.get("skip_reason") or r.get("error")} for r in data["runs"]]
            table(runs, _RUN_COLUMNS)
        return 0

    return backend.run(args, config, action)


def _register_add_edit(schedules_sub: Any) -> None:
    add = schedules_sub.add_parser("add", help="create a schedule")
    schedule_flags.add_field_flags(add, creating=True)
    add.add_argument("--owner", help=OWNER_HELP)
    add.set_defaults(func=cmd_add)
    edit = schedules_sub.add_parser(
        "edit", help="change a schedule's fields (fails if it changed since it was read)"
    )
    edit.add_argument("schedule", help=SCHEDULE_HELP)
    schedule_flags.add_field_flags(edit, creating=False)
    edit.add_argument(
        "--unset-param", action="append", default=[], metavar="KEY",
        help="remove a provider param (repeatable)",
    )  # fmt: skip
    edit.add_argument(
        "--version",
        type=common.whole,
        help="change only if the schedule is still at this version (default: the one read)",
    )
    edit.set_defaults(func=cmd_edit)


def register(sub: Any) -> None:
    schedules = sub.add_parser("schedules", help="manage schedules")
    schedules_sub = schedules.add_subparsers(dest="schedules_command", required=True)
    _register_add_edit(schedules_sub)
    for name, func, help_text in (
        ("show", cmd_show, "show one schedule"),
        ("pause", cmd_pause, "pause a schedule (optionally until an instant)"),
        ("resume", cmd_resume, "resume a paused schedule"),
        ("trigger", cmd_trigger, "run a schedule now, outside its cadence"),
        ("delete", cmd_delete, "delete a schedule and its runs (its change history stays)"),
        ("backfill", cmd_backfill, "create runs for past slots in a range"),
        ("history", cmd_history, "who changed what, when (newest first)"),
        ("explain", cmd_explain, "why the schedule did (or will) fire or not at an instant"),
    ):
        cmd = schedules_sub.add_parser(name, help=help_text)
        cmd.add_argument("schedule", help=SCHEDULE_HELP)
        cmd.add_argument("--json", action="store_true")
        cmd.set_defaults(func=func)
        if name == "pause":
            cmd.add_argument("--until", help="ISO-8601 instant with offset: resume then")
            cmd.add_argument("--reason", help="why, kept in the schedule's history")
        if name == "backfill":
            cmd.add_argument("--start", required=True, help="ISO-8601 with offset")
            cmd.add_argument("--end", required=True, help="ISO-8601 with offset")
        if name == "history":
            cmd.add_argument("--limit", type=common.whole, default=100)
        if name == "explain":
            cmd.add_argument(
                "--at",
                "--slot",
                dest="at",
                required=True,
                help="ISO-8601 date-time; without an offset, in the schedule's zone",
            )
    listing = schedules_sub.add_parser("list", help="list schedules")
    listing.add_argument(
        "--owner", help="only this owner's (direct mode and admin tokens see every owner's)"
    )
    listing.add_argument("--name", help="a case-insensitive substring of the name")
    listing.add_argument("--limit", type=common.whole, default=100)
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_list)
