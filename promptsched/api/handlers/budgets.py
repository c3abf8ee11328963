"""An owner's budget: its limits over all its schedules, and its spend against them."""

from __future__ import annotations

from aiohttp import web

from promptsched.api.http import ApiError, Call, Operation, Param, Reply, json_reply
from promptsched.ops import budgets as budget_ops
from promptsched.ops import fleet

OWNER = Param(
    "owner", "query", {"type": "string", "minLength": 1, "maxLength": 100},
    description="an admin token may name any owner; any other token only its own (the default)",
)  # fmt: skip


def _owner(call: Call) -> str:
    named: str | None = call.params["owner"]
    if named is None or named == call.who.owner:
        return call.who.owner
    if call.scope is not None:
        raise ApiError(403, "forbidden", "a token may read and set only its own owner's budget")
    return named


async def get(call: Call) -> web.StreamResponse:
    return json_reply(await budget_ops.owner_budget(call.deps.pool, _owner(call), call.deps.clock))


async def put(call: Call) -> web.StreamResponse:
    owner, deps = _owner(call), call.deps
    data = await budget_ops.set_owner_budget(deps.pool, owner, call.body, deps.clock)
    found = await fleet.current(deps.pool, deps.clock, deps.published)
    warning = fleet.cost_warning(found, data["budget"], None, "budget")
    return json_reply({**data, "warnings": [warning]} if warning else data)


OPERATIONS = (
    Operation(
        "GET", "/v1/budget", get, "getBudget", "An owner's budget and spend", "budgets",
        {"200": Reply("the budget (null: none) and this UTC day's and month's spend over all "
                      "the owner's schedules, each limit against it", "OwnerBudget"),
         "403": Reply("another owner's, with a token that is not an admin's", "Error")},
        params=(OWNER,),
    ),
    Operation(
        "PUT", "/v1/budget", put, "setBudget", "Set an owner's budget", "budgets",
        {"200": Reply("the budget now in force, with the spend against it", "OwnerBudget"),
         "403": Reply("another owner's, with a token that is not an admin's", "Error")},
        params=(OWNER,), body="Budget",
        description="The limits replace the stored ones; {} removes the budget. A run that "
        "would start while the owner's spend in the UTC day or month has reached a limit is "
        "skipped with reason budget, and the owner hears once per period.",
    ),
)  # fmt: skip
