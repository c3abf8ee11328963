"""Every alert of deploy/alerts.yml has promtool unit tests in tests/alerts/: a case that fires
it, silence on a healthy busy fleet (tests/alerts/healthy.yml), and, for an alert that must
catch a first event, a case where a new process's first scrape already holds the event.
``promtool test rules`` runs them all (Debian's ``prometheus`` package, which ``make test``
installs); ``promtool check metrics`` accepts what ``/metrics`` serves."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from promptsched.metrics import Metrics

ROOT = Path(__file__).resolve().parent.parent
ALERTS = ROOT / "deploy" / "alerts.yml"
CASES = ROOT / "tests" / "alerts"
HEALTHY = "healthy busy fleet"
FIRST_EVENT = "first event"


def promtool() -> str:
    path = os.environ.get("PROMPTSCHED_PROMTOOL", "/usr/bin/promtool")
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"no promtool at {path}: `make test` installs Debian's prometheus package "
            "(or set PROMPTSCHED_PROMTOOL)"
        )
    return path


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def cases() -> list[tuple[str, str, str, list[Any]]]:
    """``(file, test group, alert, expected alerts)`` of every alert_rule_test."""
    found = []
    for path in sorted(CASES.glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["tests"]:
            for case in group.get("alert_rule_test", []):
                found.append((path.name, group["name"], case["alertname"], case["exp_alerts"]))
    return found


def test_every_alert_fires_in_a_case_and_stays_silent_on_a_healthy_fleet() -> None:
    alerts = {rule["alert"] for rule in alert_rules()}
    fired = {alert for _, _, alert, expected in cases() if expected}
    silent = {alert for _, group, alert, expected in cases() if group == HEALTHY and not expected}
    first = {
        alert for _, group, alert, expected in cases() if group.startswith(FIRST_EVENT) and expected
    }
    # An alert that counts events reads process_start_time_seconds (the first-event rule).
    counting = {rule["alert"] for rule in alert_rules() if "process_start_time" in rule["expr"]}
    assert alerts - fired == set(), "add a case to tests/alerts/ that fires each of these"
    assert alerts - silent == set(), f"evaluate each of these in the {HEALTHY!r} group"
    assert counting - first == set(), f"add a {FIRST_EVENT!r} case for each of these"
    assert {alert for _, _, alert, _ in cases()} <= alerts, "a case names no alert"
    assert len(counting) >= 6, counting


def _rules_without_annotations(target: Path) -> None:
    """The rules as promtool tests them: annotations (prose, and templates that promtool
    check rules validates) are left out, so a case states only the alert's labels."""
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    target.write_text(yaml.safe_dump(rules))


def test_promtool_passes_every_case(tmp_path: Path) -> None:
    tool = promtool()
    checked = subprocess.run(
        [tool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    files = sorted(CASES.glob("*.yml"))
    for path in files:
        shutil.copy(path, tmp_path / path.name)
    _rules_without_annotations(tmp_path / "alerts.yml")
    result = subprocess.run(
        [tool, "test", "rules", *(path.name for path in files)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(files), result.stdout


def test_promtool_accepts_the_exposition() -> None:
    metrics = Metrics()
    metrics.know({"echo": ("default",), "openai": ("gpt-4o",)})
    result = subprocess.run(
        [promtool(), "check", "metrics"],
        input=generate_latest(metrics.registry),
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
