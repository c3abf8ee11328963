"""What the service's public edge decides for each request: whether it came over https (our own
socket, an https ``PROMPTSCHED_PUBLIC_URL``, or a trusted proxy's ``X-Forwarded-Proto``), which
client sent it (a trusted proxy's ``X-Forwarded-For``), and the headers every response carries
(``Server`` without versions, ``X-Content-Type-Options``, ``Strict-Transport-Security`` over
https). A forwarded header from a peer that is not a trusted proxy is never believed."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from aiohttp import web

from promptsched import netguard

SERVER = "promptsched"  # the Server header: no product or library versions
NOSNIFF = ("X-Content-Type-Options", "nosniff")
HSTS_MAX_AGE = 365 * 24 * 3600  # one year, without includeSubDomains (other hosts are not ours)
HSTS = ("Strict-Transport-Security", f"max-age={HSTS_MAX_AGE}")


@dataclass(frozen=True, slots=True)
class Edge:
    """``trusted_proxies``: the peers whose forwarded headers are believed;
    ``public_https``: the service is reached at an https public URL, whatever a request says."""

    trusted_proxies: tuple[netguard.IPNetwork, ...] = ()
    public_https: bool = False

    def trusts(self, address: netguard.IPAddress | None) -> bool:
        return address is not None and any(address in net for net in self.trusted_proxies)


EDGE: web.AppKey[Edge] = web.AppKey("edge", Edge)
_DEFAULT = Edge()


def of(request: web.BaseRequest) -> Edge:
    """The application's edge settings (the defaults for a request no application answers)."""
    return request.app.get(EDGE, _DEFAULT) if isinstance(request, web.Request) else _DEFAULT


def address(text: str | None) -> netguard.IPAddress | None:
    """An address as written in a peer name or a forwarded header (IPv4-mapped IPv6 as IPv4);
    None for anything else."""
    if not text:
        return None
    text = text.strip()
    if text.startswith("[") and "]" in text:  # [v6] or [v6]:port
        text = text[1 : text.index("]")]
    try:
        parsed = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        return parsed.ipv4_mapped
    return parsed


def _peer(request: web.BaseRequest) -> netguard.IPAddress | None:
    return address(request.remote)


def _values(request: web.BaseRequest, header: str) -> list[str]:
    """Every comma-separated value of every ``header`` line, in order."""
    return [part.strip() for line in request.headers.getall(header, ()) for part in line.split(",")]


def forwarded_https(request: web.BaseRequest, edge: Edge) -> bool:
    """A trusted proxy says the request came over https: the last ``X-Forwarded-Proto`` value
    (the nearest proxy's), only when the peer is one of the trusted proxies."""
    if not edge.trusted_proxies or not edge.trusts(_peer(request)):
        return False
    values = _values(request, "X-Forwarded-Proto")
    return bool(values) and values[-1].lower() == "https"


def is_https(request: web.BaseRequest) -> bool:
    """Whether the browser reached us over https (cookies are then ``Secure``)."""
    edge = of(request)
    return request.scheme == "https" or edge.public_https or forwarded_https(request, edge)


def client(request: web.BaseRequest) -> str:
    """The client's address: the peer, or behind trusted proxies the nearest address in
    ``X-Forwarded-For`` that is not a trusted proxy (everything further left could be forged).
    ``"unknown"`` when the peer has no address."""
    edge = of(request)
    found = _peer(request)
    if found is None:
        return "unknown"
    if edge.trusts(found):
        for text in reversed(_values(request, "X-Forwarded-For")):
            hop = address(text)
            if hop is None:
                break  # a malformed hop: believe nothing further left
            found = hop
            if not edge.trusts(hop):
                break
    return str(found)


async def headers(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """``on_response_prepare``: the headers every response of the application carries."""
    response.headers["Server"] = SERVER
    response.headers.setdefault(*NOSNIFF)
    if is_https(request):
        response.headers.setdefault(*HSTS)
