"""The fleet's one truth (ops/fleet.py, roles/presence.py): every replica publishes its
configuration without a secret and a fingerprint of what replicas share; the drift gauges move
when two live replicas disagree; input is checked against the configuration most live
replicas publish, or this process's own when none is up; schedules and budgets that ask for
what no replica can do get warnings. Real Postgres, frozen clocks."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from promptsched import config as configuration
from promptsched.clock import Clock, FrozenClock
from promptsched.executors.settings import parse_providers
from promptsched.metrics import Metrics
from promptsched.ops import fleet, status
from promptsched.roles.presence import Presence
from promptsched.store import queries
from promptsched.tools.base import Catalog
from tests import api_support
from tests.console_support import console

NOW = datetime.fromisoformat("2026-05-04T10:00:00+00:00")
KEY, PASSWORD = "sk-test-0123456789abcdef", "smtp-hunter2-secret"
BASE_ENV = {
    "PROMPTSCHED_PROVIDERS": "shopcheck",
    "PROMPTSCHED_PROVIDER_SHOPCHECK_KIND": "openai",
    "PROMPTSCHED_PROVIDER_SHOPCHECK_BASE_URL": "https://llm.example/v1?tenant=acme-secret",
    "PROMPTSCHED_PROVIDER_SHOPCHECK_API_KEY_ENV": "SHOP_KEY",
    "PROMPTSCHED_PROVIDER_SHOPCHECK_MODEL": "gpt-4o-mini",
    "PROMPTSCHED_PROVIDER_SHOPCHECK_MAX_CONCURRENCY": "2",
    "SHOP_KEY": KEY,
    "PROMPTSCHED_WEBHOOK_ALLOW": "127.0.0.1/32,hooks.internal",
    "PROMPTSCHED_SMTP_HOST": "mail.internal",
    "PROMPTSCHED_SMTP_USERNAME": "promptsched",
    "PROMPTSCHED_SMTP_PASSWORD": PASSWORD,
    "PROMPTSCHED_PRICES": "shopcheck=0.15/0.60",
    "PROMPTSCHED_PUBLIC_URL": "https://console.example",
}


def _published(
    env: Mapping[str, str] = BASE_ENV,
    *,
    roles: tuple[str, ...] = configuration.ROLES,
    slots: int = 4,
    catalog: Catalog | None = None,
) -> fleet.Published:
    config = configuration.load(env={**env, "HOME": "/nonexistent"})
    providers = parse_providers(config.env, config.providers_raw)
    return fleet.describe(config, providers, roles=roles, slots=slots, catalog=catalog)


def _presence(
    pool: asyncpg.Pool[Any], clock: Clock, replica_id: str, published: fleet.Published
) -> Presence:
    row = queries.ReplicaRow(
        id=replica_id, host="host-" + replica_id, version=fleet.VERSION,
        roles=published.config["roles"], slots=published.config["slots"],
        config=published.config, fingerprint=published.fingerprint,
    )  # fmt: skip
    return Presence(
        pool, clock, Metrics(), describe=lambda: row, in_flight=lambda: 3,
        interval=timedelta(seconds=10),
    )  # fmt: skip


def _gauge(presence: Presence, name: str) -> float | None:
    return presence.metrics.registry.get_sample_value(f"promptsched_{name}")


def test_the_published_configuration_holds_no_secret_and_says_what_each_setting_is() -> None:
    document = _published().config
    text = json.dumps(document)
    for secret in (KEY, PASSWORD, "acme-secret", "SHOP_KEY"):
        assert secret not in text
    shared = document["shared"]
    shop = shared["providers"]["shopcheck"]
    assert shop["kind"] == "openai" and shop["base_url"] == "https://llm.example/v1"
    assert shop["models"] == ["gpt-4o-mini"] and shop["key"] is True
    assert shop["limits"]["max_concurrency"] == 2 and shop["fallbacks"] == []
    assert shop["structured_output"] == "strict"
    assert shared["webhook_allow"] == ["127.0.0.1/32", "hooks.internal"]
    assert shared["notify"]["email"] == {
        "configured": True, "host": "mail.internal", "port": 587, "tls": "starttls",
        "login": True, "from": "promptsched@localhost",
    }  # fmt: skip
    assert shared["public_url"] == "https://console.example"
    assert shared["prices"] == ["shopcheck"] and shared["lease"] == "30s"
    assert document["version"] == fleet.VERSION and document["slots"] == 4


def test_the_fingerprint_covers_what_replicas_share_and_not_what_is_their_own() -> None:
    base = _published()
    limit = {**BASE_ENV, "PROMPTSCHED_PROVIDER_SHOPCHECK_MAX_CONCURRENCY": "3"}
    assert _published(limit).fingerprint != base.fingerprint
    assert _published({**BASE_ENV, "PROMPTSCHED_SMTP_TLS": "none"}).fingerprint != base.fingerprint
    modes = {**BASE_ENV, "PROMPTSCHED_PROVIDER_SHOPCHECK_STRUCTURED_OUTPUT": "json_object"}
    assert _published(modes).fingerprint != base.fingerprint
    # Another key or password, roles, slots or tools now: the same configuration.
    rekeyed = {**BASE_ENV, "SHOP_KEY": "sk-other", "PROMPTSCHED_SMTP_PASSWORD": "other"}
    assert _published(rekeyed).fingerprint == base.fingerprint
    own = _published(roles=("api",), slots=0, catalog=Catalog({"fetch": None}))
    assert own.fingerprint == base.fingerprint


async def test_replicas_that_disagree_move_the_drift_gauges_until_one_leaves(
    pool: asyncpg.Pool[Any],
) -> None:
    clock = FrozenClock(NOW)
    first = _presence(pool, clock, "a", _published())
    assert await first.run_once() == 1
    assert (_gauge(first, "config_drift"), _gauge(first, "config_fingerprints")) == (0, 1)
    other = {**BASE_ENV, "PROMPTSCHED_PROVIDER_SHOPCHECK_MAX_CONCURRENCY": "3"}
    second = _presence(pool, clock, "b", _published(other))
    assert await second.run_once() == 2
    assert await first.run_once() == 2
    assert (_gauge(first, "config_drift"), _gauge(first, "replicas")) == (1, 2)
    stored = await pool.fetchrow("SELECT * FROM replicas WHERE id = 'a'")
    assert stored is not None and stored["in_flight"] == 3
    assert stored["started_at"] == NOW and stored["config"]["shared"]["providers"]
    await second.close()  # a clean stop leaves the fleet at once
    assert await first.run_once() == 1 and _gauge(first, "config_drift") == 0
    assert _gauge(first, "replicas") == 1


async def test_a_silent_replica_leaves_the_fleet_when_its_intervals_run_out(
    pool: asyncpg.Pool[Any],
) -> None:
    clock = FrozenClock(NOW)
    first = _presence(pool, clock, "a", _published())
    other = {**BASE_ENV, "PROMPTSCHED_WEBHOOK_ALLOW": "10.0.0.0/8"}
    frozen = _presence(pool, FrozenClock(NOW), "b", _published(other))
    await frozen.run_once()
    assert await first.run_once() == 2
    clock.advance(timedelta(seconds=29))  # within three intervals of its last renewal
    assert await first.run_once() == 2
    clock.advance(timedelta(seconds=2))
    assert await first.run_once() == 1 and _gauge(first, "replicas") == 1


async def test_input_is_checked_against_most_live_replicas_or_this_process_without_any(
    pool: asyncpg.Pool[Any],
) -> None:
    clock = FrozenClock(NOW)
    local = fleet.local(configuration.load(env={"HOME": "/nonexistent"}))
    alone = await fleet.view(pool, clock, lambda: local)
    assert alone.source == "local" and alone.providers == {"echo": "echo"}
    assert alone.note is not None and "no replica is running" in alone.note
    assert not alone.can_email and not alone.priced
    api_only = _published(roles=("api",))  # SMTP set, but it runs no notifier
    await _presence(pool, clock, "a", api_only).run_once()
    await _presence(pool, clock, "b", api_only).run_once()
    other = {**BASE_ENV, "PROMPTSCHED_PROVIDERS": "", "PROMPTSCHED_SMTP_HOST": ""}
    for key in [k for k in other if k.startswith("PROMPTSCHED_PROVIDER_")]:
        del other[key]
    await _presence(pool, clock, "c", _published(other)).run_once()
    seen = await fleet.view(pool, clock, lambda: local)
    assert (seen.source, seen.replicas, seen.fingerprints) == ("fleet", 3, 2)
    assert seen.providers == {"echo": "echo", "shopcheck": "openai"}  # two of three
    assert seen.webhook_allow.names("hooks.internal") and seen.priced == {"shopcheck"}
    assert seen.note is not None and "2 different configurations" in seen.note
    assert seen.can_email is False  # neither replica with SMTP sends notifications
    await _presence(pool, clock, "d", _published()).run_once()
    assert (await fleet.view(pool, clock, lambda: local)).can_email is True


def test_warnings_name_what_will_not_work_and_the_setting_that_fixes_it() -> None:
    nothing = fleet.own(fleet.bare_document({"echo": "echo"}, fleet.netguard.NO_WEBHOOK_ALLOW))
    mail = {"email": ["ops@example.com"]}
    email = fleet.email_warning(nothing, mail)
    assert email is not None and "PROMPTSCHED_SMTP_HOST" in email
    assert email.startswith(
        "email: no replica is running, and this environment cannot send mail (it has no "
        "PROMPTSCHED_SMTP_HOST): the emails this schedule owes will not be sent"
    ), email
    assert fleet.email_warning(nothing, {"webhook": {"url": "https://x.example"}}) is None
    cost = fleet.cost_warning(nothing, {"cost_per_day": 1}, "echo", "budget")
    assert cost is not None and "PROMPTSCHED_PRICES" in cost and "budget.cost_per_day" in cost
    assert fleet.cost_warning(nothing, {"tokens_per_day": 10}, "echo", "budget") is None
    priced = fleet.own(_published().config)
    assert fleet.email_warning(priced, mail) is None
    assert fleet.cost_warning(priced, {"cost_per_day": 1}, "shopcheck", "budget") is None
    unpriced = fleet.cost_warning(priced, {"cost_per_day": 1}, "echo", "budget")
    assert unpriced is not None and "'echo' has no price" in unpriced


async def test_the_api_warns_about_emails_no_replica_sends_and_costs_no_price_knows(
    pool: asyncpg.Pool[Any],
) -> None:
    async with api_support.client(pool) as api:
        alice = await api.token("alice")
        body = {
            "name": "digest", "every": "1h", "prompt": "hi",
            "notify": {"email": ["ops@example.com"]}, "budget": {"cost_per_day": 2},
        }  # fmt: skip
        created = await api.post("/v1/schedules", alice, json=body)
        assert created.status == 201
        warnings = created.body["warnings"]
        assert any("PROMPTSCHED_SMTP_HOST" in w for w in warnings)
        assert any("PROMPTSCHED_PRICES" in w for w in warnings)
        sid = created.body["id"]
        async with console(pool) as ui:  # the schedule's page says the same
            await ui.login_as("alice")
            page = (await ui.get(f"/schedules/{sid}")).text
            assert 'class="flash warn"' in page and "PROMPTSCHED_SMTP_HOST" in page
            assert "PROMPTSCHED_PRICES" in page
        quiet = await api.patch(f"/v1/schedules/{sid}", alice, json={"notify": None,
                                                                       "budget": None})  # fmt: skip
        assert quiet.status == 200 and "warnings" not in quiet.body
        owner = await api.put("/v1/budget", alice, json={"cost_per_month": 5})
        assert owner.status == 200 and "PROMPTSCHED_PRICES" in owner.body["warnings"][0]
        # With a replica that sends mail and prices its provider, nothing to warn about.
        await _presence(pool, Clock(), "mailer", _published()).run_once()
        shop = {**body, "name": "again", "provider": "shopcheck"}
        again = await api.post("/v1/schedules", alice, json=shop)
        assert again.status == 201 and "warnings" not in again.body, again.body


async def test_status_shows_each_providers_breaker_ramp_and_pacing_as_the_claim_meets_them(
    pool: asyncpg.Pool[Any],
) -> None:
    clock = FrozenClock(NOW)
    limited = {**BASE_ENV, "PROMPTSCHED_PROVIDER_SHOPCHECK_MAX_CONCURRENCY": "8"}
    await _presence(pool, clock, "a", _published(limited)).run_once()
    found = (await status.gather(pool, clock))["providers"]
    shop = next(p for p in found if p["name"] == "shopcheck")
    assert (shop["breaker"], shop["allowed_concurrency"], shop["admitted_now"]) == ("closed", 8, 8)
    # The breaker opened a minute ago for two more; after it, the concurrency ramps from 3.
    await pool.execute(
        "INSERT INTO provider_buckets (provider, open_until, failures, opened_at, ramp, "
        "paced_until) VALUES ('shopcheck', $1, 5, $2, 3.5, $3)",
        NOW + timedelta(minutes=2), NOW - timedelta(minutes=1), NOW + timedelta(seconds=30),
    )  # fmt: skip
    shop = next(
        p for p in (await status.gather(pool, clock))["providers"] if p["name"] == "shopcheck"
    )
    assert (shop["breaker"], shop["open_for_seconds"], shop["failures"]) == ("open", 120.0, 5)
    assert (shop["allowed_concurrency"], shop["admitted_now"]) == (3, 0)
    assert shop["paced_for_seconds"] == 30.0
    clock.advance(timedelta(minutes=3))  # past open_until: one probe at a time
    shop = next(
        p for p in (await status.gather(pool, clock))["providers"] if p["name"] == "shopcheck"
    )
    assert (shop["breaker"], shop["admitted_now"]) == ("half_open", 1)
    echo = next(p for p in found if p["name"] == "echo")
    assert echo["fleet_wide"] is False and echo["breaker"] == "closed"


async def test_status_lists_a_replica_whose_published_configuration_it_cannot_read(
    pool: asyncpg.Pool[Any],
) -> None:
    """A replica of another release publishes a document this one cannot read: it is listed
    (with its version, saying why the rest is missing), and the others with it."""
    clock = FrozenClock(NOW)
    await _presence(pool, clock, "a", _published(BASE_ENV)).run_once()
    await pool.execute(
        "INSERT INTO replicas (id, host, version, roles, slots, config, fingerprint, started_at,"
        " seen_at, alive_until) VALUES ('other:1/x', 'other', '9.0.0', '{worker}', 4,"
        " '[\"a document of another shape\"]'::jsonb, 'f9', $1, $1, $2)",
        NOW - timedelta(seconds=5), NOW + timedelta(seconds=30),
    )  # fmt: skip
    found = await status.gather(pool, clock)
    listed = {r["version"]: r for r in found["replicas"]}
    assert set(listed) == {"0.2.0", "9.0.0"}
    other = listed["9.0.0"]
    assert other["alive"] and other["roles"] == ["worker"]
    assert other["differs"] == [
        "its published configuration could not be read (AttributeError): it may be of another "
        "release"
    ]
    assert found["fleet"]["versions"] == ["0.2.0", "9.0.0"]
