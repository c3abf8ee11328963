"""Budgets: limits on what a schedule, or all of an owner's schedules, may spend in a UTC day
and a UTC month, in tokens and/or in cost (docs/providers.md).

A budget is an object of up to four limits, each optional::

    {"tokens_per_day": 200000, "cost_per_day": 2.5, "tokens_per_month": 4000000,
     "cost_per_month": 40}

The claim checks it (``budget_verdict`` in 0011_budgets.sql): a run that would start while a
limit is reached is skipped with reason ``budget``. This module checks user input and says
budgets, verdicts and spend in words; it does no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from promptsched.errors import ValidationError

LIMITS = ("tokens_per_day", "cost_per_day", "tokens_per_month", "cost_per_month")
MAX_TOKENS = 10**15
MAX_COST = 1e12
Budget = dict[str, int | float]
# As the CLI and the console write a limit: "tokens/day=200000", "cost/month=40".
SHORT = {key: key.replace("_per_", "/") for key in LIMITS}


def validate(raw: Any, *, field: str = "budget") -> Budget | None:
    """A checked budget, or None for "no budget" (null, or an object with no limits).

    Tokens are whole numbers of at least 1; costs positive numbers (in the unit of the price
    table). Any other key, or a value of the wrong type, names its field.
    """
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ValidationError(field, f"must be an object of limits ({', '.join(LIMITS)})")
    budget: Budget = {}
    for key, value in raw.items():
        where = f"{field}.{key}"
        if key not in LIMITS:
            raise ValidationError(where, f"is not a budget limit; use {', '.join(LIMITS)}")
        if value is None:
            continue
        if key.startswith("tokens"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValidationError(where, f"must be a whole number of tokens, got {value!r}")
            if not 1 <= value <= MAX_TOKENS:
                raise ValidationError(where, f"must be between 1 and {MAX_TOKENS}, got {value}")
        else:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValidationError(where, f"must be a number (a cost), got {value!r}")
            if not 0 < value <= MAX_COST:  # also NaN and infinity
                raise ValidationError(where, f"must be above 0 and at most {MAX_COST:g}")
        budget[key] = value
    return budget or None


def parse_flags(items: list[str], *, field: str = "budget") -> Budget | None:
    """``["tokens/day=200000", "cost/month=40"]`` (the CLI's --budget) as a budget."""
    texts: dict[str, str] = {}
    for item in items:
        name, sep, text = item.partition("=")
        key = name.strip().replace("/", "_per_")
        if not sep or key not in LIMITS:
            raise ValidationError(
                field, f"{item!r} is not LIMIT=VALUE with LIMIT one of {', '.join(SHORT.values())}"
            )
        texts[key] = text
    return parse_texts(texts, field=field)


def parse_texts(texts: Mapping[str, str], *, field: str = "budget") -> Budget | None:
    """Limits typed as text (a form's fields, the CLI's values) as a budget; empty: unset."""
    raw: dict[str, Any] = {}
    for key, text in texts.items():
        text = text.strip().replace(",", "").replace("_", "")
        if not text:
            continue
        try:
            raw[key] = int(text) if key.startswith("tokens") else float(text)
        except ValueError:
            kind = "a whole number of tokens" if key.startswith("tokens") else "a number"
            raise ValidationError(f"{field}.{key}", f"{text!r} is not {kind}") from None
    return validate(raw, field=field)


def amount(unit: str, value: float) -> str:
    """A spend or a limit in words: "12,000 tokens", "0.50" (a cost, in the price unit)."""
    if unit == "tokens":
        return f"{int(value):,} tokens"
    return f"{value:,.2f}" if value >= 0.01 or value == 0 else f"{value:.4g}"


def describe(budget: Mapping[str, Any] | None) -> str:
    """``{"tokens_per_day": 1000, "cost_per_month": 5}`` -> "1,000 tokens a day, 5.00 a month"."""
    if not budget:
        return "no budget"
    parts = []
    for key in LIMITS:
        if budget.get(key) is not None:
            unit, period = key.split("_per_")
            parts.append(f"{amount(unit, budget[key])} a {period}")
    return ", ".join(parts)


def reached(verdict: Mapping[str, Any]) -> str:
    """What a verdict says, as the run's error and the notice put it: "the schedule's daily
    budget of 1,000 tokens is reached (1,012 tokens spent since 2026-11-24 00:00 UTC)"."""
    scope = "the schedule's" if verdict.get("scope") == "schedule" else "the owner's"
    period = "daily" if verdict.get("period") == "day" else "monthly"
    unit = str(verdict.get("unit"))
    since = str(verdict.get("period_start", ""))[:16].replace("T", " ")
    return (
        f"{scope} {period} budget of {amount(unit, float(verdict.get('limit', 0)))} is reached "
        f"({amount(unit, float(verdict.get('spent', 0)))} spent since {since} UTC)"
    )


def standing(
    budget: Mapping[str, Any] | None, spend: Mapping[str, Mapping[str, float]]
) -> list[dict[str, Any]]:
    """Each limit of ``budget`` against ``spend`` ({day: {tokens, cost}, month: {...}}):
    ``[{"limit": "tokens_per_day", "allowed": 1000, "spent": 12, "reached": False}, ...]``."""
    rows = []
    for key in LIMITS:
        if budget and budget.get(key) is not None:
            unit, period = key.split("_per_")
            spent = float(spend.get(period, {}).get(unit, 0))
            allowed = budget[key]
            rows.append(
                {"limit": key, "allowed": allowed, "spent": spent, "reached": spent >= allowed}
            )
    return rows


def standing_words(row: Mapping[str, Any]) -> str:
    """One ``standing`` entry in words: "22 tokens of 30 tokens a day (73%)", "... reached"."""
    unit, period = str(row["limit"]).split("_per_")
    spent, allowed = float(row["spent"]), float(row["allowed"])
    share = f"{spent / allowed:.0%}" if allowed else "-"
    state = "reached: runs are skipped" if row.get("reached") else share
    return f"{amount(unit, spent)} of {amount(unit, allowed)} a {period} ({state})"
