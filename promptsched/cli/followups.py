"""``promptsched followups ...``: place a keyed follow-up (idempotent by key), show one with
its checks, list them, cancel one by key (docs/followups.md)."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any

from promptsched import config as configuration
from promptsched.cli import backend, common, render
from promptsched.cli.backend import Backend
from promptsched.cli.common import now_of, table, table_text
from promptsched.errors import ValidationError
from promptsched.human import followups as human_followups
from promptsched.human import times
from promptsched.ops import followups as followup_ops
from promptsched.ops import notify_targets

_COLUMNS = (
    ("KEY", "key", 32),
    ("STATE", "state_words", 28),
    ("CHECKS", "checks", 9),
    ("FIRST CHECK", "first", 0),
)
_CHECK_COLUMNS = (
    ("#", "number", 3),
    ("RUN", "run_id", 7),
    ("STATUS", "status", 10),
    ("OUTCOME", "outcome_words", 28),
    ("DECISION", "decision_words", 0),
)
ZONE = "UTC"  # a follow-up's instants are given with their offset; it shows them in UTC


def _vars(pairs: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ValidationError("--var", f"expected NAME=VALUE, got {pair!r}")
        found[name] = value
    return found


def body_of(args: argparse.Namespace) -> dict[str, Any]:
    """The API's create body from the flags (absent flags are absent, so the same command run
    again sends the same body: idempotent by key)."""
    body: dict[str, Any] = {"key": args.key, "prompt": args.prompt}
    for flag, field in (("in_", "in"), ("at", "at"), ("provider", "provider"),
                        ("model", "model"), ("max_checks", "max_checks"),
                        ("horizon", "horizon"), ("resolution", "resolution"),
                        ("name", "name"), ("timeout", "timeout"),
                        ("give_up_after", "give_up_after"), ("fallback", "fallback")):  # fmt: skip
        value = getattr(args, flag)
        if value is not None:
            body[field] = value
    if args.var:
        body["vars"] = _vars(args.var)
    if args.email:
        body["notify"] = {"email": list(args.email)}
    if args.escalate_email:
        if args.escalate_after is None:
            raise ValidationError("--escalate-after", "give it with --escalate-email")
        body["escalate"] = [
            {"after_checks": args.escalate_after, "notify": {"email": list(args.escalate_email)}}
        ]
    elif args.escalate_after is not None:
        raise ValidationError("--escalate-email", "give it with --escalate-after")
    return body


def details(data: dict[str, Any], now: datetime) -> str:
    """A follow-up with its targets, escalation, where it stands and every check."""
    pairs = [
        ("key", data["key"]),
        ("state", human_followups.state_words(data["state"], data.get("ended_reason"))),
        ("first check", times.when(data["due_at"], ZONE, now)),
        ("checks", f"{data['checks_done']} of at most {data['max_checks']}, none after "
                   f"{times.when(data['horizon'], ZONE, now)}"),
    ]  # fmt: skip
    if data.get("resolution"):
        pairs.append(("resolution", f"{data['resolution']} (every check rounded up to a multiple)"))
    pairs.append(("vars", render.scalar(data.get("vars"))))
    pairs.append(("notify", render.notify_words(data.get("notify"))))
    steps = [f"after {s['after_checks']} unresolved checks: "
             f"{notify_targets.words(s['notify'], when=False)}"
             for s in data.get("escalate") or []]  # fmt: skip
    pairs.append(("escalation", "; ".join(steps) or "none"))
    if data.get("cancelled_at"):
        pairs.append(("cancelled", f"by {data['cancelled_by']} "
                                   f"{times.when(data['cancelled_at'], ZONE, now)}"))  # fmt: skip
    pairs.append(("why", data["explanation"]))
    text = render.lines(pairs)
    checks = data.get("checks") or []
    if not checks:
        return text
    rows = [{**c, "outcome_words": human_followups.outcome_words(c.get("outcome")),
             "decision_words": human_followups.decision_words(
                 c.get("decision"), ZONE, final=c.get("outcome") == "done")}
            for c in checks]  # fmt: skip
    return text + "\n\n" + table_text(rows, _CHECK_COLUMNS)


def cmd_add(args: argparse.Namespace, config: configuration.Config) -> int:
    body = body_of(args)

    async def action(api: Backend) -> int:
        created, data = await api.create_followup(body, args.owner)
        if args.json:
            print(json.dumps(data))
        else:
            verb = "created" if created else "exists (same body: nothing changed)"
            first = times.when(data["due_at"], ZONE, now_of(args))
            print(f"follow-up {data['key']} {verb}: first check at {first}")
        return 0

    return backend.run(args, config, action)


def cmd_show(args: argparse.Namespace, config: configuration.Config) -> int:
    async def action(api: Backend) -> int:
        data = await api.get_followup(followup_ops.check_key(args.key), args.owner)
        print(json.dumps(data) if args.json else details(data, now_of(args)))
        return 0

    return backend.run(args, config, action)


def cmd_list(args: argparse.Namespace, config: configuration.Config) -> int:
    if not 1 <= args.limit <= 10_000:
        raise ValidationError("--limit", "must be between 1 and 10000")

    async def action(api: Backend) -> int:
        items = await api.list_followups(args.state, args.limit, args.owner)
        if args.json:
            print(json.dumps(items))
            return 0
        now = now_of(args)
        table([{**i, "checks": f"{i['checks_done']} of {i['max_checks']}",
                "state_words": human_followups.state_words(i["state"], i.get("ended_reason")),
                "first": times.when(i["due_at"], ZONE, now)} for i in items], _COLUMNS)  # fmt: skip
        return 0

    return backend.run(args, config, action)


def cmd_cancel(args: argparse.Namespace, config: configuration.Config) -> int:
    async def action(api: Backend) -> int:
        await api.cancel_followup(followup_ops.check_key(args.key), args.owner)
        print(json.dumps({"cancelled": args.key}) if args.json else
              f"follow-up {args.key} cancelled: no further check starts")  # fmt: skip
        return 0

    return backend.run(args, config, action)


def register(sub: Any) -> None:
    parser = sub.add_parser("followups", help="keyed follow-ups: add, show, list, cancel")
    commands = parser.add_subparsers(dest="followups_command", required=True)
    add = commands.add_parser("add", help="place a follow-up (the same key again: no change)")
    add.add_argument("--key", required=True, help="unique per owner, e.g. order-4711-unshipped")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--in", dest="in_", metavar="DUR", help="first check after this delay")
    when.add_argument("--at", metavar="ISO", help="first check at this instant (with offset)")
    add.add_argument("--prompt", required=True, help="{{ NAME }} tags take --var values")
    add.add_argument("--var", action="append", default=[], metavar="NAME=VALUE",
                     help="a template variable (repeatable)")  # fmt: skip
    add.add_argument("--provider")
    add.add_argument("--model")
    add.add_argument("--name")
    add.add_argument("--timeout", metavar="DUR")
    add.add_argument("--give-up-after", metavar="DUR", help="how long a check may stay throttled")
    add.add_argument("--fallback", action="append", metavar="NAME[:MODEL]",
                     help="a provider to try next (repeatable, in order)")  # fmt: skip
    add.add_argument("--max-checks", type=common.whole, metavar="N")
    add.add_argument("--horizon", help="no check after this: a duration after the first, or ISO")
    add.add_argument("--resolution", metavar="DUR", help="round every check up (15m)")
    add.add_argument("--email", action="append", metavar="ADDR", help="notify (repeatable)")
    add.add_argument(
        "--escalate-email", action="append", metavar="ADDR",
        help="after --escalate-after unresolved checks, notify this address",
    )  # fmt: skip
    add.add_argument("--escalate-after", type=common.whole, metavar="N")
    add.set_defaults(func=cmd_add)
    show = commands.add_parser("show", help="a follow-up with every check and decision")
    show.add_argument("key")
    show.set_defaults(func=cmd_show)
    listing = commands.add_parser("list", help="your follow-ups, newest first")
    listing.add_argument("--state", choices=followup_ops.STATES)
    listing.add_argument("--limit", type=common.whole, default=100)
    listing.set_defaults(func=cmd_list)
    cancel = commands.add_parser("cancel", help="cancel by key (again: nothing changes)")
    cancel.add_argument("key")
    cancel.set_defaults(func=cmd_cancel)
    for command in (add, show, listing, cancel):
        command.add_argument(
            "--owner",
            help="whose: direct mode, default `default`; remote mode, another owner's needs an "
            "admin token (new follow-ups are always the token's owner's)",
        )
        command.add_argument("--json", action="store_true")
