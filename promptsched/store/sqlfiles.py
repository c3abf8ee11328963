"""Loads the named SQL queries once from ``sql/queries/*.sql``."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_HEADER = re.compile(r"^-- name: ([a-z_]+)\s*$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    """Split a file into ``{name: sql}`` at ``-- name: x`` headers."""
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name} is defined twice")
        queries[name] = body.strip().rstrip(";").strip()
    return queries


@cache
def queries() -> dict[str, str]:
    merged: dict[str, str] = {}
    folder = resources.files("promptsched.store") / "sql" / "queries"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".sql"):
            for name, sql in parse(entry.read_text()).items():
                if name in merged:
                    raise ValueError(f"query {name} is defined twice")
                merged[name] = sql
    return merged


def migrations() -> list[tuple[int, str, str]]:
    """``(version, name, sql)`` for each migration file ``NNNN_name.sql``, in order."""
    folder = resources.files("promptsched.store") / "sql" / "migrations"
    found = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_([a-z0-9_]+)\.sql", entry.name)
        if match:
            found.append((int(match.group(1)), match.group(2), entry.read_text()))
    found.sort()
    versions = [version for version, _, _ in found]
    if versions != list(range(1, len(versions) + 1)):
        raise ValueError(f"migration versions must be 1..n without gaps, got {versions}")
    return found
