"""The network guard: which addresses are refused, before and after DNS resolution."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import aiohttp
import pytest

from promptsched import netguard
from tests.fakes.http_sink import start_http_sink


def _allow(text: str, variable: str = netguard.WEBHOOK_ALLOW) -> netguard.Allowlist:
    return netguard.Allowlist.parse(text, variable=variable)


NOTHING = netguard.NO_WEBHOOK_ALLOW


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("10.0.0.1", "private"),
        ("172.16.5.4", "private"),
        ("192.168.0.1", "private"),
        ("169.254.169.254", "metadata"),
        ("169.254.170.2", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("100.100.100.200", "metadata"),
        ("168.63.129.16", "metadata"),  # public range, but Azure's WireServer
        ("169.254.1.1", "link-local"),
        ("100.64.0.1", "shared"),
        ("192.0.2.1", "private"),  # documentation range
        ("240.0.0.1", "private"),  # reserved, which Python files under private
        ("224.0.0.1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("fe80::1", "link-local"),
        ("fd12:3456::1", "private"),
        ("ff02::1", "multicast"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:10.0.0.1", "private"),
        ("::ffff:169.254.169.254", "metadata"),
        ("2002:a00:1::", "private"),  # 6to4 carrying 10.0.0.1
        ("2002:a9fe:a9fe::", "metadata"),  # 6to4 carrying 169.254.169.254
        ("64:ff9b::a00:1", "reserved"),  # NAT64 (Python files ::/8 under reserved)
        ("8.8.8.8", None),
        ("93.184.215.14", None),
        ("2606:4700:4700::1111", None),
        ("::ffff:8.8.8.8", None),  # a mapped address reaches exactly the IPv4 one it carries
    ],
)
def test_refusal_reasons(address: str, reason: str | None) -> None:
    assert netguard.refusal(ipaddress.ip_address(address), NOTHING) == reason


@pytest.mark.parametrize(
    ("allow", "address", "reason"),
    [
        ("127.0.0.1/32", "127.0.0.1", None),
        ("127.0.0.1/32", "127.0.0.2", "loopback"),
        ("127.0.0.0/8", "127.0.0.2", None),
        ("127.0.0.1", "::ffff:127.0.0.1", None),
        ("127.0.0.1", "::1", "loopback"),
        ("::1", "::1", None),
        ("10.0.0.0/8", "10.20.30.40", None),
        ("10.0.0.0/8", "192.168.0.1", "private"),
        ("100.64.0.0/10", "100.64.0.1", None),
        ("0.0.0.0/0", "0.0.0.0", None),  # covered, so it passes like any other range
        ("0.0.0.0/0", "224.0.0.1", None),
        ("0.0.0.0/0", "::1", "loopback"),  # an IPv4 range covers no IPv6 address
        ("fd00::/8", "fd12::1", None),
        # metadata and link-local: only an exact entry opens them
        ("0.0.0.0/0", "169.254.169.254", "metadata"),
        ("169.254.0.0/16", "169.254.169.254", "metadata"),
        ("169.254.169.254/31", "169.254.169.254", "metadata"),
        ("169.254.169.254", "169.254.169.254", None),
        ("169.254.169.254/32", "169.254.169.254", None),
        ("169.254.169.254/32", "169.254.170.2", "metadata"),
        ("fd00::/8", "fd00:ec2::254", "metadata"),
        ("::/0", "fd00:ec2::254", "metadata"),
        ("fd00:ec2::254/128", "fd00:ec2::254", None),
        ("169.254.0.0/16", "169.254.1.1", "link-local"),
        ("169.254.1.1", "169.254.1.1", None),
        ("fe80::/10", "fe80::1", "link-local"),
        ("fe80::1/128", "fe80::1", None),
        ("169.254.0.0/16", "2002:a9fe:a9fe::", "metadata"),  # 6to4 carrying metadata
        ("169.254.169.254", "2002:a9fe:a9fe::", None),
        ("10.0.0.0/8", "::ffff:10.0.0.1", None),
        # a host name entry matches only that name, never an address
        ("hooks.internal", "10.0.0.1", "private"),
    ],
)
def test_the_allowlist_opens_what_it_covers(allow: str, address: str, reason: str | None) -> None:
    assert netguard.refusal(ipaddress.ip_address(address), _allow(allow)) == reason


def test_a_named_host_opens_what_it_resolves_to_except_exact_only_addresses() -> None:
    allow = _allow("hooks.internal")
    netguard.check_address(ipaddress.ip_address("10.0.0.1"), allow, host="HOOKS.internal.")
    with pytest.raises(netguard.AddressRefused) as caught:
        netguard.check_address(ipaddress.ip_address("10.0.0.1"), allow, host="other.internal")
    assert str(caught.value) == (
        "10.0.0.1 (other.internal resolves to it) is private and not in PROMPTSCHED_WEBHOOK_ALLOW"
    )
    with pytest.raises(netguard.AddressRefused) as caught:
        netguard.check_address(
            ipaddress.ip_address("169.254.169.254"), allow, host="hooks.internal"
        )
    assert caught.value.reason == "metadata"


@pytest.mark.parametrize(
    ("address", "allow", "message"),
    [
        (
            "169.254.169.254",
            "",
            "169.254.169.254 is a cloud metadata address; list it exactly (169.254.169.254/32) "
            "in PROMPTSCHED_WEBHOOK_ALLOW to allow it",
        ),
        (
            "169.254.169.254",
            "10.0.0.0/8,169.254.0.0/16",
            "169.254.169.254 is a cloud metadata address, which only an exact entry allows: "
            "PROMPTSCHED_WEBHOOK_ALLOW covers it only with the wider range 169.254.0.0/16; "
            "list 169.254.169.254/32 itself to allow it",
        ),
        (
            "fe80::1",
            "",
            "fe80::1 is a link-local address; list it exactly (fe80::1/128) in "
            "PROMPTSCHED_WEBHOOK_ALLOW to allow it",
        ),
        ("127.0.0.1", "", "127.0.0.1 is loopback and not in PROMPTSCHED_WEBHOOK_ALLOW"),
        ("127.0.0.1", "10.0.0.0/8", "127.0.0.1 is loopback and not in PROMPTSCHED_WEBHOOK_ALLOW"),
        ("0.0.0.0", "127.0.0.0/8", "0.0.0.0 is unspecified and not in PROMPTSCHED_WEBHOOK_ALLOW"),
        ("::", "::1", ":: is unspecified and not in PROMPTSCHED_WEBHOOK_ALLOW"),
        ("224.0.0.1", "", "224.0.0.1 is multicast and not in PROMPTSCHED_WEBHOOK_ALLOW"),
        ("ff02::1", "", "ff02::1 is multicast and not in PROMPTSCHED_WEBHOOK_ALLOW"),
        (
            "100.64.0.1",
            "",
            "100.64.0.1 is shared address space (CGNAT, 100.64.0.0/10) and not in "
            "PROMPTSCHED_WEBHOOK_ALLOW",
        ),
        ("64:ff9b::1", "", "64:ff9b::1 is reserved and not in PROMPTSCHED_WEBHOOK_ALLOW"),
    ],
)
def test_each_refusal_names_its_rule(address: str, allow: str, message: str) -> None:
    with pytest.raises(netguard.AddressRefused) as caught:
        netguard.check_host(address, _allow(allow))
    assert str(caught.value) == message


def test_the_refusal_names_the_list_of_its_use() -> None:
    with pytest.raises(netguard.AddressRefused) as caught:
        netguard.check_host("127.0.0.1", _allow("", netguard.TOOLS_ALLOW))
    assert str(caught.value) == "127.0.0.1 is loopback and not in PROMPTSCHED_TOOLS_ALLOW"


@pytest.mark.parametrize(
    ("text", "networks", "hosts"),
    [
        ("", [], []),
        (" 127.0.0.1/32 , ,::1", ["127.0.0.1/32", "::1/128"], []),
        ("10.0.0.0/8,10.0.0.0/8", ["10.0.0.0/8"], []),
        ("[fd00::]/8,[::1]", ["fd00::/8", "::1/128"], []),
        ("Hooks.Internal.,localhost", [], ["hooks.internal", "localhost"]),
        ("169.254.169.254", ["169.254.169.254/32"], []),
    ],
)
def test_allowlists_parse_addresses_cidrs_and_names(
    text: str, networks: list[str], hosts: list[str]
) -> None:
    parsed = _allow(text)
    assert [str(net) for net in parsed.networks] == networks
    assert sorted(parsed.hosts) == hosts


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10.0.0.1/8", "'10.0.0.1/8' has host bits set (did you mean 10.0.0.0/8?)"),
        ("*.example.com", "'*.example.com' is not a host name (no wildcards; list each name)"),
        ("127.1", "'127.1' is neither an IP address, a CIDR nor a host name"),
        ("300.1.1.1", "'300.1.1.1' is neither an IP address, a CIDR nor a host name"),
        ("10.0.0.0/33", "'10.0.0.0/33' is neither an IP address, a CIDR nor a host name"),
        ("fe80::1%eth0", "'fe80::1%eth0': zone indexes (%) are not supported"),
        ("http://x", "'http://x' is neither an IP address, a CIDR nor a host name"),
    ],
)
def test_malformed_entries_are_named(text: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        _allow(f"127.0.0.1,{text}")
    assert str(caught.value) == message


def test_the_deprecated_flag_stands_for_loopback_and_private_ranges_only() -> None:
    legacy = netguard.LEGACY_PRIVATE
    for address in ("127.0.0.1", "::1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "fd12::1"):
        assert netguard.refusal(ipaddress.ip_address(address), legacy) is None, address
    for address, reason in [
        ("169.254.169.254", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("100.64.0.1", "shared"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
    ]:
        assert netguard.refusal(ipaddress.ip_address(address), legacy) == reason, address
    netguard.check_host("localhost", legacy)


@pytest.mark.parametrize(
    "host", ["127.1", "2130706433", "0x7f000001", "0177.0.0.1", "0x7f.1", "10.1"]
)
def test_numeric_spellings_that_are_not_canonical_are_refused(host: str) -> None:
    with pytest.raises(netguard.AddressRefused, match="non-canonical numeric"):
        netguard.check_host(host, _allow("0.0.0.0/0,::/0,localhost"))


def test_names_are_checked_without_resolving_except_local_ones() -> None:
    netguard.check_host("example.com", NOTHING)
    netguard.check_host("10.example.com", NOTHING)
    for host in ("localhost", "LOCALHOST.", "api.localhost"):
        with pytest.raises(netguard.AddressRefused, match="is a loopback name and not in"):
            netguard.check_host(host, NOTHING)
    netguard.check_host("localhost", _allow("localhost"))
    netguard.check_host("api.localhost", _allow("127.0.0.1"))


def test_the_refused_address_is_named_and_embedded_ones_explained() -> None:
    with pytest.raises(netguard.AddressRefused) as caught:
        netguard.check_host("::ffff:10.0.0.1", NOTHING)
    assert str(caught.value) == (
        "10.0.0.1 (embedded in ::ffff:a00:1) is private and not in PROMPTSCHED_WEBHOOK_ALLOW"
    )


async def test_resolve_refuses_a_name_that_resolves_to_loopback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def fake_dns(host: str, port: int, **kwargs: Any) -> list[Any]:
        # A public-looking name answering with one public and one private address.
        assert host == "rebind.example"
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", port)),
        ]

    monkeypatch.setattr(netguard.anyio, "getaddrinfo", fake_dns)
    with pytest.raises(netguard.AddressRefused) as caught:
        await netguard.resolve("rebind.example", 443, _allow("192.168.0.0/16"))
    assert str(caught.value) == (
        "10.0.0.7 (rebind.example resolves to it) is private and not in PROMPTSCHED_WEBHOOK_ALLOW"
    )


async def test_resolve_returns_checked_addresses() -> None:
    loopback = _allow("127.0.0.0/8,::1")
    found = await netguard.resolve("localhost", 80, loopback, family=socket.AF_INET)
    assert found == [(socket.AF_INET, "127.0.0.1")]
    assert await netguard.resolve("[::1]", 80, loopback) == [(socket.AF_INET6, "::1")]


async def test_the_guarded_resolver_stops_aiohttp_before_it_connects() -> None:
    async with start_http_sink() as sink:
        port = int(sink.base_url.rsplit(":", 1)[1])
        url = f"http://localhost.localdomain.test:{port}/"
        guarded = aiohttp.TCPConnector(
            resolver=netguard.GuardedResolver(_allow("10.0.0.0/8,::1")), use_dns_cache=False
        )
        async with aiohttp.ClientSession(connector=guarded) as session:
            with pytest.raises(netguard.AddressRefused):
                # localhost is refused by name, before any lookup.
                await session.get(f"http://localhost:{port}/")
            with pytest.raises((netguard.AddressRefused, aiohttp.ClientConnectorError)):
                await session.get(url)  # does not resolve here, or resolves and is checked
        allowed = aiohttp.TCPConnector(
            resolver=netguard.GuardedResolver(_allow("127.0.0.1,localhost")), use_dns_cache=False
        )
        async with aiohttp.ClientSession(connector=allowed) as session:
            async with session.get(f"http://localhost:{port}/ok") as response:
                assert response.status == 200
        assert [request.path for request in sink.requests] == ["/ok"]
