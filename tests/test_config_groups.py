"""Config grouped per role: each role's frozen settings come from the same variables, TOML
keys and flags as before, and the defaults are the ones the roles had."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path

import pytest

from promptsched import config
from promptsched.config import (
    ApiSettings,
    DatabaseSettings,
    NotifierSettings,
    ReaperSettings,
    SchedulerSettings,
    WorkerSettings,
)

S = timedelta(seconds=1)


def test_defaults_group_into_the_roles_defaults(tmp_path: Path) -> None:
    loaded = config.load({"HOME": str(tmp_path)})
    assert loaded.scheduler == SchedulerSettings()
    assert loaded.reaper == ReaperSettings()
    assert loaded.notifier == NotifierSettings()
    assert loaded.worker == WorkerSettings()
    assert loaded.api == ApiSettings()
    assert loaded.database == DatabaseSettings(
        data_dir=tmp_path / ".local" / "share" / "promptsched"
    )


def test_each_variable_reaches_its_roles_group(tmp_path: Path) -> None:
    env = {
        "HOME": str(tmp_path),
        "PROMPTSCHED_DATABASE_URL": "postgresql://a/b",
        "PROMPTSCHED_DIRECT_DATABASE_URL": "postgresql://c/d",
        "PROMPTSCHED_STATEMENT_CACHE_SIZE": "0",
        "PROMPTSCHED_DATA_DIR": str(tmp_path / "data"),
        "PROMPTSCHED_HTTP_HOST": "0.0.0.0",
        "PROMPTSCHED_HTTP_PORT": "9999",
        "PROMPTSCHED_WORKERS": "7",
        "PROMPTSCHED_WORKER_ID": "w-1",
        "PROMPTSCHED_LEASE": "40s",
        "PROMPTSCHED_HEARTBEAT": "5s",
        "PROMPTSCHED_DRAIN_GRACE": "3s",
        "PROMPTSCHED_RETRY_BASE": "4s",
        "PROMPTSCHED_RETRY_MAX": "9m",
        "PROMPTSCHED_WORKER_MAX_SLEEP": "6s",
        "PROMPTSCHED_SCHEDULER_BATCH": "50",
        "PROMPTSCHED_SCHEDULER_RUSH_BATCH": "80",
        "PROMPTSCHED_SCHEDULER_MAX_SLEEP": "2s",
        "PROMPTSCHED_REAPER_MAX_SLEEP": "8s",
        "PROMPTSCHED_RETENTION": "0",
        "PROMPTSCHED_NOTIFIER_LEASE": "90s",
        "PROMPTSCHED_NOTIFIER_TIMEOUT": "20s",
        "PROMPTSCHED_NOTIFIER_MAX_ATTEMPTS": "3",
        "PROMPTSCHED_NOTIFIER_RETRY_BASE": "1s",
        "PROMPTSCHED_NOTIFIER_RETRY_MAX": "1m",
        "PROMPTSCHED_NOTIFIER_BATCH": "5",
        "PROMPTSCHED_NOTIFIER_MAX_SLEEP": "1s",
        "PROMPTSCHED_TEST_CRASH_AFTER_SEND": "1",
        "PROMPTSCHED_WEBHOOK_ALLOW": "10.0.0.0/8",
    }
    loaded = config.load(env)
    assert loaded.database == DatabaseSettings(
        url="postgresql://a/b",
        direct_url="postgresql://c/d",
        statement_cache_size=0,
        data_dir=tmp_path / "data",
    )
    assert loaded.scheduler == SchedulerSettings(batch=50, max_sleep=2 * S, rush_batch=80)
    assert loaded.worker == WorkerSettings(
        slots=7,
        worker_id="w-1",
        lease=40 * S,
        heartbeat=5 * S,
        drain_grace=3 * S,
        retry_base=4 * S,
        retry_max=timedelta(minutes=9),
        max_sleep=6 * S,
    )
    assert loaded.reaper == ReaperSettings(
        deadline_grace=40 * S, max_sleep=8 * S, retention=timedelta(0)
    )
    assert loaded.notifier == NotifierSettings(
        lease=90 * S,
        timeout=20 * S,
        max_attempts=3,
        retry_base=S,
        retry_max=timedelta(minutes=1),
        batch=5,
        max_sleep=S,
        crash_after_send=True,
    )
    assert loaded.api == ApiSettings(
        host="0.0.0.0", port=9999, webhook_allow=loaded.webhook_allow, retention=None
    )
    assert str(loaded.api.webhook_allow) == str(loaded.webhook_allow) != ""


@pytest.mark.parametrize(
    "group",
    [
        DatabaseSettings,
        SchedulerSettings,
        WorkerSettings,
        ReaperSettings,
        NotifierSettings,
        ApiSettings,
    ],
)
def test_groups_are_frozen(group: type) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(group(), dataclasses.fields(group)[0].name, None)
