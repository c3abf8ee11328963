"""Which event loop ``promptsched run`` runs on (PROMPTSCHED_EVENT_LOOP, promptsched/eventloop.py):
uvloop where it is installed, asyncio's own bounded loop when asked, and a clear error for
anything else."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from promptsched import config, eventloop
from promptsched.errors import ConfigError
from tests.helpers import Service


async def _ready_loop(dsn: str, log: Path, env: dict[str, str]) -> str:
    service = Service(dsn, log, env=env)
    try:
        ready = await service.ready()
    finally:
        code = service.stop()
    assert code == 0, f"exited {code}: see {log}"
    return str(ready["event_loop"])


@pytest.mark.skipif(not eventloop.uvloop_installed(), reason="uvloop is not installed")
async def test_the_service_runs_on_uvloop_unless_asked_for_asyncio(
    dsn: str, tmp_path: Path
) -> None:
    assert await _ready_loop(dsn, tmp_path / "default.log", {}) == "uvloop"
    assert (
        await _ready_loop(dsn, tmp_path / "asyncio.log", {"PROMPTSCHED_EVENT_LOOP": "asyncio"})
        == "asyncio"
    )
    assert (
        await _ready_loop(dsn, tmp_path / "uvloop.log", {"PROMPTSCHED_EVENT_LOOP": "UVLOOP"})
        == "uvloop"
    )


def test_the_factories_build_the_loops_they_name() -> None:
    for kind, expected in (("asyncio", "asyncio"), ("auto", eventloop.resolved("auto"))):
        loop = eventloop.factory(kind)()
        try:
            assert loop.run_until_complete(_running()) == expected
        finally:
            loop.close()


async def _running() -> str:
    await asyncio.sleep(0)
    return eventloop.running()


def test_an_unknown_event_loop_is_refused_naming_the_variable() -> None:
    with pytest.raises(ConfigError) as caught:
        config.load(env={"PROMPTSCHED_EVENT_LOOP": "trio"})
    assert caught.value.field == "PROMPTSCHED_EVENT_LOOP"
    assert "auto, uvloop, asyncio" in str(caught.value)
