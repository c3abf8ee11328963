"""A TCP proxy in front of Postgres's unix socket, so the chaos suite can cut every live
database connection at once (``cut_all``) the way a flaky network or a failover would, or stall
them all (``stall``/``resume``) the way a partition that drops packets does."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field


@dataclass(eq=False)
class _Pair:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter

    def abort(self) -> None:
        for writer in (self.client, self.upstream):
            writer.transport.abort()


@dataclass
class TcpProxy:
    """Listens on ``host:port`` (0 picks a free port) and forwards each connection to the
    unix socket ``upstream``. A connection that cannot reach the upstream is closed at once,
    like a refused connection."""

    upstream: str
    host: str = "127.0.0.1"
    port: int = 0
    accepted: int = 0
    refused: int = 0
    cuts: int = 0
    cut_connections: int = 0
    _pairs: set[_Pair] = field(default_factory=set)
    _server: asyncio.Server | None = None
    _flowing: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> TcpProxy:
        self._flowing.set()
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def dsn(self, database: str) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/{database}"

    @property
    def live(self) -> int:
        return len(self._pairs)

    def cut_all(self) -> int:
        """Drop every live connection in both directions; returns how many were cut."""
        pairs, self._pairs = list(self._pairs), set()
        for pair in pairs:
            pair.abort()
        self.cuts += 1
        self.cut_connections += len(pairs)
        return len(pairs)

    def stall(self) -> None:
        """Stop forwarding: bytes and new connections wait (nothing is refused or closed)."""
        self._flowing.clear()

    def resume(self) -> None:
        """Deliver what waited, as a healed partition would."""
        self._flowing.set()

    async def close(self) -> None:
        self._flowing.set()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        self.cut_all()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._flowing.wait()
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self.upstream)
        except OSError:
            self.refused += 1
            writer.transport.abort()
            return
        self.accepted += 1
        pair = _Pair(writer, up_writer)
        self._pairs.add(pair)
        tasks = [
            asyncio.create_task(self._pump(reader, up_writer, pair)),
            asyncio.create_task(self._pump(up_reader, writer, pair)),
        ]
        self._tasks.update(tasks)
        try:
            await asyncio.gather(*tasks)
        finally:
            self._tasks.difference_update(tasks)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pair: _Pair
    ) -> None:
        try:
            while data := await reader.read(65536):
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            # One side ended: end the other, so neither end waits on a half-open connection.
            self._pairs.discard(pair)
            pair.abort()
