"""The schedule fields that ``schedules add`` and ``schedules edit`` share: their flags, and
the API request body (``ScheduleCreate``/``SchedulePatch``) the flags make."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from promptsched import budgets
from promptsched.cli import common
from promptsched.errors import ValidationError
from promptsched.ops import inputs, notify_targets

# flag dest -> API field, for the flags `add` and `edit` share
FIELDS = {
    "name": "name", "prompt": "prompt", "tz": "timezone", "provider": "provider",
    "model": "model", "misfire": "misfire", "misfire_cap": "misfire_cap",
    "misfire_grace": "misfire_grace", "catchup_window": "catchup_window",
    "overlap": "overlap", "max_attempts": "max_attempts", "timeout": "timeout",
    "jitter": "jitter", "dst_gap": "dst_gap", "dst_fold": "dst_fold",
    "pause_after_failures": "pause_after_failures",
    "cron": "cron", "rrule": "rrule", "at": "at", "every": "every",
    "notify_when": "notify_when", "give_up_after": "give_up_after",
}  # fmt: skip
CLEARABLE = ("model", "catchup_window", "jitter")  # an empty value clears these


def params(pairs: list[str]) -> dict[str, str]:
    found = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValidationError("--param", f"expected KEY=VALUE, got {pair!r}")
        found[key] = value
    return found


NOTIFY_FLAGS = ("email", "webhook", "webhook_secret_file", *notify_targets.CHATS, "notify_on")


def notify_flags_given(args: argparse.Namespace) -> bool:
    return any(getattr(args, dest, None) for dest in NOTIFY_FLAGS)


def _secret_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            secret = handle.read(4096).strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationError("--webhook-secret-file", f"cannot read {path}: {exc}") from None
    if not secret:
        raise ValidationError("--webhook-secret-file", f"{path} is empty")
    return secret


def _webhook(args: argparse.Namespace, current: dict[str, Any]) -> dict[str, Any] | None:
    """The webhook the flags ask for: a new URL keeps the stored secret unless a secret file
    is given; a secret file alone rotates the secret of the current webhook."""
    if not (args.webhook or args.webhook_secret_file):
        return None
    hook: dict[str, Any] = {}
    if args.webhook:
        hook["url"] = args.webhook
    else:
        known = current.get("webhook")
        if not isinstance(known, dict) or not known.get("url"):
            raise ValidationError("--webhook-secret-file", "give --webhook URL too: none is set")
        hook["url"] = known["url"]
    if args.webhook_secret_file:
        hook["secret"] = _secret_file(args.webhook_secret_file)
    return hook


def notify(args: argparse.Namespace, current: dict[str, Any]) -> dict[str, Any] | None:
    """The ``notify`` value the flags ask for, starting from ``current``; None: unchanged."""
    if args.no_notify:
        if notify_flags_given(args):
            raise ValidationError("--no-notify", "cannot be combined with other notify flags")
        return {}
    if not notify_flags_given(args):
        return None
    result = dict(current)
    if args.email:
        result["email"] = list(args.email)
    hook = _webhook(args, current)
    if hook is not None:
        result["webhook"] = hook
    for chat in notify_targets.CHATS:
        if getattr(args, chat):
            result[chat] = {"url": getattr(args, chat)}
    if args.notify_on:
        events = {e.strip() for e in args.notify_on.split(",") if e.strip()}
        if not events <= {"success", "failure"}:
            raise ValidationError("--notify-on", "a comma-separated list of success, failure")
        result["on_success"], result["on_failure"] = "success" in events, "failure" in events
    return result


def output_schema(path: str) -> dict[str, Any] | None:
    """The JSON Schema in the file (``-``: standard input); an empty path clears it."""
    if path == "":
        return None
    try:
        if path == "-":
            text = sys.stdin.read(1 << 20)
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read(1 << 20)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationError("--output-schema", f"cannot read {path}: {exc}") from None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValidationError("--output-schema", f"{path} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValidationError("--output-schema", f"{path} holds no JSON object")
    return value


def fields(args: argparse.Namespace) -> dict[str, Any]:
    """The schedule fields the flags give (absent flags are absent)."""
    body: dict[str, Any] = {}
    for dest, key in FIELDS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        if key in CLEARABLE and value == "":
            value = None
        if key == "pause_after_failures" and value == 0:
            value = None
        body[key] = value
    if getattr(args, "output_schema", None) is not None:
        body["output_schema"] = output_schema(args.output_schema)
    if getattr(args, "no_fallback", False):
        if getattr(args, "fallback", None):
            raise ValidationError("--no-fallback", "cannot be combined with --fallback")
        body["fallback"] = []
    elif getattr(args, "fallback", None):
        body["fallback"] = list(args.fallback)
    if getattr(args, "no_budget", False):
        if getattr(args, "budget", None):
            raise ValidationError("--no-budget", "cannot be combined with --budget")
        body["budget"] = None
    elif getattr(args, "budget", None):
        body["budget"] = budgets.parse_flags(args.budget, field="--budget")
    return body


def add_field_flags(cmd: argparse.ArgumentParser, *, creating: bool) -> None:
    """The schedule's fields, shared by ``add`` and ``edit`` (on edit every one is optional,
    and an empty --model/--jitter/--catchup-window clears it)."""
    cmd.add_argument("--name", required=creating, help="the schedule's name, unique per owner")
    kind = cmd.add_mutually_exclusive_group(required=creating)
    kind.add_argument("--cron", help="5-field, or 6-field with seconds first")
    kind.add_argument("--rrule", help="RFC 5545 RRULE (with DTSTART)")
    kind.add_argument("--at", help="one-shot local ISO date-time")
    kind.add_argument("--every", help="interval such as 15m")
    cmd.add_argument("--tz", default="UTC" if creating else None, help="IANA time zone")
    cmd.add_argument(
        "--prompt", required=creating,
        help="what the model is asked; {{ variable }} tags are filled in each run (below)",
    )  # fmt: skip
    cmd.add_argument(
        "--provider", default="echo" if creating else None,
        help="the configured provider to ask" + (" (default: echo)" if creating else ""),
    )  # fmt: skip
    cmd.add_argument("--model", help="the provider's model (default: the provider's own)")
    cmd.add_argument(
        "--misfire", choices=inputs.MISFIRE_POLICIES,
        help="slots missed while nothing ran: run_once (default), skip, or run_all",
    )  # fmt: skip
    cmd.add_argument(
        "--misfire-cap", type=common.whole, metavar="N", help="most runs run_all makes"
    )
    cmd.add_argument("--misfire-grace", metavar="DUR", help="a slot this late is still on time")
    cmd.add_argument("--catchup-window", metavar="DUR", help="older slots are never run")
    cmd.add_argument("--overlap", help="skip, allow, buffer_one, buffer_all, cancel_other")
    cmd.add_argument(
        "--max-attempts", type=common.whole, help="attempts before a run is dead (default 3)"
    )
    cmd.add_argument("--timeout", metavar="DUR", help="each attempt's limit, e.g. 5m (default)")
    cmd.add_argument(
        "--give-up-after",
        metavar="DUR",
        help="how long a run may stay throttled (429) before it ends dead (default 1h)",
    )
    cmd.add_argument(
        "--fallback",
        action="append",
        metavar="NAME[:MODEL]",
        help="a provider to try next after a retryable failure or throttling (repeatable, in "
        "order" + (")" if creating else "; replaces the current list)"),
    )
    if not creating:
        cmd.add_argument("--no-fallback", action="store_true", help="remove every fallback")
    cmd.add_argument("--jitter", metavar="DUR", help="a random delay up to this, e.g. 30s")
    cmd.add_argument(
        "--dst-gap", choices=("shift", "skip"),
        help="a local time the clocks skip: fire just after the gap (shift, default) or skip it",
    )  # fmt: skip
    cmd.add_argument(
        "--dst-fold", choices=("first", "both"),
        help="a local time that happens twice: fire at its first pass (default) or at both",
    )  # fmt: skip
    cmd.add_argument(
        "--pause-after-failures",
        type=common.whole,
        metavar="N",
        help="pause after N consecutive dead runs" + ("" if creating else " (0: never)"),
    )
    cmd.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a provider param (repeatable)" + ("" if creating else "; merged into the current"),
    )
    cmd.add_argument("--email", action="append", metavar="ADDR", help="notify (repeatable)")
    cmd.add_argument(
        "--webhook", metavar="URL", help="notify by a signed webhook (its secret is shown once)"
    )
    cmd.add_argument(
        "--webhook-secret-file",
        metavar="PATH",
        help="sign the webhook with the secret in this file instead of a generated one",
    )
    cmd.add_argument("--slack", metavar="URL", help="notify a Slack incoming webhook")
    cmd.add_argument("--discord", metavar="URL", help="notify a Discord webhook")
    cmd.add_argument("--ntfy", metavar="URL", help="notify an ntfy topic (https://ntfy.sh/TOPIC)")
    cmd.add_argument("--notify-on", metavar="EVENTS", help="success,failure (default: both)")
    cmd.add_argument("--no-notify", action="store_true", help="no notifications")
    cmd.add_argument(
        "--budget",
        action="append",
        metavar="LIMIT=VALUE",
        help="a spend limit: tokens/day, cost/day, tokens/month or cost/month (UTC), e.g. "
        "tokens/day=200000 (repeatable" + (")" if creating else "; replaces the current budget)"),
    )
    cmd.add_argument("--no-budget", action="store_true", help="no budget for this schedule")
    cmd.add_argument(
        "--notify-when",
        metavar="WHEN",
        help="when a success notifies: always (default), changed, changed /pointer, /pointer, "
        "/pointer == JSON, /pointer != JSON (docs/monitors.md)",
    )
    cmd.add_argument(
        "--output-schema",
        metavar="FILE",
        help="a JSON Schema file every answer must match (-: standard input"
        + (")" if creating else "; an empty value removes it)"),
    )
    cmd.add_argument("--json", action="store_true", help="print the schedule as JSON")
