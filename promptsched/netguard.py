"""Which network addresses promptsched may connect to on a user's behalf: loopback, private,
link-local, shared, reserved, multicast and unspecified addresses (IPv4 and IPv6, including
IPv4 embedded in IPv6) are refused unless ``allow_private`` is set for development.

Two checks, both needed: ``check_host`` when a URL is saved (literal addresses and local
names, no I/O), and ``resolve`` (or ``GuardedResolver`` inside aiohttp) when connecting, so a
name that later resolves to a private address (DNS rebinding) is refused too. The resolver
hands aiohttp exactly the addresses it checked, so nothing is resolved twice.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from typing import TypeAlias

import anyio
from aiohttp.abc import AbstractResolver, ResolveResult

from promptsched.errors import PromptschedError

IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address

ALLOW_HINT = "set PROMPTSCHED_ALLOW_PRIVATE_WEBHOOKS=true to allow it in development"
_LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
# Legacy numeric IPv4 spellings (127.1, 0x7f.0.0.1, 2130706433) that resolvers map onto an
# address while the text does not parse as one: refused outright, whatever the flag.
_NUMERIC_HOST = re.compile(r"^(?:0x[0-9a-f]+|[0-9]+)(?:\.(?:0x[0-9a-f]*|[0-9]*))*\.?$", re.I)


class AddressRefused(PromptschedError):
    """A host or address promptsched will not connect to."""

    def __init__(self, host: str, address: str, reason: str, via: str = "") -> None:
        super().__init__(f"{reason} address {address} refused{via}")
        self.host = host
        self.address = address
        self.reason = reason


def _embedded_v4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, Teredo client), if any."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    return None


def refusal(address: IPAddress, *, allow_private: bool) -> str | None:
    """Why ``address`` is refused (``"private"``, ``"loopback"``, ...), or None if allowed."""
    embedded = _embedded_v4(address)
    if embedded is not None:
        inner = refusal(embedded, allow_private=allow_private)
        if inner is not None:
            return inner
    if address.is_unspecified:
        return "unspecified"
    if address.is_multicast:
        return "multicast"
    if allow_private:
        return None
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_private:
        return "private"
    if address.is_reserved:
        return "reserved"
    if not address.is_global:
        return "non-public"
    return None


def parse_literal(host: str) -> IPAddress | None:
    """The address when ``host`` is an IP literal (``[v6]`` brackets allowed), else None."""
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def check_address(address: IPAddress, *, allow_private: bool, host: str = "") -> None:
    """Raise ``AddressRefused`` naming the refused address (the embedded IPv4 one, if that
    is what is refused) and, when ``host`` is a name, that it resolves there."""
    reason = refusal(address, allow_private=allow_private)
    if reason is None:
        return
    shown, via = address, ""
    embedded = _embedded_v4(address)
    if embedded is not None and refusal(embedded, allow_private=allow_private) == reason:
        shown, via = embedded, f" (embedded in {address})"
    if host and parse_literal(host) is None:
        via += f" ({host} resolves to it)"
    raise AddressRefused(host, str(shown), reason, via)


def check_host(host: str, *, allow_private: bool) -> None:
    """The checks possible without resolving: IP literals, local names, numeric tricks."""
    if not host:
        raise AddressRefused(host, host, "empty")
    literal = parse_literal(host)
    if literal is not None:
        check_address(literal, allow_private=allow_private, host=host)
        return
    name = host.lower().rstrip(".")
    if _NUMERIC_HOST.match(name):
        raise AddressRefused(host, host, "non-canonical numeric")
    if not allow_private and (name in _LOCAL_NAMES or name.endswith(".localhost")):
        raise AddressRefused(host, host, "loopback")


async def resolve(
    host: str, port: int, *, allow_private: bool, family: int = socket.AF_UNSPEC
) -> list[tuple[int, str]]:
    """``(family, address)`` for every address of ``host``; refuses if any one is refused,
    since a name mixing public and private addresses is how rebinding attacks look."""
    check_host(host, allow_private=allow_private)
    literal = parse_literal(host)
    if literal is not None:
        return [(socket.AF_INET if literal.version == 4 else socket.AF_INET6, str(literal))]
    infos = await anyio.getaddrinfo(host, port, family=family, type=socket.SOCK_STREAM)
    found: list[tuple[int, str]] = []
    for info_family, _type, _proto, _name, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        check_address(address, allow_private=allow_private, host=host)
        if (info_family, str(sockaddr[0])) not in found:
            found.append((int(info_family), str(sockaddr[0])))
    if not found:
        raise OSError(f"{host} did not resolve to any address")
    return found


class GuardedResolver(AbstractResolver):
    """An aiohttp resolver that only ever returns checked addresses (see ``resolve``).

    aiohttp does not consult resolvers for IP literals: check those with ``check_host``
    before the request.
    """

    def __init__(self, *, allow_private: bool) -> None:
        self.allow_private = allow_private

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        addresses = await resolve(host, port, allow_private=self.allow_private, family=family)
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=address_family,
                proto=0,
                flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
            )
            for address_family, address in addresses
        ]

    async def close(self) -> None:
        return None
