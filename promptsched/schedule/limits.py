"""The supported range of fire times and the work any one search for a fire time may take."""

from __future__ import annotations

from datetime import UTC, datetime

EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)  # exclusive: nothing at or after it is a fire time
LAST_YEAR = LATEST.year  # local calendars are searched through this year, then cut at LATEST
# Steps of RRULE expansion allowed between two occurrences (a period or a day the day filters
# skip weighs 8, a second or minute walked between periods 1): about 30 ms of one core, enough
# for FREQ=DAILY to skip 50 years of days.
SEARCH_BUDGET = 160_000
# Steps to find the last occurrence a COUNT allows, at compile time: about 70 ms.
COUNT_BUDGET = 2 * SEARCH_BUDGET
