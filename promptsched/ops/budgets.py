"""Spend against budget, for the API, the CLI and the console alike: a schedule's (its own
budget) and an owner's (the budget over all its schedules), and setting an owner's budget."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from promptsched import budgets
from promptsched.clock import Clock
from promptsched.domain import Schedule
from promptsched.errors import ValidationError
from promptsched.store import queries


def spend_json(budget: Mapping[str, Any] | None, spend: Mapping[str, Any]) -> dict[str, Any]:
    """``{day: {tokens, cost}, month: {...}, budget: [{limit, allowed, spent, reached}]}``."""
    return {**spend, "budget": budgets.standing(budget, spend)}


async def schedule_spend(db: queries.DB, row: Schedule, clock: Clock) -> dict[str, Any]:
    spend = await queries.schedule_spend(db, row.id, clock.sql_now())
    return spend_json(row.budget, spend)


async def owner_budget(db: queries.DB, owner: str, clock: Clock) -> dict[str, Any]:
    """The owner's budget (None: none) and its spend against it this UTC day and month."""
    budget = await queries.owner_budget_get(db, owner)
    spend = await queries.owner_spend(db, owner, clock.sql_now())
    return {"owner": owner, "budget": budget, "spend": spend_json(budget, spend)}


async def set_owner_budget(db: queries.DB, owner: str, raw: Any, clock: Clock) -> dict[str, Any]:
    """Sets the owner's budget from user input (null or {} removes it); raises naming the
    field before anything is stored."""
    if not owner or len(owner) > 100:
        raise ValidationError("owner", "must be a name of 1 to 100 characters")
    await queries.owner_budget_set(db, owner, budgets.validate(raw))
    return await owner_budget(db, owner, clock)
