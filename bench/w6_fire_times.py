"""Benchmark W6: next_after calls per second for representative specs (pure CPU, no cache)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from promptsched.schedule import fire_times, spec

SPECS = {
    "cron5_utc": spec.parse("cron", "*/5 9-17 * * 1-5"),
    "cron5_new_york": spec.parse("cron", "30 2 * * *", "America/New_York"),
    "cron5_hour_star_london": spec.parse("cron", "*/15 * * * *", "Europe/London"),
    "cron6_seconds_first": spec.parse("cron", "*/10 * * * * *", "Europe/Paris"),
    "rrule_monthly_last_day": spec.parse(
        "rrule", "DTSTART:20260101T090000\nRRULE:FREQ=MONTHLY;BYMONTHDAY=-1", "Australia/Sydney"
    ),
    "rrule_minutely": spec.parse("rrule", "RRULE:FREQ=MINUTELY;INTERVAL=15", "America/New_York"),
    "every_15m": spec.parse("every", "15m", "America/New_York"),
}


def measure(seconds: float = 2.0) -> dict[str, float]:
    """next_after calls per second for each spec, walking forward from a fixed instant."""
    budget = seconds / len(SPECS)
    rates: dict[str, float] = {}
    for name, s in SPECS.items():
        after = datetime(2026, 1, 1, tzinfo=UTC)
        calls = 0
        start = time.perf_counter()
        deadline = start + budget
        while time.perf_counter() < deadline:
            for _ in range(200):
                found = fire_times.next_after(s, after)
                # step past the fire; jump back to the start if the schedule ended
                after = found if found is not None else after - timedelta(days=1)
            calls += 200
        rates[name] = calls / (time.perf_counter() - start)
    return rates


if __name__ == "__main__":
    for name, rate in measure().items():
        print(f"{name:28s} {rate:12,.0f} next_after/s  ({1e6 / rate:6.1f} us/call)")
