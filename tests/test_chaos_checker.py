"""The chaos checker's rule for fenced attempts without a row: only an attempt whose claim a
database crash undid may have none (a claim does not wait for its WAL flush)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.chaos import checker

FENCED_AT = datetime(2026, 11, 27, 14, 49, 22, 514107, tzinfo=UTC)


def _evidence(tmp_path: Path, crashes: list[datetime]) -> checker.Evidence:
    log = tmp_path / "p0.log"
    log.write_text(
        json.dumps(
            {
                "run_id": 69,
                "attempt_id": "db61d84e-b058-4857-9e5b-7752abd55890",
                "reason": "lease_lost",
                "cause": "taken",
                "event": "attempt.fenced",
                "timestamp": FENCED_AT.isoformat().replace("+00:00", "Z"),
            }
        )  # fmt: skip
        + "\n"
    )
    return checker.Evidence(
        schedules=[], windows={}, runs=[], attempts=[], outbox=[], deliveries=[],
        logs=checker.Logs.scan([log]), crashes=[], exit_codes=[], settled_in=1.0,
        db_crashes=crashes,
    )  # fmt: skip


def test_a_fenced_attempt_without_a_row_is_a_violation_unless_a_crash_undid_its_claim(
    tmp_path: Path,
) -> None:
    for crashes in ([], [FENCED_AT + timedelta(seconds=1)], [FENCED_AT - timedelta(seconds=30)]):
        verdict = checker.fenced_writes_rejected(_evidence(tmp_path, crashes))
        assert not verdict.held, crashes
        assert "has no row" in verdict.detail
    verdict = checker.fenced_writes_rejected(
        _evidence(tmp_path, [FENCED_AT - timedelta(seconds=1.3)])
    )
    assert verdict.held
    assert "1 whose claim a database crash undid" in verdict.detail
