"""The typed schedule input against the two statements that write it: every column the
statements take in order is a field of ScheduleInput (or given by the caller), so a reordered
or renamed column fails here instead of writing a value into the wrong column."""

from __future__ import annotations

import dataclasses
import re

from promptsched.domain import ScheduleInput
from promptsched.store import queries
from promptsched.store.sqlfiles import queries as statements

FIELDS = {f.name for f in dataclasses.fields(ScheduleInput)}


def _insert_columns(sql: str) -> list[str]:
    match = re.search(r"INSERT INTO schedules \((.*?)\)\s*VALUES \((.*?)\)", sql, re.S)
    assert match is not None, sql
    columns = [c.strip() for c in match.group(1).split(",")]
    placeholders = [p.strip() for p in match.group(2).split(",")]
    assert placeholders == [f"${n}" for n in range(1, len(columns) + 1)]
    return columns


def _update_columns(sql: str) -> list[str]:
    pairs = re.findall(r"(\w+) = \$(\d+)", sql.split("WHERE")[0])
    by_number = {int(n): column for column, n in pairs}
    return [by_number[n] for n in sorted(by_number)]


def test_schedule_insert_takes_the_columns_in_the_wrapper_order() -> None:
    assert _insert_columns(statements()["schedule_insert"]) == list(queries.SCHEDULE_INSERT_COLUMNS)


def test_schedule_update_sets_the_columns_in_the_wrapper_order() -> None:
    sql = statements()["schedule_update"]
    assert "WHERE id = $1 AND version = $2" in sql
    assert _update_columns(sql) == list(queries.SCHEDULE_UPDATE_COLUMNS)


def test_every_column_comes_from_a_field_of_the_input_or_from_the_caller() -> None:
    given = {"owner", "next_fire_at"}  # the wrappers' keyword arguments
    for column in {*queries.SCHEDULE_INSERT_COLUMNS, *queries.SCHEDULE_UPDATE_COLUMNS} - given:
        assert queries.SCHEDULE_FIELD_OF.get(column, column) in FIELDS, column


def test_the_parameters_follow_the_columns_field_by_field() -> None:
    values = ScheduleInput(
        name="n", kind="cron", expression="* * * * *", prompt="p", misfire="skip",
        overlap="allow", params={"a": 1}, notify={"on_success": True},
    )  # fmt: skip
    params = queries._schedule_params(
        values, queries.SCHEDULE_UPDATE_COLUMNS, {"next_fire_at": None}
    )
    by_column = dict(zip(queries.SCHEDULE_UPDATE_COLUMNS, params, strict=True))
    assert by_column["misfire_policy"] == "skip"
    assert by_column["overlap_policy"] == "allow"
    assert by_column["params"] == {"a": 1} and type(by_column["params"]) is dict
    assert by_column["next_fire_at"] is None
    assert by_column["notify"] == {"on_success": True}
