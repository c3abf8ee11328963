"""The fleet's status page (``/status``, admin sessions): what ``promptsched status`` shows,
from the same document (ops/status.py) in the same words (human/fleet.py): the replicas with
their drift and the settings that differ, the providers, the queue and the outbox."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from promptsched.console import layout
from promptsched.console.context import Ctx
from promptsched.console.html import Markup, Template, join
from promptsched.human import fleet as words
from promptsched.ops import status

_PAGE = Template("""<p class="flash $kind" role="status" id="fleet-headline">$headline</p>
<section><h2>Replicas</h2>
<div class="table-scroll">$replicas</div>
$differs</section>
<section><h2>Providers</h2>
<div class="table-scroll">$providers</div></section>
<section><h2>Queue and outbox</h2>
<p id="fleet-queue">$queue</p>
<p id="fleet-outbox">$outbox</p></section>""")
_DIFFERS = Template('<ul class="differs">$items</ul>')
_ITEM = Template("<li><code>$replica</code> differs: $line</li>")
_REPLICA_HEAD = ("Config", "Version", "Up", "Last seen", "Slots", "In flight", "Leads", "Roles",
                 "Replica")  # fmt: skip
_PROVIDER_HEAD = ("Provider", "Kind", "Breaker", "Running", "Allowed", "Limit", "Room", "Ready",
                  "Waiting", "Later", "Pacing")  # fmt: skip
ADMINS_ONLY = (
    "The fleet's status is for admin sessions: log in with an admin token. Make one with: "
    "promptsched tokens create --owner NAME --admin (it is printed once)."
)


def _dash(value: object) -> object:
    return "-" if value is None or value == "" else value


def _replicas(data: Mapping[str, Any]) -> Markup:
    rows = [
        [layout.badge(r["state"]), r["version"], r["up"], r["seen"], r["slots"], r["in_flight"],
         _dash(r["leads_text"]), r["roles_text"], r["id"]]
        for r in words.replica_rows(data["replicas"])
    ]  # fmt: skip
    return layout.table(_REPLICA_HEAD, rows)


def _differs(replicas: Sequence[Mapping[str, Any]]) -> Markup:
    items = [_ITEM(replica=r["id"], line=line) for r in replicas for line in r["differs"]]
    return _DIFFERS(items=join(items)) if items else Markup("")


def _providers(data: Mapping[str, Any]) -> Markup:
    rows = [
        [p["name"], p["kind"], p["breaker_text"], _dash(p["running"]), _dash(p["allowed"]),
         p["limit"], _dash(p["admitted_now"]), p["ready"], p["waiting"], p["scheduled"],
         _dash(p["pacing"])]
        for p in words.provider_rows(data["providers"])
    ]  # fmt: skip
    return layout.table(_PROVIDER_HEAD, rows)


async def show(ctx: Ctx) -> web.StreamResponse:
    if not ctx.who.admin:
        return layout.message_page(ctx, 403, "Admins only", ADMINS_ONLY)
    data = await status.gather(ctx.deps.pool, ctx.deps.clock)
    body = _PAGE(
        kind="warn" if data["fleet"]["drift"] or not data["fleet"]["replicas"] else "ok",
        headline=words.headline(data),
        replicas=_replicas(data),
        differs=_differs(data["replicas"]),
        providers=_providers(data),
        queue=words.queue_line(data["queue"]),
        outbox=words.outbox_line(data["outbox"]),
    )
    return layout.page(ctx, "Fleet status", body)
