"""A guarded HTTP GET for the built-in tools: only addresses the network guard accepts under
the tools' own allowlist (``PROMPTSCHED_TOOLS_ALLOW``, checked again after DNS), redirects
followed by hand so every hop is checked, and the body read up to a size cap."""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
from yarl import URL

from promptsched import netguard
from promptsched.tools.base import ToolError

MAX_REDIRECTS = 5
USER_AGENT = "promptsched (read-only agent tool)"


@dataclass(frozen=True, slots=True)
class Fetched:
    url: str  # the final URL, after redirects
    status: int
    content_type: str
    charset: str | None
    body: bytes
    truncated: bool  # the body was longer than the cap; the rest was not read

    def text(self) -> str:
        return self.body.decode(self.charset or "utf-8", "replace")


class Fetcher:
    """One aiohttp session (opened on first use) whose resolver only returns checked
    addresses; ``aclose`` closes it."""

    def __init__(
        self,
        *,
        allow: netguard.Allowlist,
        max_bytes: int,
        timeout: float,
        connect_timeout: float = 10,
    ) -> None:
        self.allow = allow
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.connect_timeout = min(connect_timeout, timeout)
        self._http: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            timeout = aiohttp.ClientTimeout(total=self.timeout, sock_connect=self.connect_timeout)
            self._http = netguard.guarded_session(self.allow, timeout)
        return self._http

    def check(self, url: str) -> URL:
        """The parsed URL if it is http(s) to an acceptable host, else ``ToolError``."""
        try:
            parsed = URL(url)
        except (ValueError, TypeError):
            raise ToolError(f"not a URL: {url[:200]!r}") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ToolError(f"only http and https URLs can be fetched, not {url[:200]!r}")
        if parsed.user or parsed.password:
            raise ToolError("URLs with credentials are not fetched")
        try:
            netguard.check_host(parsed.host, self.allow)
        except netguard.AddressRefused as exc:
            raise ToolError(f"{url[:200]}: {exc}") from None
        return parsed

    async def get(self, url: str, *, accept: str = "*/*") -> Fetched:
        current = self.check(url)
        headers = {"User-Agent": USER_AGENT, "Accept": accept}
        try:
            for _ in range(MAX_REDIRECTS + 1):
                async with self._session().get(
                    current, headers=headers, allow_redirects=False
                ) as response:
                    location = response.headers.get("Location")
                    if 300 <= response.status < 400 and location:
                        current = self.check(str(current.join(URL(location))))
                        continue
                    if response.status >= 400:
                        raise ToolError(f"{current}: HTTP {response.status} {response.reason}")
                    body, truncated = await self._read(response)
                    return Fetched(
                        str(current),
                        response.status,
                        response.content_type,
                        response.charset,
                        body,
                        truncated,
                    )
        except netguard.AddressRefused as exc:  # from the resolver, after DNS
            raise ToolError(f"{current}: {exc}") from None
        except TimeoutError:
            raise ToolError(f"{current}: timed out after {self.timeout:g}s") from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise ToolError(f"{current}: {type(exc).__name__}: {exc}") from None
        raise ToolError(f"{url[:200]}: more than {MAX_REDIRECTS} redirects")

    async def _read(self, response: aiohttp.ClientResponse) -> tuple[bytes, bool]:
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_chunked(64 * 1024):
            chunks.append(chunk)
            size += len(chunk)
            if size > self.max_bytes:
                return b"".join(chunks)[: self.max_bytes], True
        return b"".join(chunks), False

    async def aclose(self) -> None:
        if self._http is not None:
            http, self._http = self._http, None
            await http.close()
