"""``promptsched budget ...``: an owner's spend limits over all its schedules, and its spend
against them this UTC day and month (a schedule's own budget is ``schedules add/edit
--budget``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from promptsched import budgets
from promptsched import config as configuration
from promptsched.cli import backend, render
from promptsched.cli.backend import Backend
from promptsched.errors import ValidationError
from promptsched.web import auth


def _print(data: dict[str, Any], as_json: bool) -> None:
    render.warn(data)
    if as_json:
        print(json.dumps(data))
        return
    spend = data.get("spend") or {}
    print(f"owner:            {data.get('owner')}")
    print(f"budget:           {budgets.describe(data.get('budget'))}")
    for period, label in (("day", "spend today"), ("month", "spend this month")):
        got = spend.get(period) or {}
        print(f"{label + ':':<17} {got.get('tokens', 0)} tokens, cost {got.get('cost', 0):g} (UTC)")
    for row in spend.get("budget") or []:
        print(f"{'':<17} {budgets.standing_words(row)}")


def _check_owner(args: argparse.Namespace) -> None:
    if args.owner is not None:
        auth.check_owner(args.owner, "--owner")


def cmd_show(args: argparse.Namespace, config: configuration.Config) -> int:
    _check_owner(args)

    async def action(api: Backend) -> int:
        _print(await api.get_budget(args.owner), args.json)
        return 0

    return backend.run(args, config, action)


def cmd_set(args: argparse.Namespace, config: configuration.Config) -> int:
    _check_owner(args)
    if not args.limits:
        raise ValidationError("limits", "give at least one LIMIT=VALUE (or `budget clear`)")
    budget = budgets.parse_flags(args.limits, field="limits") or {}

    async def action(api: Backend) -> int:
        _print(await api.set_budget(args.owner, budget), args.json)
        return 0

    return backend.run(args, config, action)


def cmd_clear(args: argparse.Namespace, config: configuration.Config) -> int:
    _check_owner(args)

    async def action(api: Backend) -> int:
        _print(await api.set_budget(args.owner, {}), args.json)
        return 0

    return backend.run(args, config, action)


def register(sub: Any) -> None:
    parser = sub.add_parser("budget", help="an owner's spend limits and spend (UTC day, month)")
    commands = parser.add_subparsers(dest="budget_command", required=True)
    show = commands.add_parser("show", help="the owner's budget and its spend against it")
    put = commands.add_parser("set", help="set the owner's limits (they replace the current ones)")
    put.add_argument(
        "limits", nargs="*", metavar="LIMIT=VALUE",
        help="tokens/day, cost/day, tokens/month, cost/month, e.g. cost/month=40",
    )  # fmt: skip
    clear = commands.add_parser("clear", help="remove the owner's budget")
    for command, func in ((show, cmd_show), (put, cmd_set), (clear, cmd_clear)):
        command.add_argument(
            "--owner",
            help="whose (default: the token's owner remotely, `default` directly; another "
            "owner's needs an admin token)",
        )
        command.add_argument("--json", action="store_true")
        command.set_defaults(func=func)
