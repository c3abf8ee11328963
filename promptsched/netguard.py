"""Which network addresses promptsched may connect to on a user's (or a model's) behalf: public
addresses, and non-public ones only where an operator's allowlist lets them through.

Each use has its own ``Allowlist`` (``PROMPTSCHED_WEBHOOK_ALLOW`` for notification webhooks,
``PROMPTSCHED_TOOLS_ALLOW`` for the agent tools): comma-separated addresses, CIDRs and host
names. Loopback, private, shared (CGNAT), unspecified, multicast, reserved and other non-public
addresses pass when an entry covers them; cloud metadata and link-local addresses pass only
when listed exactly (a single address, never inside a wider range). IPv4 embedded in IPv6
(mapped, 6to4, Teredo) is checked as the IPv4 address it carries and, unless it is a mapped
address (which reaches exactly that IPv4 address), as itself.

Two checks, both needed: ``check_host`` when a URL is saved (literal addresses and local
names, no I/O), and ``resolve`` (or ``GuardedResolver`` inside aiohttp) when connecting, so a
name that later resolves to a refused address (DNS rebinding) is refused too. The resolver
hands aiohttp exactly the addresses it checked, so nothing is resolved twice.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeAlias

import aiohttp
import anyio
from aiohttp.abc import AbstractResolver, ResolveResult

from promptsched.errors import PromptschedError

IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network

WEBHOOK_ALLOW = "PROMPTSCHED_WEBHOOK_ALLOW"
TOOLS_ALLOW = "PROMPTSCHED_TOOLS_ALLOW"

# Instance metadata and credential endpoints of the common clouds: AWS (IMDS v4/v6, ECS task
# credentials, EKS pod identity), GCP and Azure IMDS (169.254.169.254), Azure WireServer,
# Alibaba Cloud, Oracle Cloud. They hand out credentials to whoever asks from the host.
METADATA = frozenset(
    ipaddress.ip_address(text)
    for text in (
        "169.254.169.254",
        "169.254.170.2",
        "169.254.170.23",
        "fd00:ec2::254",
        "fd00:ec2::23",
        "168.63.129.16",
        "100.100.100.200",
        "192.0.0.192",
    )
)
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # RFC 6598, carrier-grade NAT
# Refused unless listed exactly; every other rule yields to any covering entry.
EXACT_ONLY = {"metadata": "a cloud metadata address", "link-local": "a link-local address"}
_LABELS = {"shared": "shared address space (CGNAT, 100.64.0.0/10)"}

_LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
# Legacy numeric IPv4 spellings (127.1, 0x7f.0.0.1, 2130706433) that resolvers map onto an
# address while the text does not parse as one: refused outright, whatever the allowlist.
_NUMERIC_HOST = re.compile(r"^(?:0x[0-9a-f]+|[0-9]+)(?:\.(?:0x[0-9a-f]*|[0-9]*))*\.?$", re.I)
_HOST_NAME = re.compile(r"^(?=.{1,253}$)[a-z0-9_](?:[a-z0-9_-]{0,62})(?:\.[a-z0-9_-]{1,63})*$")


class AddressRefused(PromptschedError):
    """A host or address promptsched will not connect to; the message names the rule."""

    def __init__(self, host: str, address: str, reason: str, message: str) -> None:
        super().__init__(message)
        self.host = host
        self.address = address
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Allowlist:
    """The non-public destinations one use may reach, and the variable that sets them (named
    in every refusal)."""

    variable: str = WEBHOOK_ALLOW
    networks: tuple[IPNetwork, ...] = ()
    hosts: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def parse(cls, text: str | Iterable[str], *, variable: str) -> Allowlist:
        """Entries separated by commas (or given as a list): an address, a CIDR or a host name.
        Raises ``ValueError`` naming the first malformed entry."""
        items = text.split(",") if isinstance(text, str) else list(text)
        networks: list[IPNetwork] = []
        hosts: set[str] = set()
        for raw in items:
            entry = str(raw).strip()
            if not entry:
                continue
            parsed = _parse_entry(entry)
            if isinstance(parsed, str):
                hosts.add(parsed)
            elif parsed not in networks:
                networks.append(parsed)
        return cls(variable, tuple(networks), frozenset(hosts))

    def union(self, other: Allowlist) -> Allowlist:
        extra = tuple(net for net in other.networks if net not in self.networks)
        return Allowlist(self.variable, self.networks + extra, self.hosts | other.hosts)

    def covering(self, address: IPAddress) -> IPNetwork | None:
        """The first entry whose range holds ``address``."""
        return next((net for net in self.networks if address in net), None)

    def lists_exactly(self, address: IPAddress) -> bool:
        return any(net.num_addresses == 1 and address in net for net in self.networks)

    def names(self, host: str) -> bool:
        return _canonical_name(host) in self.hosts

    def __str__(self) -> str:
        return ",".join([str(net) for net in self.networks] + sorted(self.hosts))


def _canonical_name(host: str) -> str:
    return host.strip().lower().rstrip(".")


def _parse_entry(entry: str) -> IPNetwork | str:
    text = entry[1:].replace("]", "", 1) if entry.startswith("[") else entry  # [v6] or [v6]/n
    if "%" in text:
        raise ValueError(f"{entry!r}: zone indexes (%) are not supported")
    try:
        return ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        if "has host bits set" in str(exc):
            wider = ipaddress.ip_network(text, strict=False)
            raise ValueError(f"{entry!r} has host bits set (did you mean {wider}?)") from None
    name = _canonical_name(text)
    if "/" in name or ":" in name or _NUMERIC_HOST.match(name):
        raise ValueError(f"{entry!r} is neither an IP address, a CIDR nor a host name") from None
    if not _HOST_NAME.match(name):
        raise ValueError(f"{entry!r} is not a host name (no wildcards; list each name)") from None
    return name


NO_WEBHOOK_ALLOW = Allowlist(WEBHOOK_ALLOW)
NO_TOOLS_ALLOW = Allowlist(TOOLS_ALLOW)
# What the deprecated PROMPTSCHED_ALLOW_PRIVATE_WEBHOOKS=true stands for: loopback and the
# private ranges, for webhooks only; never metadata, link-local, CGNAT or the agent tools.
LEGACY_PRIVATE = Allowlist.parse(
    "127.0.0.0/8,::1/128,10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,fc00::/7,localhost",
    variable=WEBHOOK_ALLOW,
)


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


def classify(address: IPAddress) -> str | None:
    """The rule a non-public address falls under (``"metadata"``, ``"loopback"``, ...), or
    None for a public one. Only the address itself, not what it may embed."""
    if address in METADATA:
        return "metadata"
    if address.is_unspecified:
        return "unspecified"
    if address.is_multicast:
        return "multicast"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address in _SHARED:
        return "shared"
    if address.is_private:
        return "private"
    if address.is_reserved:
        return "reserved"
    if not address.is_global:
        return "non-public"
    return None


def _passes(rule: str, address: IPAddress, allow: Allowlist, named: bool) -> bool:
    if rule in EXACT_ONLY:
        return allow.lists_exactly(address)
    return named or allow.covering(address) is not None


def refusal(address: IPAddress, allow: Allowlist, *, named: bool = False) -> str | None:
    """The rule that refuses ``address`` (checking an embedded IPv4 first), or None if it may
    be reached. ``named``: the host name that resolved to it is on the allowlist."""
    embedded = _embedded_v4(address)
    if embedded is not None:
        inner = refusal(embedded, allow, named=named)
        if inner is not None:
            return inner
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            return None  # a socket given ::ffff:a.b.c.d reaches a.b.c.d, and nothing else
    rule = classify(address)
    if rule is None or _passes(rule, address, allow, named):
        return None
    return rule


def explain(shown: IPAddress, rule: str, allow: Allowlist, context: str = "") -> str:
    """The refusal as a sentence naming the rule and what would allow the address."""
    if rule in EXACT_ONLY:
        exact = ipaddress.ip_network(shown)
        wider = allow.covering(shown)
        if wider is not None:
            return (
                f"{shown}{context} is {EXACT_ONLY[rule]}, which only an exact entry allows: "
                f"{allow.variable} covers it only with the wider range {wider}; "
                f"list {exact} itself to allow it"
            )
        return (
            f"{shown}{context} is {EXACT_ONLY[rule]}; "
            f"list it exactly ({exact}) in {allow.variable} to allow it"
        )
    return f"{shown}{context} is {_LABELS.get(rule, rule)} and not in {allow.variable}"


def parse_literal(host: str) -> IPAddress | None:
    """The address when ``host`` is an IP literal (``[v6]`` brackets allowed), else None."""
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def check_address(address: IPAddress, allow: Allowlist, *, host: str = "") -> None:
    """Raise ``AddressRefused`` naming the refused address (the embedded IPv4 one, if that
    is what is refused), the rule, and, when ``host`` is a name, that it resolves there."""
    is_name = bool(host) and parse_literal(host) is None
    named = is_name and allow.names(host)
    rule = refusal(address, allow, named=named)
    if rule is None:
        return
    shown, context = address, ""
    embedded = _embedded_v4(address)
    if embedded is not None and refusal(embedded, allow, named=named) == rule:
        shown, context = embedded, f" (embedded in {address})"
    if is_name:
        context += f" ({host} resolves to it)"
    raise AddressRefused(host, str(shown), rule, explain(shown, rule, allow, context))


def check_host(host: str, allow: Allowlist) -> None:
    """The checks possible without resolving: IP literals, local names, numeric tricks."""
    if not host:
        raise AddressRefused(host, host, "empty", "the URL has no host")
    literal = parse_literal(host)
    if literal is not None:
        check_address(literal, allow, host=host)
        return
    name = _canonical_name(host)
    if _NUMERIC_HOST.match(name):
        raise AddressRefused(
            host,
            host,
            "non-canonical numeric",
            f"{host} is a non-canonical numeric address; write it as a dotted IPv4 address",
        )
    local = name in _LOCAL_NAMES or name.endswith(".localhost")
    loopback = ipaddress.ip_address("127.0.0.1")
    if local and not allow.names(name) and allow.covering(loopback) is None:
        raise AddressRefused(
            host, host, "loopback", f"{host} is a loopback name and not in {allow.variable}"
        )


async def resolve(
    host: str, port: int, allow: Allowlist, *, family: int = socket.AF_UNSPEC
) -> list[tuple[int, str]]:
    """``(family, address)`` for every address of ``host``; refuses if any one is refused,
    since a name mixing public and private addresses is how rebinding attacks look."""
    check_host(host, allow)
    literal = parse_literal(host)
    if literal is not None:
        return [(socket.AF_INET if literal.version == 4 else socket.AF_INET6, str(literal))]
    infos = await anyio.getaddrinfo(host, port, family=family, type=socket.SOCK_STREAM)
    found: list[tuple[int, str]] = []
    for info_family, _type, _proto, _name, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        check_address(address, allow, host=host)
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

    def __init__(self, allow: Allowlist) -> None:
        self.allow = allow

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        addresses = await resolve(host, port, self.allow, family=family)
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


def guarded_session(allow: Allowlist, timeout: aiohttp.ClientTimeout) -> aiohttp.ClientSession:
    """A client session whose every connection goes to an address the guard checked: no DNS
    cache to outlive a check, and no proxy from the environment (``trust_env`` stays off).
    Callers check IP literals with ``check_host`` and follow no redirects."""
    connector = aiohttp.TCPConnector(
        resolver=GuardedResolver(allow), use_dns_cache=False, limit=100
    )
    return aiohttp.ClientSession(connector=connector, timeout=timeout)
