"""An output_schema's regular expressions never hold the event loop (monitor/patterns.py): a
pattern that backtracks for minutes on an answer is stopped in the checking process after the
deadline with an error naming it, the loop keeps its rhythm meanwhile, a child that does not
answer is killed and replaced, and a schema without patterns never starts a child."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

from promptsched.monitor import patterns
from promptsched.store import queries
from tests import factories
from tests.helpers import Service, wait_until

# Each two more "a" quadruple the work of ``re`` on ^(a+)+$: 24 take about half a second here,
# so 32 take some two minutes (at least 20 s on any machine this runs on).
SLOW = {
    "type": "object",
    "properties": {"code": {"type": "string", "pattern": "^(a+)+$"}},
}
HOSTILE = {"code": "a" * 32 + "!"}
BOUND = 2.0  # seconds: the deadline (0.5 s) and a child's start, with room for a busy machine
PLAIN = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    return state != "Z"  # a zombie has ended: it only waits to be reaped


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return found


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_text()


def _python(script: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)


async def _gone(pid: int) -> None:
    async def check() -> bool:
        return not _alive(pid)

    await wait_until(check, timeout=10, what=f"process {pid} gone")


async def test_a_catastrophic_pattern_is_stopped_at_the_deadline_naming_it() -> None:
    assert await patterns.problem(SLOW, {"code": "aaa"}) is None  # the child is up
    started = time.monotonic()
    with pytest.raises(patterns.TooSlow) as caught:
        await patterns.problem(SLOW, HOSTILE)
    assert time.monotonic() - started < BOUND
    assert str(caught.value).startswith(
        "the output_schema's patterns took longer than 0.5 s on this answer: simplify the "
        "pattern at /properties/code/pattern"
    )
    # The same child goes on checking: the timer stopped the match, nothing was killed.
    pid = patterns.child_pid()
    assert await patterns.problem(SLOW, {"code": "aa!"}) == (
        "at /code: 'aa!' does not match '^(a+)+$'"
    )
    assert patterns.child_pid() == pid


async def test_patterns_in_pattern_properties_and_additional_properties_are_bounded() -> None:
    keys = {"type": "object", "patternProperties": {"^(a+)+$": {"type": "integer"}}}
    closed = {**keys, "additionalProperties": False}
    with pytest.raises(patterns.TooSlow, match="the pattern at /patternProperties"):
        await patterns.problem(keys, {"a" * 32 + "!": 1})
    with pytest.raises(patterns.TooSlow, match="the pattern at /patternProperties"):
        await patterns.problem(closed, {"a" * 32 + "!": 1})
    assert await patterns.problem(closed, {"aaa": "x"}) == "at /aaa: 'x' is not of type 'integer'"


async def test_the_event_loop_keeps_ticking_while_a_pattern_runs() -> None:
    await patterns.problem(SLOW, {"code": "a"})  # the child's start is not what is measured
    gaps: list[float] = []
    ticking, done = anyio.Event(), anyio.Event()

    async def tick() -> None:
        last = time.monotonic()
        while not done.is_set():
            await anyio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now
            ticking.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(tick)
        await ticking.wait()
        with pytest.raises(patterns.TooSlow):
            await patterns.problem(SLOW, HOSTILE)
        done.set()
    # The check took the 0.5 s deadline: ticks all along it, none late by more than 200 ms.
    assert len(gaps) >= 10 and max(gaps) < 0.2, f"{len(gaps)} ticks, longest gap {max(gaps)}"


async def test_a_child_that_does_not_answer_is_killed_and_replaced() -> None:
    assert await patterns.problem(SLOW, {"code": "a"}) is None
    pid = patterns.child_pid()
    assert pid is not None
    before = patterns.started()
    os.kill(pid, signal.SIGSTOP)  # stuck: not even the timer can end its check
    started = time.monotonic()
    with pytest.raises(patterns.TooSlow, match="took longer than 2.5 s on this answer"):
        await patterns.problem(SLOW, {"code": "a"})
    assert time.monotonic() - started < patterns.DEADLINE + patterns.GRACE + 1.0
    assert not _alive(pid) and patterns.child_pid() is None
    assert await patterns.problem(SLOW, {"code": "b"}) == "at /code: 'b' does not match '^(a+)+$'"
    assert patterns.started() == before + 1 and patterns.child_pid() not in (None, pid)


async def test_close_ends_the_child_and_a_later_check_starts_another() -> None:
    assert await patterns.problem(SLOW, {"code": "a"}) is None
    pid = patterns.child_pid()
    assert pid is not None
    patterns.close()
    assert not _alive(pid) and patterns.child_pid() is None
    assert await patterns.problem(SLOW, {"code": "a"}) is None
    assert patterns.child_pid() not in (None, pid)


@pytest.mark.parametrize(
    "schema",
    [
        PLAIN,
        # "pattern" as a property's name, a string's format: no regular expression runs
        {"type": "object", "properties": {"pattern": {"type": "string", "format": "regex"}}},
    ],
)
async def test_a_schema_without_patterns_is_checked_here_without_a_child(schema: Any) -> None:
    patterns.close()
    before = patterns.started()
    assert await patterns.problem(schema, {"n": 1, "pattern": "x"}) is None
    assert await patterns.problem(PLAIN, {"n": "1"}) == "at /n: '1' is not of type 'integer'"
    assert patterns.started() == before and patterns.child_pid() is None


async def _finished(pool: asyncpg.Pool[Any], sid: int, answer: Any) -> asyncpg.Record:
    await pool.execute("UPDATE schedules SET prompt = $2 WHERE id = $1", sid, json.dumps(answer))
    rid = await factories.pending_run(pool, sid, await pool.fetchval("SELECT now()"), "manual")
    await queries.run_notify_ready(pool, "test")

    async def done() -> asyncpg.Record | None:
        row = await pool.fetchrow("SELECT status, error FROM runs WHERE id = $1", rid)
        return row if row is not None and row["status"] in ("succeeded", "dead") else None

    return await wait_until(done, timeout=30, what=f"run {rid} finished")


@pytest.mark.slow
async def test_a_service_ends_its_checker_when_it_stops_and_goes_on_meanwhile(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    # The echo provider answers the prompt itself: the prompt is the answer.
    sid = await factories.schedule(pool, output_schema=SLOW, max_attempts=3)
    service = Service(dsn, tmp_path / "service.log")
    try:
        await service.ready()
        dead = await _finished(pool, sid, HOSTILE)
        assert dead["status"] == "dead"
        assert "simplify the pattern at /properties/code/pattern" in dead["error"]
        assert (await _finished(pool, sid, {"code": "aaa"}))["status"] == "succeeded"
        [child] = [p for p in _children(service.pid) if _alive(p)]
        assert "promptsched.monitor.patterns" in _cmdline(child)
    finally:
        assert service.stop() == 0
    await _gone(child)


async def test_a_child_whose_parent_was_killed_ends_by_itself(tmp_path: Path) -> None:
    script = (
        "import anyio, sys, time\n"
        "from promptsched.monitor import patterns\n"
        "S = {'type': 'object', 'properties': {'a': {'pattern': 'x'}}}\n"
        "anyio.run(patterns.problem, S, {'a': 'x'})\n"
        "print(patterns.child_pid(), flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = _python(script)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.kill()  # SIGKILL: no atexit, no close()
        parent.wait()
        await _gone(child)
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
