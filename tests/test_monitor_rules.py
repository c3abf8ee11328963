"""The pure rules of monitors (promptsched/monitor): notify_when's syntax and decisions, the
comparison a `changed` monitor makes, the differences shown, and the output_schema checks."""

from __future__ import annotations

from typing import Any

import pytest

from promptsched.errors import ValidationError
from promptsched.monitor import changes, conditions
from promptsched.monitor import schema as output_schema

STATUS: dict[str, Any] = {
    "type": "object",
    "properties": {"status": {"enum": ["ok", "degraded"]}, "degraded": {"type": "boolean"}},
    "required": ["status", "degraded"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("text", "stored"),
    [
        (None, "always"), ("", "always"), (" always ", "always"), ("changed", "changed"),
        ("changed  /a~1b", "changed /a~1b"), ("/degraded", "/degraded"),
        ('/status=="down"', '/status == "down"'), ("/n != 3", "/n != 3"),
        ("/items/0/ok == true", "/items/0/ok == true"),
    ],
)  # fmt: skip
def test_notify_when_reads_and_writes_back(text: str | None, stored: str) -> None:
    condition = conditions.parse(text)
    assert conditions.text(condition) == stored
    assert conditions.parse(stored) == condition


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sometimes", "is not a condition: write always, changed"),
        ("degraded", "is not a condition"),
        ("/status == down", "is not a JSON value (quote strings"),
        ("/a b", "compare with == or !="),
        ("/a~2", "'~' is written ~0"),
        ("changed status", "is not a JSON Pointer"),
        ("/x" * 300, "is too long"),
    ],
)
def test_a_bad_notify_when_names_the_field_and_what_to_write(text: str, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        conditions.parse(text)
    assert caught.value.field == "notify_when" and message in str(caught.value)


@pytest.mark.parametrize(
    ("text", "data", "notify", "reason"),
    [
        ("/degraded", {"degraded": False}, False, "/degraded is false"),
        ("/degraded", {"degraded": True}, True, "/degraded is true"),
        ("/degraded", {}, False, "/degraded is missing"),
        ("/items", {"items": []}, False, "/items is []"),
        ("/n", {"n": 0.0}, False, "/n is 0.0"),
        ('/status == "down"', {"status": "up"}, False, '/status is "up", not "down"'),
        ('/status == "down"', {"status": "down"}, True, '/status is "down"'),
        ("/n == 1", {"n": 1.0}, True, "/n is 1.0"),
        ("/n == 1", {"n": True}, False, "/n is true, not 1"),
        ('/status != "ok"', {"status": "ok"}, False, '/status is "ok"'),
        ('/status != "ok"', {}, True, "/status is missing"),
        ("/a~1b/0", {"a/b": ["x"]}, True, '/a~1b/0 is "x"'),
    ],
)
def test_a_condition_decides_with_its_reason(
    text: str, data: Any, notify: bool, reason: str
) -> None:
    assert conditions.decide(conditions.parse(text), data) == conditions.Verdict(notify, reason)


def test_changed_compares_normalised_text_and_canonical_json() -> None:
    assert changes.fingerprint("All good.\n\n ") == changes.fingerprint("  All   good.")
    assert changes.fingerprint("All good.") != changes.fingerprint("All good!")
    assert changes.fingerprint(None, {"a": 1.0, "b": [1]}) == changes.fingerprint(
        "other text", {"b": [1], "a": 1}
    )
    assert changes.fingerprint(None, {"a": 1}) != changes.fingerprint(None, {"a": True})
    assert changes.fingerprint("{}", {}) != changes.fingerprint("{}")  # JSON is not text


def test_what_changed_as_paths_and_as_a_diff() -> None:
    old = {"status": "ok", "regions": ["eu", "us"], "gone": 1, "n": {"x": 1}}
    new = {"status": "degraded", "regions": ["eu"], "n": {"x": 1.0}, "new": None}
    found = changes.json_changes(old, new)
    assert [c.json() for c in found] == [
        {"path": "/status", "old": "ok", "new": "degraded"},
        {"path": "/regions/1", "old": "us"},
        {"path": "/gone", "old": 1},
        {"path": "/new", "new": None},
    ]
    assert [c.line() for c in found] == [
        '/status: "ok" → "degraded"', '/regions/1: removed (was "us")',
        "/gone: removed (was 1)", "/new: added null",
    ]  # fmt: skip
    diff = changes.text_diff("a\nb\nc", "a\nB\nc", old_name="run 1", new_name="run 2")
    assert diff == ["--- run 1", "+++ run 2", "@@ -1,3 +1,3 @@", " a", "-b", "+B", " c"]
    assert changes.text_diff("a  b", "a b\n", old_name="x", new_name="y") == []


def test_structured_output_reads_as_a_list() -> None:
    lines = changes.readable({"status": "ok", "up": True, "tags": ["a", "b"], "n": {"x": None}})
    assert lines == ["- **status**: ok", "- **up**: yes", "- **tags**: a, b", "- **n**:",
                     "  - **x**: (none)"]  # fmt: skip


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "object", "properties": {"a": {"type": "strin"}}},
         "is not a valid JSON Schema: at /properties/a/type"),
        ({"type": "array"}, 'must describe a JSON object at its root ("type": "object")'),
        ({"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}},
         "at /properties/a/$ref: only references within the schema"),
        ({"type": "object", "description": "x" * 17_000}, "is too large (17,"),
        ({"type": "object", "$schema": "https://example.com/dialect"}, "unknown dialect"),
        ("{}", "must be a JSON Schema object"),
    ],
)  # fmt: skip
def test_a_bad_schema_is_refused_naming_the_field(schema: Any, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        output_schema.check(schema)
    assert caught.value.field == "output_schema" and message in str(caught.value)


def test_a_schema_too_deep_is_refused() -> None:
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(30):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(ValidationError, match="nests deeper than 24 levels"):
        output_schema.check(deep)


ANSWERS = [
    ('Here is the status:\n```json\n{"status": "ok"}\n```\nAnything else?', {"status": "ok"}),
    ('Two blocks:\n```json\n{"n": 1}\n```\nand\n```json\n{"n": 2}\n```', {"n": 1}),
    ("Sure.\n```JSON\n[1, 2]\n```", [1, 2]),
    ('```\n{"a": true}\n```', {"a": True}),
    ('  {"a": "```json"}  ', {"a": "```json"}),
]
REFUSED = [
    ("All good!", "the answer is not JSON: it is text, with no JSON object and no ```json block"),
    ("", "the answer is not JSON: it is empty"),
    ('{"a": 1,}', "the answer is not JSON: a key is not in double quotes at line 1, column 9"),
    ('{"a" 1}', "the answer is not JSON: a colon is missing at line 1, column 6"),
    ('Here:\n```json\n{"a": }\n```', "the answer's ```json block is not JSON: a value is missing "
     "at line 1, column 7"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "data"), ANSWERS)
def test_the_first_fenced_block_is_read_after_a_sentence(text: str, data: Any) -> None:
    assert output_schema.read_answer(text) == data


@pytest.mark.parametrize(("text", "said"), REFUSED)
def test_an_answer_that_is_not_json_is_said_in_words(text: str, said: str) -> None:
    with pytest.raises(ValueError) as caught:
        output_schema.read_answer(text)
    assert str(caught.value) == said
    assert "Expecting" not in said and "char" not in said


def test_an_answer_is_read_and_checked_naming_the_failing_path() -> None:
    assert output_schema.check(STATUS) == STATUS
    assert output_schema.read_answer('```json\n{"status": "ok"}\n```') == {"status": "ok"}
    with pytest.raises(ValueError, match="the answer is not JSON"):
        output_schema.read_answer("All good!")
    assert output_schema.problem(STATUS, {"status": "ok", "degraded": False}) is None
    assert output_schema.problem(STATUS, {"status": "fine", "degraded": False}) == (
        "at /status: 'fine' is not one of ['ok', 'degraded']"
    )
    assert output_schema.problem(STATUS, {"status": "ok"}) == (
        "at the root: 'degraded' is a required property"
    )
    assert output_schema.strict_compatible(STATUS)
    assert not output_schema.strict_compatible({**STATUS, "required": ["status"]})
    assert output_schema.response_name({"title": "Status page!"}) == "Status_page"
    assert output_schema.response_name(STATUS) == "output"
