"""An attempt's prompt and params: the schedule's templates filled in from the run's context
(its slot, its schedule, the previous success when the prompt asks for it, a follow-up's vars)."""

from __future__ import annotations

import json
from typing import Any

from promptsched.domain import ClaimedRun
from promptsched.executors import template
from promptsched.store import queries


def _var_text(value: Any) -> str:
    """A follow-up's var as the prompt shows it (JSON's true/false, not Python's)."""
    return json.dumps(value) if isinstance(value, bool) else str(value)


async def prompt_of(db: queries.DB, row: ClaimedRun) -> tuple[str, dict[str, Any]]:
    """The prompt and params of this attempt, templates filled in from the run context."""
    params = dict(row.params or {})
    system = params.get("system")
    given = frozenset(row.vars or {})  # a follow-up's vars
    used = template.variables_used(row.prompt, extra=given) | (
        template.variables_used(system, field="params.system", extra=given)
        if isinstance(system, str)
        else frozenset()
    )
    if not used:  # a prompt without tags is its own rendering
        return row.prompt, params
    previous = None
    if any(v.startswith("previous_") for v in used):
        previous = await queries.run_previous_success(
            db, row.schedule_id, row.slot, template.PREVIOUS_OUTPUT_CHARS
        )
    context = template.build_context(
        run_id=row.id,
        schedule_id=row.schedule_id,
        schedule_name=row.name,
        slot=row.slot,
        timezone=row.timezone,
        previous_run_at=previous["finished_at"] if previous else None,
        previous_output=previous["output"] if previous else None,
        previous_slot=previous["slot"] if previous else None,
        previous_output_chars=previous["output_chars"] if previous else None,
        names=used - given,
    )
    context.update({name: _var_text(value) for name, value in (row.vars or {}).items()})
    prompt = template.render(row.prompt, context, extra=given)
    if isinstance(system, str):  # a system prompt is a template too
        params["system"] = template.render(system, context, field="params.system", extra=given)
    return prompt, params
