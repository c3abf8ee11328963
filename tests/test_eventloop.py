"""The service's event loop (promptsched/eventloop.py): one turn takes on at most
READY_PER_TURN ready sockets, and the ones held back come first in the next turns, so every
ready socket is served within a few turns and timers run in between."""

from __future__ import annotations

import asyncio
import selectors
import socket

import pytest

from promptsched import eventloop

pytestmark = pytest.mark.skipif(
    not hasattr(selectors, "EpollSelector"), reason="the bound needs epoll"
)


def test_a_turn_takes_on_at_most_its_share_of_ready_sockets_and_none_is_left_behind() -> None:
    selector = eventloop.BoundedEpollSelector()
    pairs = [socket.socketpair() for _ in range(3 * eventloop.READY_PER_TURN + 5)]
    try:
        for reader, writer in pairs:
            reader.setblocking(False)
            selector.register(reader, selectors.EVENT_READ)
            writer.send(b"x")  # every socket is ready at once
        served: set[int] = set()
        turns = 0
        while len(served) < len(pairs):
            ready = selector.select(0)
            assert 0 < len(ready) <= eventloop.READY_PER_TURN
            for key, _events in ready:
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                sock.recv(1)  # served: no longer ready
                served.add(sock.fileno())
            turns += 1
        assert turns == 4  # 3 full turns and the 5 left over, none twice
        assert selector.select(0) == []
    finally:
        selector.close()
        for reader, writer in pairs:
            reader.close()
            writer.close()


def test_timers_run_between_turns_of_many_ready_sockets() -> None:
    """A timer due while hundreds of sockets are ready runs after one bounded turn, not after
    a turn that took on all of them (each callback here stands for an answer's handling)."""
    loop = eventloop.new_event_loop()
    pairs = [socket.socketpair() for _ in range(4 * eventloop.READY_PER_TURN)]
    handled: list[int] = []
    fired_after: list[int] = []
    everything = asyncio.Event()

    def on_ready(reader: socket.socket) -> None:
        reader.recv(1)
        loop.remove_reader(reader)
        handled.append(reader.fileno())
        if len(handled) == len(pairs):
            everything.set()

    try:
        for reader, writer in pairs:
            reader.setblocking(False)
            loop.add_reader(reader, on_ready, reader)
            writer.send(b"x")
        loop.call_soon(lambda: loop.call_soon(lambda: fired_after.append(len(handled))))

        loop.run_until_complete(asyncio.wait_for(everything.wait(), 10))
    finally:
        loop.close()
        for reader, writer in pairs:
            reader.close()
            writer.close()
    assert fired_after and fired_after[0] <= 2 * eventloop.READY_PER_TURN
