"""The address guard's allowlists end to end: configuration (variables, flags, TOML, the
deprecated flag), the notifier's webhook sender and the agent tools built from that
configuration, and real ``promptsched run`` processes against loopback servers."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from promptsched import config as configuration
from promptsched import netguard
from promptsched.clock import Clock
from promptsched.delivery import DeliveryError
from promptsched.errors import ConfigError
from promptsched.ops import inputs
from promptsched.ops import schedules as schedule_ops
from promptsched.roles.notifier import build_senders
from promptsched.tools.base import ToolError
from promptsched.tools.registry import ToolRegistry
from tests.fakes import openai_server as fake_server
from tests.fakes import pages as site
from tests.fakes.http_sink import HttpSink
from tests.helpers import Service, run_cli, wait_until
from tests.test_delivery_webhook import _notification
from tests.test_providers_integration import PROVIDER, provider_env

LOOPBACK = "127.0.0.1/32"


def _load(env: dict[str, str], **overrides: str) -> configuration.Config:
    return configuration.load(env=env, overrides=overrides)


def _refusal(allow: netguard.Allowlist, address: str) -> str | None:
    return netguard.refusal(ipaddress.ip_address(address), allow)


# -- configuration -------------------------------------------------------------------------


def test_each_use_has_its_own_allowlist_and_nothing_is_open_by_default() -> None:
    default = _load({})
    assert default.webhook_allow == netguard.NO_WEBHOOK_ALLOW
    assert default.tools_allow == netguard.NO_TOOLS_ALLOW
    config = _load({"PROMPTSCHED_WEBHOOK_ALLOW": " 127.0.0.1/32, 10.0.0.0/8 ,hooks.internal"})
    assert str(config.webhook_allow) == "127.0.0.1/32,10.0.0.0/8,hooks.internal"
    assert config.webhook_allow.variable == "PROMPTSCHED_WEBHOOK_ALLOW"
    assert _refusal(config.webhook_allow, "10.9.8.7") is None
    assert _refusal(config.tools_allow, "127.0.0.1") == "loopback"
    assert config.tools_allow.variable == "PROMPTSCHED_TOOLS_ALLOW"


def test_run_flags_and_toml_keys_set_the_allowlists(tmp_path: Path) -> None:
    toml = tmp_path / "promptsched.toml"
    toml.write_text('webhook_allow = ["127.0.0.1/32", "::1"]\ntools_allow = "192.168.0.0/16"\n')
    config = _load({"PROMPTSCHED_CONFIG": str(toml)})
    assert str(config.webhook_allow) == "127.0.0.1/32,::1/128"
    assert str(config.tools_allow) == "192.168.0.0/16"
    # the environment beats the file, a flag beats both
    flagged = _load(
        {"PROMPTSCHED_CONFIG": str(toml), "PROMPTSCHED_TOOLS_ALLOW": "10.0.0.0/8"},
        webhook_allow="169.254.169.254",
    )
    assert (str(flagged.webhook_allow), str(flagged.tools_allow)) == (
        "169.254.169.254/32",
        "10.0.0.0/8",
    )


def test_the_run_command_offers_a_flag_for_each_allowlist() -> None:
    from promptsched.cli import build_parser

    args = build_parser().parse_args(
        ["run", "--webhook-allow", "127.0.0.1/32", "--tools-allow", "::1"]
    )
    assert (args.cfg_webhook_allow, args.cfg_tools_allow) == ("127.0.0.1/32", "::1")


@pytest.mark.parametrize(
    ("env", "overrides", "field", "message"),
    [
        (
            {"PROMPTSCHED_WEBHOOK_ALLOW": "127.0.0.1/32,10.0.0.1/8"},
            {},
            "PROMPTSCHED_WEBHOOK_ALLOW",
            "'10.0.0.1/8' has host bits set (did you mean 10.0.0.0/8?)",
        ),
        (
            {"PROMPTSCHED_TOOLS_ALLOW": "*.internal"},
            {},
            "PROMPTSCHED_TOOLS_ALLOW",
            "'*.internal' is not a host name (no wildcards; list each name)",
        ),
        (
            {},
            {"tools_allow": "127.0.0.1/33"},
            "--tools-allow",
            "'127.0.0.1/33' is neither an IP address, a CIDR nor a host name",
        ),
    ],
)
def test_a_malformed_entry_is_a_startup_error_naming_the_variable_and_the_entry(
    env: dict[str, str], overrides: dict[str, str], field: str, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(env, **overrides)
    assert caught.value.field == field
    assert caught.value.message == f"{message}; expected comma-separated hosts or CIDRs"


def test_a_malformed_toml_entry_names_the_file_and_key(tmp_path: Path) -> None:
    toml = tmp_path / "promptsched.toml"
    toml.write_text('webhook_allow = ["127.0.0.1", "http://x"]\n')
    with pytest.raises(ConfigError) as caught:
        _load({"PROMPTSCHED_CONFIG": str(toml)})
    assert caught.value.field == f"{toml}: webhook_allow"


def test_the_deprecated_flag_opens_loopback_and_private_ranges_for_webhooks_only() -> None:
    config = _load(
        {
            "PROMPTSCHED_ALLOW_PRIVATE_WEBHOOKS": "true",
            "PROMPTSCHED_WEBHOOK_ALLOW": "169.254.169.254",
        }
    )
    for address in ("127.0.0.1", "::1", "10.1.1.1", "172.20.0.1", "192.168.5.5", "fd01::1"):
        assert _refusal(config.webhook_allow, address) is None, address
    for address, rule in [
        ("169.254.170.2", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("169.254.1.1", "link-local"),
        ("100.64.0.1", "shared"),
        ("0.0.0.0", "unspecified"),
    ]:
        assert _refusal(config.webhook_allow, address) == rule, address
    assert _refusal(config.webhook_allow, "169.254.169.254") is None  # listed exactly
    # ... and never the agent tools
    assert config.tools_allow == netguard.NO_TOOLS_ALLOW


# -- the senders and tools the service builds from its configuration -----------------------


async def test_a_webhook_to_loopback_is_sent_only_when_the_webhook_allowlist_covers_it(
    sink: HttpSink,
) -> None:
    notification = _notification(sink.url)
    for env in ({}, {"PROMPTSCHED_TOOLS_ALLOW": LOOPBACK}, {"PROMPTSCHED_WEBHOOK_ALLOW": "::1"}):
        sender = build_senders(_load(env))["webhook"]
        try:
            with pytest.raises(DeliveryError) as caught:
                await sender.send(notification)
        finally:
            await sender.aclose()
        assert not caught.value.retryable
        assert caught.value.message == (
            "webhook: 127.0.0.1 is loopback and not in PROMPTSCHED_WEBHOOK_ALLOW"
        )
    assert sink.requests == []
    sender = build_senders(_load({"PROMPTSCHED_WEBHOOK_ALLOW": LOOPBACK}))["webhook"]
    try:
        await sender.send(notification)
    finally:
        await sender.aclose()
    assert len(sink.requests) == 1


async def test_http_get_to_loopback_is_refused_when_only_the_webhook_list_allows_it(
    pages: site.Pages,
) -> None:
    config = _load({"PROMPTSCHED_WEBHOOK_ALLOW": LOOPBACK})
    tools = ToolRegistry.from_settings(allow=config.tools_allow)
    try:
        with pytest.raises(ToolError) as caught:
            await tools.tools()["http_get"].call({"url": pages.url("/page")})
    finally:
        await tools.aclose()
    assert str(caught.value).endswith("127.0.0.1 is loopback and not in PROMPTSCHED_TOOLS_ALLOW")
    assert pages.paths == []
    allowed = ToolRegistry.from_settings(
        allow=_load({"PROMPTSCHED_TOOLS_ALLOW": LOOPBACK}).tools_allow
    )
    try:
        assert "Harbour weather" in await allowed.tools()["http_get"].call(
            {"url": pages.url("/page")}
        )
    finally:
        await allowed.aclose()
    assert pages.paths == ["/page"]


@pytest.mark.parametrize(
    ("allow", "refused"),
    [
        ("0.0.0.0/0", True),
        ("169.254.0.0/16", True),
        ("169.254.169.254", False),
        ("169.254.169.254/32", False),
    ],
)
async def test_the_metadata_address_needs_an_exact_entry(allow: str, refused: bool) -> None:
    tools = ToolRegistry.from_settings(allow=_load({"PROMPTSCHED_TOOLS_ALLOW": allow}).tools_allow)
    try:
        fetcher = tools.builtins.fetcher
        if refused:
            with pytest.raises(ToolError, match="169.254.169.254 is a cloud metadata address"):
                fetcher.check("http://169.254.169.254/latest/meta-data/")
        else:
            assert fetcher.check("http://169.254.169.254/latest/meta-data/").host == (
                "169.254.169.254"
            )
    finally:
        await tools.aclose()


# -- real processes ------------------------------------------------------------------------


async def _agent_run(
    pool: asyncpg.Pool[Any], sink: HttpSink, allow: netguard.Allowlist
) -> tuple[int, int]:
    values = inputs.validate(
        {
            "name": "guarded agent", "cron": "0 0 1 1 *", "prompt": "Read the page.",
            "provider": PROVIDER, "params": {"tools": ["http_get"], "max_steps": 3},
            "timeout": "30s", "max_attempts": 1, "notify": {"webhook": {"url": sink.url}},
        },
        providers=[PROVIDER], provider_kinds={PROVIDER: "openai"}, webhook_allow=allow,
    )  # fmt: skip
    async with pool.acquire() as conn, conn.transaction():
        row = await schedule_ops.create_schedule(conn, Clock(), values, owner="default")
        run = await schedule_ops.trigger_schedule(conn, Clock(), row.id, owner=None, actor="test")
    return row.id, run["id"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env", "args", "tool_opened", "deprecated"),
    [
        ({"PROMPTSCHED_WEBHOOK_ALLOW": LOOPBACK}, (), False, False),
        ({"PROMPTSCHED_ALLOW_PRIVATE_WEBHOOKS": "true"}, (), False, True),
        ({}, ("--webhook-allow", LOOPBACK, "--tools-allow", LOOPBACK), True, False),
    ],
    ids=["webhook-list", "deprecated-flag", "both-lists-by-flag"],
)
async def test_a_service_reaches_loopback_only_through_the_list_of_each_use(
    dsn: str,
    pool: asyncpg.Pool[Any],
    tmp_path: Path,
    fake: fake_server.FakeOpenAI,
    pages: site.Pages,
    sink: HttpSink,
    env: dict[str, str],
    args: tuple[str, ...],
    tool_opened: bool,
    deprecated: bool,
) -> None:
    fake.script(
        fake_server.tool_calls(("http_get", {"url": pages.url("/page")})),
        fake_server.ok("done"),
    )
    loopback = netguard.Allowlist.parse(LOOPBACK, variable=netguard.WEBHOOK_ALLOW)
    _, rid = await _agent_run(pool, sink, loopback)
    process = Service(
        dsn,
        tmp_path / "service.log",
        env={**provider_env(fake.base_url, timeout="30s"), **env},
        args=args,
    )
    try:
        await process.ready()

        async def delivered() -> bool:
            status = await pool.fetchval("SELECT status FROM runs WHERE id = $1", rid)
            return status == "succeeded" and len(sink.requests) == 1

        await wait_until(delivered, timeout=30, what="the run and its webhook notification")
    finally:
        process.stop()
    assert sink.requests[0].json()["run"]["id"] == rid  # the webhook reached loopback
    transcript = await pool.fetchval("SELECT transcript FROM run_attempts WHERE run_id = $1", rid)
    (result,) = [step for step in transcript if step["kind"] == "tool_result"]
    if tool_opened:
        assert (result["error"], pages.paths) == (False, ["/page"])
    else:
        assert result["error"] is True
        assert "127.0.0.1 is loopback and not in PROMPTSCHED_TOOLS_ALLOW" in result["result"]
        assert pages.paths == []  # the tool never connected
    warning = process.has_event("config.deprecated")
    assert (warning is not None) == deprecated
    if warning is not None:
        assert warning["level"] == "warning"
        assert warning["replacement"] == "PROMPTSCHED_WEBHOOK_ALLOW"


@pytest.mark.parametrize(
    ("variable", "value", "entry"),
    [
        ("PROMPTSCHED_WEBHOOK_ALLOW", "127.0.0.1,10.0.0.1/8", "'10.0.0.1/8' has host bits set"),
        ("PROMPTSCHED_TOOLS_ALLOW", "::1,fe80::1%eth0", "'fe80::1%eth0'"),
    ],
)
def test_run_refuses_to_start_with_a_malformed_allowlist(
    dsn: str, variable: str, value: str, entry: str
) -> None:
    started = run_cli("run", dsn=dsn, env={variable: value})
    assert started.returncode == 2, started.stderr
    assert f"{variable}: {entry}" in started.stderr
    assert "Traceback" not in started.stderr
