"""A long output is read, shown and compared in bounded time, off the event loop
(docs/reliability.md, "One answer never holds the loop"): ``GET /v1/runs/{id}/output`` and
the console's ``/runs/{id}/output`` stream the whole of it to its owner only; the run page
shows an excerpt with that link; every channel reads only a prefix of it as Markdown; a
message whose rendering passes its deadline is sent in plain form; two large answers are
compared in bounded time, exactly as before for small ones."""

from __future__ import annotations

import difflib
import itertools
import json
import random
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import anyio
import asyncpg
import pytest

from promptsched import markup
from promptsched.clock import Clock
from promptsched.delivery import Notification, chat, email, email_html, webhook
from promptsched.domain import OutboxEvent
from promptsched.monitor import changes
from tests import factories
from tests.api_support import Api
from tests.console_support import Console, console

_NAMES = itertools.count(1)
LONG = "".join(f"line {i}: **bold** and [a link](https://example.com/{i})\n" for i in range(6000))


@pytest.fixture
async def ui(pool: asyncpg.Pool[Any]) -> AsyncIterator[Console]:
    async with console(pool) as client:
        yield client


async def _run(pool: asyncpg.Pool[Any], owner: str, output: str | None) -> int:
    """A run of ``owner``'s, finished by the echo provider, with ``output`` stored as its
    answer (None: a run still pending)."""
    sid = await factories.schedule(pool, name=f"output {next(_NAMES)}")
    await pool.execute("UPDATE schedules SET owner = $2 WHERE id = $1", sid, owner)
    rid = await factories.pending_run(pool, sid, await pool.fetchval("SELECT now()"), "manual")
    if output is None:
        return rid
    await factories.worker_pool(pool, Clock()).run_once()
    await pool.execute("UPDATE runs SET output = $2 WHERE id = $1 AND status = 'succeeded'",
                       rid, output)  # fmt: skip
    assert await pool.fetchval("SELECT output FROM runs WHERE id = $1", rid) == output
    return rid


async def test_the_api_streams_the_whole_output_to_its_owner_only(
    api: Api, pool: asyncpg.Pool[Any]
) -> None:
    alice, bob = await api.token("alice"), await api.token("bob")
    admin = await api.token("root", admin=True)
    text = LONG + "é ✓ \U0001f600\n"  # characters of 2, 3 and 4 bytes
    rid = await _run(pool, "alice", text)
    got = await api.get(f"/v1/runs/{rid}/output", alice)
    assert got.status == 200 and got.body == text
    assert got.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert got.headers["Content-Length"] == str(len(text.encode()))
    assert got.headers["X-Content-Type-Options"] == "nosniff"
    assert (await api.get(f"/v1/runs/{rid}/output", admin)).body == text
    hidden = await api.get(f"/v1/runs/{rid}/output", bob)
    assert hidden.status == 404 and hidden.body["error"]["code"] == "not_found"
    assert (await api.get("/v1/runs/999999/output", alice)).status == 404
    assert (await api.get(f"/v1/runs/{rid}/output")).status == 401
    waiting = await _run(pool, "alice", None)
    none = await api.get(f"/v1/runs/{waiting}/output", alice)
    assert none.status == 409
    assert none.body["error"]["message"] == f"run {waiting} has no output (pending)"


async def test_the_run_page_shows_an_excerpt_and_links_to_the_whole(
    ui: Console, pool: asyncpg.Pool[Any]
) -> None:
    await ui.login_as("alice")
    big = LONG * 4  # about 1.3 MB: its page would be several
    rid = await _run(pool, "alice", big)
    page = await ui.get(f"/runs/{rid}")
    assert page.status == 200
    assert len(page.text.encode()) < 1_000_000
    assert f'<a href="/runs/{rid}/output">the whole output</a>' in page.text
    assert f"of {len(big):,} characters" in page.text
    assert "<strong>bold</strong>" in page.text  # the excerpt is rendered from its Markdown
    whole = await ui.get(f"/runs/{rid}/output")
    assert whole.status == 200 and whole.text == big
    assert whole.headers["Content-Type"] == "text/plain; charset=utf-8"
    short = await _run(pool, "alice", "just **this**")
    shown = await ui.get(f"/runs/{short}")
    assert "<strong>this</strong>" in shown.text and "the whole output" not in shown.text
    theirs = await _run(pool, "bob", "bob's answer")
    assert (await ui.get(f"/runs/{theirs}/output")).status == 404
    assert (await ui.get(f"/runs/{theirs}")).status == 404


def _notification(output: str, **fields: Any) -> Notification:
    now = datetime.now(UTC)
    base: dict[str, Any] = dict(
        id=1, idempotency_key="promptsched-1-succeeded-email", channel="email",
        event=OutboxEvent.SUCCEEDED, target=["ops@example.com"], schedule_id=1,
        schedule_name="report", timezone="UTC", run_id=2, slot=now, origin="manual",
        run_attempts=1, output=output, error=None, finished_at=now,
    )  # fmt: skip
    return Notification(**{**base, **fields})


SETTINGS = email.EmailSettings(
    host="smtp.test", port=25, username=None, password=None, tls="none",
    sender="promptsched@example.test", timeout=5,
)  # fmt: skip


def test_every_channel_reads_only_a_prefix_of_a_long_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read: list[int] = []  # the length of every text read as Markdown
    parse, render = markup._MD.parse, markup._MD.render

    def parsed(text: str, env: Any = None) -> Any:
        read.append(len(text))
        return parse(text, env)

    def rendered(text: str, env: Any = None) -> Any:
        read.append(len(text))
        return render(text, env)

    monkeypatch.setattr(markup._MD, "parse", parsed)
    monkeypatch.setattr(markup._MD, "render", rendered)
    n = _notification(LONG * 30)  # 9.6 MB
    message = email.build_message(n, SETTINGS)
    slack = chat.slack_payload(n, "https://console.example.com")
    discord = chat.discord_payload(n, None)
    body, _ = chat.ntfy_message(n, None)
    hook = json.loads(webhook._body(n))
    assert read and max(read) <= max(email_html.MAX_SOURCE_CHARS, chat.SOURCE_CHARS) + 1000
    assert "Clipped" in message.get_body(("html",)).get_content()  # type: ignore[union-attr]
    assert "clipped" in slack["blocks"][-1]["elements"][0]["text"]
    assert "clipped" in discord["embeds"][-1]["description"]
    assert b"clipped" in body and len(body) <= chat.NTFY_MAX_BYTES
    assert hook["output"].endswith("more characters cut]")


async def test_a_message_past_its_deadline_is_sent_in_plain_form(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import promptsched.delivery as delivery

    def slow(text: str) -> str:  # a rendering that outlasts the deadline, off the loop
        time.sleep(1.0)
        return "<p>late</p>"

    monkeypatch.setattr(delivery, "RENDER_DEADLINE", 0.2)
    monkeypatch.setattr(markup, "render_markdown", slow)
    n = _notification("a **bold** <b>claim</b>")
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await anyio.sleep(0.01)
            ticks += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        started = time.monotonic()
        message = await delivery.rendered(lambda m: email.build_message(m, SETTINGS), n)
        took = time.monotonic() - started
        tg.cancel_scope.cancel()
    html = message.get_body(("html",)).get_content()  # type: ignore[union-attr]
    assert "late" not in html and "a **bold** &lt;b&gt;claim&lt;/b&gt;" in html
    assert took < 0.9 and ticks >= 5  # the loop went on while the thread was rendering


def test_two_large_answers_are_compared_in_bounded_time() -> None:
    lines = [f"row {i}: value {i * 7}" for i in range(200_000)]  # about 4.6 MB
    old = "\n".join(lines)
    edited = [f"row {i}: changed" if i % 3 == 0 else line for i, line in enumerate(lines)]
    tail = [*lines[:-3], "a new ending"]
    for new in ("\n".join(tail), "\n".join(edited)):
        started = time.monotonic()
        diff = changes.text_diff(old, new, old_name="a", new_name="b")
        assert time.monotonic() - started < 10  # difflib alone: hours for the edited one
        assert _patched(old, diff) == new.splitlines()
    assert len(changes.text_diff(old, "\n".join(tail), old_name="a", new_name="b")) < 10


def test_small_texts_diff_as_difflib_does_and_json_as_before() -> None:
    rng = random.Random(7)
    for _ in range(300):
        a = [rng.choice("abcde") for _ in range(rng.randint(0, 12))]
        b = [rng.choice("abcdex") for _ in range(rng.randint(0, 12))]
        old, new = "\n".join(a), "\n".join(b)
        expected = list(difflib.unified_diff(a, b, fromfile="o", tofile="n", n=1, lineterm=""))
        if changes.normalized(old) == changes.normalized(new):
            expected = []
        assert changes.text_diff(old, new, old_name="o", new_name="n") == expected
    assert changes.json_changes({"a": 1, "b": [True, 2]}, {"a": 1.0, "b": [1, 2], "c": None}) == [
        changes.Change("/b/0", old=True, new=1),
        changes.Change("/c", new=None, added=True),
    ]
    many = changes.json_changes(list(range(500)), list(range(1, 501)), limit=changes.MAX_PATHS)
    assert len(many) == changes.MAX_PATHS


def _patched(old: str, diff: list[str]) -> list[str]:
    """``old`` with a unified diff applied (each hunk's old lines replaced by its new ones)."""
    source, out, at = old.splitlines(), [], 0
    for line in diff[2:]:
        if line.startswith("@@"):
            start, _, count = line.split()[1][1:].partition(",")
            begin = int(start) - (0 if count == "0" else 1)
            out += source[at:begin]
            at = begin
        elif line[:1] in (" ", "-"):
            at += 1
            if line[0] == " ":
                out.append(line[1:])
        elif line[:1] == "+":
            out.append(line[1:])
    return out + source[at:]
