"""Prompt templates: validation at save time, rendering at run time, and the run context."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from promptsched.errors import ValidationError
from promptsched.executors import template

CONTEXT = {
    "schedule_name": "digest",
    "slot": "2024-03-31T09:00:00+02:00",
    "date": "2024-03-31",
    "previous_output": "yesterday: {{ schedule_name }}",
}


@pytest.mark.parametrize(
    "text",
    [
        "no tags at all",
        "{{ schedule_name }} at {{slot}} on {{  date  }}",
        'Reply as JSON: {"summary": "...", "items": [{"n": 1}]}',
        "a lone } and { and }} are literal",
        "",
    ],
)
def test_valid_templates_pass(text: str) -> None:
    template.validate(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Hi {{ nme }}", "unknown variable {{ nme }}"),
        ("Hi {{ schedule_nam }}", "(did you mean {{ schedule_name }}?)"),
        ("Hi {{ schedule_name", "unclosed tag: '{{' at position 3 has no '}}'"),
        ("Hi {{ }}", "empty tag {{ }} at position 3"),
        ("{{ schedule.name }}", "invalid tag {{ schedule.name }}"),
        ("{{ __class__.__mro__ }}", "no attribute access"),
        ("{{ date | upper }}", "filters"),
        ("{{ slot }} then {{ bogus }}", "known variables: schedule_name,"),
    ],
)
def test_invalid_templates_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        template.validate(text, field="prompt")
    assert caught.value.field == "prompt"
    assert message in caught.value.message


def test_validate_uses_the_given_field() -> None:
    with pytest.raises(ValidationError) as caught:
        template.validate("{{ nope }}", field="params.system")
    assert caught.value.field == "params.system"


def test_render_substitutes_and_keeps_literal_braces() -> None:
    text = 'Run {{ schedule_name }} on {{date}}: {"slot": "{{ slot }}"}'
    assert template.render(text, CONTEXT) == (
        'Run digest on 2024-03-31: {"slot": "2024-03-31T09:00:00+02:00"}'
    )


def test_render_does_not_expand_tags_inside_values() -> None:
    assert template.render("Before: {{ previous_output }}", CONTEXT) == (
        "Before: yesterday: {{ schedule_name }}"
    )


def test_render_leaves_missing_values_empty() -> None:
    assert template.render("[{{ previous_run_at }}]", CONTEXT) == "[]"


def test_render_rejects_a_bad_template() -> None:
    with pytest.raises(ValidationError):
        template.render("{{ unknown }}", CONTEXT)


def test_variables_used() -> None:
    assert template.variables_used("{{ date }} {{date}} {{ slot_utc }}") == {"date", "slot_utc"}


@given(st.text().filter(lambda text: "{{" not in text))
def test_text_without_tags_renders_unchanged(text: str) -> None:
    assert template.render(text, CONTEXT) == text


def test_build_context_gives_local_and_utc_times() -> None:
    context = template.build_context(
        run_id=5,
        schedule_id=2,
        schedule_name="digest",
        slot=datetime(2024, 3, 30, 23, 30, tzinfo=UTC),  # already the 31st in Paris
        timezone="Europe/Paris",
        previous_run_at=datetime(2024, 3, 29, 23, 30, tzinfo=UTC),
        previous_output="old",
        previous_slot=datetime(2024, 3, 29, 23, 0, tzinfo=UTC),
    )
    assert context == {
        "schedule_name": "digest",
        "schedule_id": "2",
        "run_id": "5",
        "slot": "2024-03-31T00:30:00+01:00",
        "slot_utc": "2024-03-30T23:30:00+00:00",
        "timezone": "Europe/Paris",
        "date": "2024-03-31",
        "previous_run_at": "2024-03-30T00:30:00+01:00",
        "previous_slot": "2024-03-30T00:00:00+01:00",
        "previous_output": "old",
    }
    assert set(context) == set(template.VARIABLES)


def test_build_context_of_the_names_a_prompt_uses() -> None:
    """Asked for names that need no date, it builds only those; any time-bound name gets the
    whole context, the same values as without ``names``."""
    fields: dict[str, Any] = {
        "run_id": 5, "schedule_id": 2, "schedule_name": "digest",
        "slot": datetime(2024, 3, 30, 23, 30, tzinfo=UTC), "timezone": "Europe/Paris",
    }  # fmt: skip
    assert template.build_context(**fields, names={"run_id", "schedule_name"}) == {
        "run_id": "5",
        "schedule_name": "digest",
    }
    whole = template.build_context(**fields)
    assert template.build_context(**fields, names={"run_id", "date"}) == whole


def test_build_context_without_a_previous_run() -> None:
    context = template.build_context(
        run_id=1,
        schedule_id=1,
        schedule_name="n",
        slot=datetime(2024, 1, 1, tzinfo=UTC),
        timezone="UTC",
    )
    assert context["previous_run_at"] == "" and context["previous_output"] == ""
    assert context["previous_slot"] == ""
    with pytest.raises(ValueError):
        template.build_context(
            run_id=1,
            schedule_id=1,
            schedule_name="n",
            slot=datetime(2024, 1, 1),
            timezone="UTC",
        )


def test_a_long_previous_output_given_whole_is_cut_with_a_marker() -> None:
    limit = template.PREVIOUS_OUTPUT_CHARS
    context = template.build_context(
        run_id=1, schedule_id=1, schedule_name="n", slot=datetime(2024, 1, 1, tzinfo=UTC),
        timezone="UTC", previous_output="a" * limit + "b" * 1234,
    )  # fmt: skip
    assert context["previous_output"] == "a" * limit + "\n[... 1,234 more characters cut]"
    exact = template.build_context(
        run_id=1, schedule_id=1, schedule_name="n", slot=datetime(2024, 1, 1, tzinfo=UTC),
        timezone="UTC", previous_output="a" * limit,
    )  # fmt: skip
    assert exact["previous_output"] == "a" * limit
