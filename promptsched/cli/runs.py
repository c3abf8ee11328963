"""``promptsched runs ...``: list, show (with attempts), replay a dead run, cancel, and watch a
run's live progress."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import Any

from promptsched import config as configuration
from promptsched.cli import backend, common, lookup, render
from promptsched.cli.backend import Backend
from promptsched.cli.common import now_of, table
from promptsched.domain import RunStatus
from promptsched.errors import ValidationError
from promptsched.human import runs as human_runs
from promptsched.human import times
from promptsched.monitor import changes
from promptsched.ops import fleet, schemas
from promptsched.ops import followups as followup_ops

_COLUMNS = (
    ("ID", "id", 7),
    ("SCHEDULE", "schedule", 20),
    ("SLOT", "when", 44),
    ("ORIGIN", "origin", 8),
    ("STATUS", "status", 9),
    ("ATT", "attempts", 3),
    ("DETAIL", "detail", 0),
)
_ATTEMPT_COLUMNS = (
    ("#", "number", 3),
    ("STATUS", "status", 9),
    ("WORKER", "worker_id", 24),
    ("STARTED", "started", 44),
    ("ERROR", "error", 0),
)


def cmd_list(args: argparse.Namespace, config: configuration.Config) -> int:
    if not 1 <= args.limit <= 10_000:
        raise ValidationError("--limit", "must be between 1 and 10000")

    if args.owner is not None and args.followup is None:
        raise ValidationError("--owner", "give it with --followup (whose follow-up)")

    async def action(api: Backend) -> int:
        if args.followup is not None:
            key = followup_ops.check_key(args.followup, "--followup")
            data = await api.list_followup_runs(
                key, status=args.status, limit=args.limit, owner=args.owner
            )
        else:
            sid = None if args.schedule is None else await lookup.schedule_id(api, args.schedule)
            data = await api.list_runs(schedule_id=sid, status=args.status, limit=args.limit)
        if args.json:
            print(json.dumps(data))
            return 0
        table(await _rows(api, data, now_of(args)), _COLUMNS)
        return 0

    return backend.run(args, config, action)


def detail_words(run: dict[str, Any]) -> str:
    """Why a run is where it is, beside its status: the skip reason in words, or its error."""
    reason = run.get("skip_reason")
    if reason:
        return human_runs.skip_words(str(reason), run.get("missed_slots") or 0)
    return str(run.get("error") or render.notify_decision_words(run) or "")


async def _rows(api: Backend, data: list[dict[str, Any]], now: datetime) -> list[dict[str, Any]]:
    """Each run with its schedule's name beside the id and its slot in the schedule's zone."""
    named = await lookup.names(api, (run["schedule_id"] for run in data))
    seconds = times.any_seconds(run["slot"] for run in data)
    rows = []
    for run in data:
        schedule = named[run["schedule_id"]]
        slot = times.when(run["slot"], schedule.timezone, now, seconds=seconds)
        rows.append({**run, "schedule": schedule.words, "detail": detail_words(run),
                     "when": slot})  # fmt: skip
    return rows


async def _show(args: argparse.Namespace, api: Backend, data: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(data))
        return
    now = now_of(args)
    schedule = (await lookup.names(api, [data["schedule_id"]]))[data["schedule_id"]]
    zone = schedule.timezone
    print(render.run_details(data, zone, now, schedule.words))
    print("\nattempts:")
    attempts = [{**a, "started": times.when(a.get("started_at"), zone, now)}
                for a in data["attempt_history"]]  # fmt: skip
    table(attempts, _ATTEMPT_COLUMNS)
    if data["output"] is not None:
        print("\noutput:")
        print(data["output"])
    if data.get("output_json") is not None:
        print("\noutput (JSON):")
        print(json.dumps(data["output_json"], indent=2, ensure_ascii=False))


def cmd_show(args: argparse.Namespace, config: configuration.Config) -> int:
    async def action(api: Backend) -> int:
        await _show(args, api, await api.get_run(args.id))
        return 0

    return backend.run(args, config, action)


def diff_words(data: dict[str, Any]) -> list[str]:
    """``runs diff`` for people: the changed paths, or the diff, or that nothing changed."""
    if not data["changed"]:
        what = "structured output" if data["kind"] == "json" else "output"
        return [f"run {data['a']} and run {data['b']}: the same {what} (as `changed` compares)"]
    if data["kind"] == "json":
        head = [f"run {data['a']} -> run {data['b']}: {len(data['paths'])} path(s) changed"]
        return head + [f"  {changes.line_of(p)}" for p in data["paths"]]
    return list(data["diff"])


def cmd_diff(args: argparse.Namespace, config: configuration.Config) -> int:
    async def action(api: Backend) -> int:
        data = await api.diff_runs(args.a, args.b)
        print(json.dumps(data) if args.json else "\n".join(diff_words(data)))
        return 0

    return backend.run(args, config, action)


def cmd_replay(args: argparse.Namespace, config: configuration.Config) -> int:
    async def action(api: Backend) -> int:
        data = await api.replay_run(args.id)
        if args.json:
            print(json.dumps(data))
        else:
            print(f"replayed run {args.id} as run {data['id']} ({data['status']})")
        return 0

    return backend.run(args, config, action)


def cmd_cancel(args: argparse.Namespace, config: configuration.Config) -> int:
    async def action(api: Backend) -> int:
        data = await api.cancel_run(args.id)
        if args.json:
            print(json.dumps(data))
        elif data["status"] == RunStatus.RUNNING:
            print(f"asked run {args.id} to stop: its worker stops it at the next heartbeat")
        else:
            print(f"run {args.id} is {data['status']}")
        return 0

    return backend.run(args, config, action)


def _progress_line(event: dict[str, Any]) -> str:
    """One step in words; the text already says the step (``step 1/4: ...``)."""
    tokens = f" ({event['tokens']} tokens)" if event.get("kind") == "model" else ""
    return f"[attempt {event.get('attempt')}] {event.get('text', '')}{tokens}"


def cmd_watch(args: argparse.Namespace, config: configuration.Config) -> int:
    """Live progress: remote mode reads the API's event stream; direct mode listens on the
    database's progress channel itself. Exits 0 when the run succeeded, 1 otherwise."""

    async def action(api: Backend) -> int:
        status = "unknown"
        if not args.wait and await api.idle():
            run = await api.get_run(args.id)
            if run["status"] in (RunStatus.PENDING, RunStatus.RUNNING):
                print(f"promptsched: {fleet.idle_words(args.id)}; --wait watches it anyway",
                      file=sys.stderr)  # fmt: skip
                return 1
        async for kind, event in api.watch(args.id):
            if args.json:
                if kind != "subscribed":
                    print(json.dumps({"event": kind, **event}), flush=True)
            elif kind == "subscribed":
                run = await api.get_run(args.id)
                print(f"watching run {args.id} ({run['status']}); Ctrl-C stops watching",
                      flush=True)  # fmt: skip
            elif kind == "progress":
                print(_progress_line(event), flush=True)
            elif kind == "gap":
                print("(some progress events may have been missed)", flush=True)
            if kind == "done":
                status = str(event.get("status"))
        if not args.json:
            run = await api.get_run(args.id)
            detail = run.get("error") or run.get("skip_reason") or ""
            print(f"run {args.id} {status}" + (f": {detail}" if detail else ""), flush=True)
        return 0 if status == RunStatus.SUCCEEDED else 1

    return backend.run(args, config, action)


def register(sub: Any) -> None:
    runs = sub.add_parser("runs", help="inspect runs")
    runs_sub = runs.add_subparsers(dest="runs_command", required=True)
    runs_list = runs_sub.add_parser("list", help="list runs, newest first")
    whose = runs_list.add_mutually_exclusive_group()
    whose.add_argument("--schedule", metavar="SCHEDULE", help="its id or name")
    whose.add_argument("--followup", metavar="KEY", help="a follow-up's runs (its checks)")
    runs_list.add_argument("--owner", help="whose --followup (direct mode only; default `default`)")
    runs_list.add_argument("--status", choices=schemas.RUN_STATUSES)
    runs_list.add_argument("--limit", type=common.whole, default=100)
    runs_list.add_argument("--json", action="store_true")
    runs_list.set_defaults(func=cmd_list)
    for name, func, help_text in (
        ("show", cmd_show, "one run with its attempts and output"),
        ("replay", cmd_replay, "run a dead run's slot again (a new run, origin replay)"),
        ("cancel", cmd_cancel, "cancel a pending run, or ask a running one to stop"),
        ("watch", cmd_watch, "follow a run's live progress until it ends"),
    ):
        cmd = runs_sub.add_parser(name, help=help_text)
        cmd.add_argument("id", type=common.number("run id"))
        cmd.add_argument("--json", action="store_true")
        cmd.set_defaults(func=func)
        if name == "watch":
            cmd.add_argument(
                "--wait", action="store_true",
                help="watch even when no replica runs the worker role (it may start later)",
            )  # fmt: skip
    diff = runs_sub.add_parser(
        "diff", help="what changed between two runs of a schedule (JSON paths or a text diff)"
    )
    diff.add_argument("a", type=common.number("run id"), help="the earlier run")
    diff.add_argument("b", type=common.number("run id"), help="the later run")
    diff.add_argument("--json", action="store_true")
    diff.set_defaults(func=cmd_diff)
