"""The owner's budget page: its limits over all its schedules (set here), and its spend this
UTC day and month against them. A schedule's own budget is on its edit form."""

from __future__ import annotations

from aiohttp import web

from promptsched import budgets
from promptsched.console import form_page, layout, schedule_parts
from promptsched.console.context import Ctx, redirect
from promptsched.console.html import Template
from promptsched.errors import ValidationError
from promptsched.ops import budgets as budget_ops
from promptsched.ops import fleet

_PAGE = Template("""$warning<section class="card">
<p class="lead">Limits on what all of <strong>$owner</strong>'s schedules may spend together.
A run that would start once a limit is reached is not sent: it is skipped (reason budget)
until the UTC day or month ends, and you hear once per period through each schedule's failure
targets.</p>
<dl class="settings"><dt>Budget</dt><dd id="owner-budget">$budget</dd>
<dt>Spend</dt><dd id="owner-spend">$spend</dd></dl>
</section>
$error<form method="post" action="/budget" class="schedule-form">
<input type="hidden" name="csrf" value="$csrf">
<div class="fields">$fields</div>
<div class="actions"><button type="submit" class="button primary">Save budget</button>
<a href="/">Cancel</a></div>
</form>""")
_WARNING = Template('<p class="flash warn" role="status">$text</p>\n')
_ERROR = Template('<p class="flash error" role="alert">Not saved: $field — $message</p>\n')


async def _render(
    ctx: Ctx, values: dict[str, str] | None, error: ValidationError | None, status: int = 200
) -> web.Response:
    data = await budget_ops.owner_budget(ctx.deps.pool, ctx.who.owner, ctx.deps.clock)
    shown = values if values is not None else form_page.budget_values(data["budget"])
    seen = await fleet.current(ctx.deps.pool, ctx.deps.clock, ctx.deps.published)
    warning = fleet.cost_warning(seen, data["budget"], None, "budget")
    body = _PAGE(
        warning=_WARNING(text=warning) if warning else "",
        owner=ctx.who.owner,
        budget=budgets.describe(data["budget"]),
        spend=schedule_parts.spend_words(data["spend"]),
        error=_ERROR(field=error.field, message=error.message) if error else "",
        csrf=ctx.csrf,
        fields=form_page.budget_fields(shown, error),
    )
    return layout.page(ctx, "Budget", body, status=status)


async def show(ctx: Ctx) -> web.StreamResponse:
    return await _render(ctx, None, None)


async def save(ctx: Ctx) -> web.StreamResponse:
    values = {name: ctx.field(name) for name in form_page.BUDGET_FIELDS}
    try:
        budget = budgets.parse_texts(
            {key: values[f"budget_{key}"] for key in budgets.LIMITS}, field="budget"
        )
        await budget_ops.set_owner_budget(
            ctx.deps.pool, ctx.who.owner, budget or {}, ctx.deps.clock
        )
    except ValidationError as exc:
        return await _render(ctx, values, exc, status=422)
    return redirect("/budget?done=budget_saved")
