"""The network guard: which addresses are refused, before and after DNS resolution."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import aiohttp
import pytest

from promptsched import netguard
from tests.fakes.http_sink import start_http_sink


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("10.0.0.1", "private"),
        ("172.16.5.4", "private"),
        ("192.168.0.1", "private"),
        ("169.254.169.254", "link-local"),
        ("100.64.0.1", "non-public"),
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
        ("2002:a00:1::", "private"),  # 6to4 carrying 10.0.0.1
        ("64:ff9b::a00:1", "reserved"),  # NAT64 (Python files ::/8 under reserved)
        ("8.8.8.8", None),
        ("93.184.215.14", None),
        ("2606:4700:4700::1111", None),
        ("::ffff:8.8.8.8", "reserved"),  # mapped forms are refused whatever they carry
    ],
)
def test_refusal_reasons(address: str, reason: str | None) -> None:
    assert netguard.refusal(ipaddress.ip_address(address), allow_private=False) == reason


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", None),
        ("10.0.0.1", None),
        ("fe80::1", None),
        ("::1", None),
        ("224.0.0.1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("ff02::1", "multicast"),
    ],
)
def test_allow_private_keeps_multicast_and_unspecified_refused(
    address: str, reason: str | None
) -> None:
    assert netguard.refusal(ipaddress.ip_address(address), allow_private=True) == reason


@pytest.mark.parametrize(
    "host", ["127.1", "2130706433", "0x7f000001", "0177.0.0.1", "0x7f.1", "10.1"]
)
def test_numeric_spellings_that_are_not_canonical_are_refused(host: str) -> None:
    with pytest.raises(netguard.AddressRefused, match="non-canonical numeric"):
        netguard.check_host(host, allow_private=True)


def test_names_are_checked_without_resolving_except_local_ones() -> None:
    netguard.check_host("example.com", allow_private=False)
    netguard.check_host("10.example.com", allow_private=False)
    for host in ("localhost", "LOCALHOST.", "api.localhost"):
        with pytest.raises(netguard.AddressRefused, match="loopback"):
            netguard.check_host(host, allow_private=False)
    netguard.check_host("localhost", allow_private=True)


def test_the_refused_address_is_named_and_embedded_ones_explained() -> None:
    with pytest.raises(netguard.AddressRefused) as caught:
        netguard.check_host("::ffff:10.0.0.1", allow_private=False)
    assert str(caught.value) == "private address 10.0.0.1 refused (embedded in ::ffff:a00:1)"


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
        await netguard.resolve("rebind.example", 443, allow_private=False)
    assert str(caught.value) == "private address 10.0.0.7 refused (rebind.example resolves to it)"


async def test_resolve_returns_checked_addresses() -> None:
    found = await netguard.resolve("localhost", 80, allow_private=True, family=socket.AF_INET)
    assert found == [(socket.AF_INET, "127.0.0.1")]
    assert await netguard.resolve("[::1]", 80, allow_private=True) == [(socket.AF_INET6, "::1")]


async def test_the_guarded_resolver_stops_aiohttp_before_it_connects() -> None:
    async with start_http_sink() as sink:
        port = int(sink.base_url.rsplit(":", 1)[1])
        url = f"http://localhost.localdomain.test:{port}/"
        guarded = aiohttp.TCPConnector(
            resolver=netguard.GuardedResolver(allow_private=False), use_dns_cache=False
        )
        async with aiohttp.ClientSession(connector=guarded) as session:
            with pytest.raises(netguard.AddressRefused):
                # localhost is refused by name, before any lookup.
                await session.get(f"http://localhost:{port}/")
            with pytest.raises((netguard.AddressRefused, aiohttp.ClientConnectorError)):
                await session.get(url)  # does not resolve here, or resolves and is checked
        allowed = aiohttp.TCPConnector(
            resolver=netguard.GuardedResolver(allow_private=True), use_dns_cache=False
        )
        async with aiohttp.ClientSession(connector=allowed) as session:
            async with session.get(f"http://localhost:{port}/ok") as response:
                assert response.status == 200
        assert [request.path for request in sink.requests] == ["/ok"]
