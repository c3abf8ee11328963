"""What ``--help`` says beyond the flags: each everyday command's description and an example,
the words of the flags every command shares, and the prompt's template variables."""

from __future__ import annotations

import argparse
import textwrap

from promptsched.executors import template

# The commands people type every day: a description and an example each (tests check both).
EVERYDAY: dict[str, tuple[str, str]] = {
    "run": (
        "Run the service in the foreground: the scheduler, the workers, the reaper, the "
        "notifier, the API and the console (http://127.0.0.1:8080/ui). Without "
        "PROMPTSCHED_DATABASE_URL it starts an embedded Postgres in the data directory.",
        "promptsched run",
    ),
    "schedules add": (
        "Create a schedule: when it fires (one of --cron, --rrule, --at, --every, in --tz), "
        "what it asks (--prompt, --provider, --model) and whom it tells (--email, --webhook, "
        "--slack, --discord, --ntfy). A new embedded database is created if there is none.",
        'promptsched schedules add --name digest --cron "0 9 * * 1-5" --tz Europe/Paris \\\n'
        '      --prompt "Summarise the news of {{ date }}" --email me@example.com',
    ),
    "schedules edit": (
        "Change some of a schedule's fields; the others stay. It fails if the schedule "
        "changed since it was read (--version).",
        'promptsched schedules edit digest --cron "30 8 * * 1-5" --email ops@example.com',
    ),
    "schedules list": (
        "List schedules with their next fire time and state.",
        "promptsched schedules list --name digest",
    ),
    "schedules show": (
        "Show one schedule: its fields, its expression in words, its next fire times and its "
        "latest runs.",
        "promptsched schedules show digest",
    ),
    "schedules trigger": (
        "Run a schedule now, outside its cadence; a replica running the worker role runs it.",
        "promptsched schedules trigger digest && promptsched runs list --schedule digest",
    ),
    "schedules pause": (
        "Pause a schedule: no new runs until it is resumed (or until --until).",
        "promptsched schedules pause digest --until 2026-12-01T09:00:00+01:00",
    ),
    "schedules resume": ("Resume a paused schedule.", "promptsched schedules resume digest"),
    "preview": (
        "The next fire times of an expression, with the expression in words; nothing is stored.",
        'promptsched preview "*/25 * * * *" --tz Europe/Paris --count 5',
    ),
    "runs list": (
        "List runs, newest first, with their status, slot and what ended them.",
        "promptsched runs list --schedule digest --status dead",
    ),
    "runs show": (
        "One run with its attempts, output, usage and notifications.",
        "promptsched runs show 42",
    ),
    "runs watch": (
        "Follow a run's live progress until it ends; exit 0 when it succeeded. With no replica "
        "running the worker role it says so and stops, unless --wait.",
        "promptsched runs watch 42",
    ),
    "tokens create": (
        "Create an API token for an owner; it is printed once. A new embedded database is "
        "created if there is none.",
        "promptsched tokens create --owner me --admin",
    ),
    "status": (
        "The fleet at a glance: replicas, configuration drift, providers, queue and outbox.",
        "promptsched status",
    ),
    "doctor": (
        "Check the configuration against what it needs, with the fix of each failure; exit 1 "
        "when the service is broken.",
        "promptsched doctor",
    ),
}
# The words of flags many commands share, for those that do not say their own.
SHARED: dict[str, str] = {
    "--json": "print JSON instead of words",
    "--tz": "IANA time zone, e.g. Europe/Paris (default UTC)",
    "--count": "how many fire times (default 10)",
    "--dst-gap": "a local time the clocks skip: fire just after the gap (shift) or skip it",
    "--dst-fold": "a local time that happens twice: fire at its first pass or at both",
    "--status": "only runs in this status",
    "--limit": "at most this many (default 100)",
    "schedule": "the schedule's id or name",
    "id": "the run's id",
}


def variables() -> str:
    """The template variables a prompt may use, one a line."""
    width = max(len(name) for name in template.VARIABLES) + 6
    lines = [f"  {{{{ {name} }}}}".ljust(width + 4) + words for name, words in
             template.VARIABLES.items()]  # fmt: skip
    return "template variables of --prompt:\n" + "\n".join(lines)


def explain(parser: argparse.ArgumentParser, path: str) -> None:
    """Give the command at ``path`` ("schedules add") its description, its example, and words
    for the shared flags it leaves unexplained."""
    for action in parser._actions:
        if action.help is None:
            key = action.option_strings[0] if action.option_strings else action.dest
            action.help = SHARED.get(key)
    found = EVERYDAY.get(path)
    if found is None:
        return
    description, example = found
    parser.description = textwrap.fill(description, 79)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    epilog = f"example:\n  {example}"
    if path in ("schedules add", "schedules edit"):
        epilog = f"{variables()}\n\n{epilog}"
    parser.epilog = epilog
