"""A stand-in for an LLM provider for W9: an OpenAI-compatible chat-completions server that
answers every request after a fixed latency, and counts the calls it got.

    python -m bench.llm_server --port 18230 --latency 2.0

``POST /v1/chat/completions`` answers after ``--latency`` seconds with a ``chat.completion``
body (``choices[0].message.content``, ``usage``). The last user message's text after
``W9 job `` is the call's key: a key seen twice is a duplicate call. ``GET /stats`` says
``requests``, ``duplicates``, ``keys``, ``inflight``, ``max_inflight``; ``POST /reset`` zeroes
them. Plain asyncio (a protocol per connection, one timer per request, no task per request) so
that the server stays far from being what limits the calls: it runs in a process of its own,
beside the one it serves. HTTP/1.1 keep-alive with ``Content-Length`` bodies only (what aiohttp
sends), answers in request order per connection.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import signal
import time
from collections import deque
from typing import Any

MARK = "W9 job "


class Counts:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.requests = 0
        self.inflight = 0
        self.max_inflight = 0
        self.keys: set[str] = set()
        self.duplicates = 0

    def as_json(self) -> bytes:
        return json.dumps(
            {
                "requests": self.requests,
                "duplicates": self.duplicates,
                "keys": len(self.keys),
                "inflight": self.inflight,
                "max_inflight": self.max_inflight,
            }
        ).encode()


COUNTS = Counts()
LATENCY = [2.0]


def _response(body: bytes) -> bytes:
    head = (
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: keep-alive\r\n\r\n"
    )
    return head.encode() + body


def _completion(key: str, model: str) -> bytes:
    return json.dumps(
        {
            "id": f"chatcmpl-{key}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": f"ok {key}"},
                }
            ],
            "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
        },
        separators=(",", ":"),
    ).encode()


def _key(body: bytes) -> tuple[str, str]:
    request: dict[str, Any] = json.loads(body)
    text = str(request["messages"][-1].get("content", ""))
    start = text.find(MARK)
    key = text[start + len(MARK) :].split()[0] if start >= 0 else ""
    return key, str(request.get("model") or "model")


class Http(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.queue: deque[list[Any]] = deque()  # [answer or None, counts as in flight]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        for entry in self.queue:
            if entry[1]:
                COUNTS.inflight -= 1
        self.queue.clear()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            body = bytes(self.buffer[end + 4 : end + 4 + length])
            del self.buffer[: end + 4 + length]
            self._request(lines[0].split(" ")[:2], body)

    def _request(self, line: list[str], body: bytes) -> None:
        method, path = (line + ["", ""])[:2]
        if method == "POST" and path.endswith("/chat/completions"):
            key, model = _key(body)
            COUNTS.requests += 1
            COUNTS.inflight += 1
            COUNTS.max_inflight = max(COUNTS.max_inflight, COUNTS.inflight)
            if key in COUNTS.keys:
                COUNTS.duplicates += 1
            COUNTS.keys.add(key)
            entry: list[Any] = [None, True]
            self.queue.append(entry)
            answer = _response(_completion(key, model))
            asyncio.get_running_loop().call_later(LATENCY[0], self._answer, entry, answer)
            return
        if method == "POST" and path == "/reset":
            COUNTS.reset()
        self.queue.append([_response(COUNTS.as_json()), False])
        self._flush()

    def _answer(self, entry: list[Any], answer: bytes) -> None:
        if entry[1] and self.transport is not None:
            entry[1] = False
            COUNTS.inflight -= 1
            entry[0] = answer
            self._flush()

    def _flush(self) -> None:
        while self.queue and self.queue[0][0] is not None and self.transport is not None:
            self.transport.write(self.queue.popleft()[0])


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Http, "127.0.0.1", port, backlog=8192, reuse_address=True)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print("ready", flush=True)
    async with server:
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=2.0)
    args = parser.parse_args()
    LATENCY[0] = args.latency
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(serve(args.port))


if __name__ == "__main__":
    main()
