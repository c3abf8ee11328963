"""The HTML of the create/edit form and of its preview panel (whose element ids the script
fills in as you type)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cache
from zoneinfo import ZoneInfo, available_timezones

from promptsched import budgets
from promptsched.console import layout, timefmt
from promptsched.console.context import Ctx
from promptsched.console.html import Markup, Template, attrs, join
from promptsched.errors import ValidationError

LABELS = {
    "name": "Name", "kind": "Kind", "expression": "Schedule", "timezone": "Time zone",
    "prompt": "Prompt", "provider": "Provider", "model": "Model (optional)",
    "params": "Params (JSON object, optional)", "misfire": "Misfire policy",
    "overlap": "Overlap policy", "max_attempts": "Max attempts", "timeout": "Timeout",
    "misfire_grace": "Late by at most", "misfire_cap": "Most missed slots to run",
    "catchup_window": "Catch-up window (optional)", "jitter": "Jitter (optional)",
    "dst_gap": "Local time skipped by DST", "dst_fold": "Local time repeated by DST",
    "pause_after_failures": "Pause after dead runs in a row (optional)",
    "give_up_after": "Give up when throttled for",
    "fallback": "Fallback providers (optional)",
    "budget_tokens_per_day": "Budget: tokens a day (optional)",
    "budget_cost_per_day": "Budget: cost a day (optional)",
    "budget_tokens_per_month": "Budget: tokens a month (optional)",
    "budget_cost_per_month": "Budget: cost a month (optional)",
    "notify_when": "Notify when",
    "output_schema": "Output JSON Schema (optional)",
}  # fmt: skip
BUDGET_FIELDS = tuple(f"budget_{key}" for key in budgets.LIMITS)
# The options of a select, in words; the value sent is the stored word.
OPTION_WORDS = {
    "misfire": {"run_once": "run once for all missed slots", "skip": "skip missed slots",
                "run_all": "run every missed slot"},
    "overlap": {"skip": "skip the new run", "allow": "run alongside",
                "buffer_one": "queue one", "buffer_all": "queue all",
                "cancel_other": "cancel the running one"},
    "dst_gap": {"shift": "fire just after the gap", "skip": "skip that day's slot"},
    "dst_fold": {"first": "fire at the first occurrence", "both": "fire at both"},
    "kind": {"auto": "detect from the text"},
}  # fmt: skip
HINTS = {
    "expression": "cron (0 9 * * 1-5; 6 fields = seconds first), @daily, every 15m, "
    "at 2026-12-01T09:00, or an RRULE",
    "timezone": "IANA name; fire times are computed in it",
    "prompt": "{{ date }}, {{ slot }} and other tags are filled in at run time",
    "params": 'for echo: {"latency": "2s", "fail_attempts": 1}',
    "timeout": "per attempt: 30s, 5m, 1h",
    "misfire_grace": "a slot found later than this is a misfire (after downtime or a pause)",
    "misfire_cap": "with “run every missed slot”: at most this many",
    "catchup_window": "missed slots older than this are dropped, whatever the policy",
    "jitter": "each run starts up to this much after its slot, spread evenly",
    "pause_after_failures": "pause the schedule after this many dead runs in a row",
    "give_up_after": "a run the provider keeps throttling (429) waits as asked, then ends "
    "dead after this long from its first attempt",
    "fallback": "NAME or NAME:MODEL, comma-separated, in order: where an attempt goes after "
    "a retryable failure or throttling of the one before",
    "budget_tokens_per_day": "UTC day; once its runs have used this many, the rest of the "
    "day's runs are skipped (reason budget) and you hear once",
    "budget_cost_per_day": "in the price table's unit (PROMPTSCHED_PRICES), per UTC day",
    "budget_tokens_per_month": "per UTC month",
    "budget_cost_per_month": "per UTC month, in the price table's unit",
    "notify_when": "always; changed (only when the answer changed); with a schema: changed "
    '/status, /degraded (when true), /status == "down"',
    "output_schema": 'a JSON Schema the answer must match, e.g. {"type": "object", '
    '"properties": {"degraded": {"type": "boolean"}}}; checked as you type',
}


def budget_values(budget: Mapping[str, object] | None) -> dict[str, str]:
    """A stored budget as the form's fields (an unset limit: empty)."""
    found = budget or {}
    return {
        f"budget_{key}": "" if found.get(key) is None else str(found[key]) for key in budgets.LIMITS
    }


# Which form field a validation error belongs to, when the error names another.
_ALIASES = {"schedule": "expression", "cron": "expression", "rrule": "expression",
            "at": "expression", "every": "expression"}  # fmt: skip

_FORM = Template("""<form method="post" action="$action" class="schedule-form" \
id="schedule-form">
<input type="hidden" name="csrf" value="$csrf">$version
$notice<div class="form-columns">
<div class="fields">
$fields
$notify
</div>
<aside class="preview card" id="preview" aria-live="polite">
$preview
</aside>
</div>
<div class="actions"><button type="submit" name="op" value="save" class="button primary">\
$submit</button>
<button type="submit" name="op" value="preview" class="button">Preview</button>
<a href="$cancel">Cancel</a></div>
</form>
$zones""")
_FIELD = Template("""<div class="field$invalid">
<label for="f-$name">$label</label>
$control$hint$message</div>""")
_INPUT = Template('<input id="f-$name" name="$name" type="text" value="$value"$attrs>')
_TEXTAREA = Template('<textarea id="f-$name" name="$name" rows="$rows"$attrs>$value</textarea>')
_SELECT = Template('<select id="f-$name" name="$name"$attrs>$options</select>')
_OPTION = Template('<option value="$value"$attrs>$label</option>')
_HINT = Template('<small class="hint">$text</small>')
# The output schema's live check (console.js fills it in as you type).
_SCHEMA_CHECK = Markup(
    '<small class="schema-check" id="schema-check" aria-live="polite" hidden></small>'
)
_MESSAGE = Template('<small class="message" id="m-$name" role="alert">$text</small>')
_PREVIEW = Template("""<h2>Next fire times</h2>
<p id="preview-words" class="describe">$words</p>
<p id="preview-error" class="flash error"$error_attrs>$error</p>
<ol id="preview-list" class="times">$items</ol>""")
_ITEM = Template("<li>$value</li>")
_ERROR = Template('<p class="flash error" role="alert">Not saved: $field — $message</p>\n')
_NOTICE = Template('<p class="flash error" role="alert">$text</p>\n')
_ZONES = Template('<datalist id="zones">$options</datalist>')
_ZONE = Template('<option value="$name">')


@cache
def _zones() -> Markup:
    return _ZONES(options=join(_ZONE(name=z) for z in sorted(available_timezones())))


def preview_list(times: Sequence[datetime], where: ZoneInfo, now: datetime, words: str) -> Markup:
    seconds = timefmt.any_seconds(times)
    items = join(_ITEM(value=timefmt.stamp(t, where, now, seconds=seconds)) for t in times)
    error = "" if times else "It never fires after now."
    return _PREVIEW(words=words, items=items, error=error, error_attrs=attrs(hidden=not error))


def preview_hint(text: str) -> Markup:
    return _PREVIEW(words=text, items="", error="", error_attrs=attrs(hidden=True))


def preview_error(field: str, message: str) -> Markup:
    return _PREVIEW(words="", items="", error=f"{field}: {message}", error_attrs=attrs())


def _control(name: str, value: str, choices: Sequence[str] | None, described: str | None) -> Markup:
    extra: dict[str, object] = {"aria_describedby": described}
    if choices is not None:
        words = OPTION_WORDS.get(name, {})
        options = join(
            _OPTION(value=c, label=words.get(c, c), attrs=attrs(selected=c == value))
            for c in choices
        )
        return _SELECT(name=name, options=options, attrs=attrs(**extra))
    if name in ("prompt", "params", "output_schema"):
        rows = {"prompt": 6, "params": 2, "output_schema": 6}[name]
        more: dict[str, object] = {
            "required": name == "prompt",
            "spellcheck": "false" if name != "prompt" else None,
        }
        area = _TEXTAREA(name=name, value=value, rows=rows, attrs=attrs(**extra, **more))
        return join([area, _SCHEMA_CHECK]) if name == "output_schema" else area
    more = {
        "required": name in ("name", "expression"),
        "maxlength": {"name": 200, "expression": 2000, "model": 200}.get(name, 100),
        "list": "zones" if name == "timezone" else None,
        "autocomplete": "off",
        "spellcheck": "false" if name != "name" else None,
    }
    return _INPUT(name=name, value=value, attrs=attrs(**extra, **more))


def _field(
    name: str, value: str, choices: Sequence[str] | None, error: ValidationError | None
) -> Markup:
    wrong = error is not None and _owner(error.field) == name
    message = _MESSAGE(name=name, text=error.message) if wrong and error else ""
    hint = _HINT(text=HINTS[name]) if name in HINTS else ""
    control = _control(name, value, choices, f"m-{name}" if wrong else None)
    return _FIELD(
        invalid=" invalid" if wrong else "", name=name, label=LABELS[name], control=control,
        hint=hint, message=message,
    )  # fmt: skip


def _owner(field: str) -> str:
    if field.startswith("budget.") and f"budget_{field[7:]}" in LABELS:
        return f"budget_{field[7:]}"
    top = field.split(".", 1)[0].split("[", 1)[0]
    return _ALIASES.get(top, top)


def form(
    ctx: Ctx,
    values: Mapping[str, str],
    choices: Mapping[str, Sequence[str]],
    providers: Sequence[str],
    *,
    preview: Markup,
    sid: int | None,
    version: int | None,
    error: ValidationError | None,
    notice: str | None,
    notify: Markup | str = "",
) -> Markup:
    options = {**choices, "provider": providers}
    fields = join(_field(name, values[name], options.get(name), error) for name in LABELS)
    top = _ERROR(field=error.field, message=error.message) if error is not None else ""
    if notice:
        top = _NOTICE(text=notice)
    return _FORM(
        action="/schedules/new" if sid is None else f"/schedules/{sid}/edit",
        csrf=ctx.csrf,
        version=layout.hidden("version", str(version)) if version is not None else "",
        notice=top,
        fields=fields,
        notify=notify,  # console/notify_form.py
        preview=preview,
        submit="Create schedule" if sid is None else "Save changes",
        cancel="/" if sid is None else f"/schedules/{sid}",
        zones=_zones(),
    )


def budget_fields(values: Mapping[str, str], error: ValidationError | None) -> Markup:
    """The four budget limits as form fields (the owner's budget page uses them too)."""
    return join(_field(name, values[name], None, error) for name in BUDGET_FIELDS)
