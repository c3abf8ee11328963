"""An answer checked against an ``output_schema`` that holds regular expressions (``pattern``,
``patternProperties``), in a process of its own, so a pattern that backtracks for hours on an
answer (``^(a+)+$`` on thirty ``a`` and a ``!``) never holds the service's event loop.

Python's ``re`` runs a pattern without a time limit, holding the GIL, and jsonschema offers no
public way to give it another engine; an engine that cannot backtrack (RE2's kind) would also
refuse lookarounds and backreferences that ``re`` accepts when the schema is saved. So the check
runs unchanged, with the same jsonschema and ``re``, in one long-lived child per service process:
a fresh interpreter (``python -m promptsched.monitor.patterns``, like multiprocessing's "spawn"
and unlike a fork of a process with threads and sockets), started the first time a schema with
patterns is checked, which imports only this check. A schema without patterns is checked in the
service as before (the hot path pays one cached look-up).

The child gives one answer's check ``DEADLINE`` seconds: a timer signal then stops ``re``
mid-match (``re`` looks at signals as it backtracks), and the child answers which keyword was
running; it is ready for the next check at once. Should it not answer within ``DEADLINE +
GRACE`` (stopped, or stuck where no signal is seen), it is killed and the next check starts a
new one. Either way the attempt ends for good, naming the pattern to simplify. The event loop
only waits, in a worker thread, for a line on a pipe. ``close()`` ends the child (the
supervisor calls it when it stops, and at exit); a child whose parent died ends when its input
closes.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from typing import IO, Any, cast

import anyio
import anyio.to_thread
from anyio.lowlevel import RunVar
from jsonschema import validators as jsonschema_validators

from promptsched.monitor import schema as output_schema

DEADLINE = 0.5  # seconds of the child's time for one answer's check
GRACE = 2.0  # further seconds before a child that has not answered is killed
START = 30.0  # seconds for a new child to say it is ready
_READY = b"ready\n"
# The keywords that run a schema's regular expressions on the answer, and where the expressions
# they run are, relative to the schema object that holds the keyword.
_RUNS = {
    "pattern": "pattern",
    "patternProperties": "patternProperties",
    "additionalProperties": "patternProperties",
    "unevaluatedProperties": "unevaluatedProperties",
}


class TooSlow(Exception):
    """The schema's patterns took longer than the deadline on this answer (the schema's fault:
    the attempt ends for good)."""

    def __init__(self, where: str | None, seconds: float) -> None:
        what = f"the pattern at {where}" if where else "its patterns"
        super().__init__(
            f"the output_schema's patterns took longer than {seconds:g} s on this answer: "
            f"simplify {what} (a pattern that can match one text in many ways, such as "
            "(a+)+, backtracks for hours on a long answer)"
        )


class Unavailable(Exception):
    """The checking process could not be started or ended unexpectedly (not the schema's fault:
    another attempt can help)."""


# ---- the parent: one child per process, reached from a worker thread --------------------------


class _Child:
    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0
        self._lock = threading.Lock()

    def check(self, text: str, data: Any) -> dict[str, Any]:
        """The child's reply for one answer (blocking: run in a worker thread)."""
        with self._lock:
            proc = self.proc if self.proc is not None and self.proc.poll() is None else None
            if proc is None:
                proc = self._start()
            payload = json.dumps([text, data], separators=(",", ":")).encode() + b"\n"
            try:
                line = _exchange(proc, payload, DEADLINE + GRACE)
            except OSError as exc:
                self._end(proc)
                raise Unavailable(f"the process checking patterns ended ({exc})") from None
            if line is None:  # no answer in time: stuck, or stopped
                self._end(proc)
                return {"slow": None, "seconds": DEADLINE + GRACE}
            reply: dict[str, Any] = json.loads(line)
            return reply

    def _start(self) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", __name__, repr(DEADLINE)]
        # A session of its own: a terminal's Ctrl-C is for the service, which ends the child.
        proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
        )
        self.proc = proc  # from here on, close() ends it
        self.started += 1
        if self.started == 1:
            atexit.register(close)
        try:
            ready = _exchange(proc, b"", START)
        except OSError:
            ready = None
        if ready != _READY.strip():
            self._end(proc)
            raise Unavailable("the process checking patterns did not start")
        return proc

    def end(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._end(proc)

    def _end(self, proc: subprocess.Popen[bytes]) -> None:
        if self.proc is proc:
            self.proc = None
        _kill(proc)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


def _exchange(proc: subprocess.Popen[bytes], payload: bytes, seconds: float) -> bytes | None:
    """Write ``payload`` to the child and read its reply line within ``seconds`` (None when
    the time ran out). Raises OSError when the child is gone."""
    stdin, stdout = cast(IO[bytes], proc.stdin), cast(IO[bytes], proc.stdout)
    deadline = time.monotonic() + seconds
    os.set_blocking(stdin.fileno(), False)
    view = memoryview(payload)
    while view:
        if not _wait(stdin.fileno(), deadline, write=True):
            return None
        view = view[os.write(stdin.fileno(), view) :]
    reply = b""
    while not reply.endswith(b"\n"):
        if not _wait(stdout.fileno(), deadline, write=False):
            return None
        chunk = os.read(stdout.fileno(), 65536)
        if not chunk:
            raise OSError("its output closed")
        reply += chunk
    return reply.strip()


def _wait(fd: int, deadline: float, *, write: bool) -> bool:
    left = deadline - time.monotonic()
    if left <= 0:
        return False
    readable, writable, _ = select.select([] if write else [fd], [fd] if write else [], [], left)
    return bool(readable or writable)


_CHILD = _Child()
# One check at a time per event loop waits in a thread; the others wait their turn holding none.
_TURN = RunVar[anyio.CapacityLimiter]("promptsched_pattern_checks")


def _limiter() -> anyio.CapacityLimiter:
    try:
        return _TURN.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(1)
        _TURN.set(limiter)
        return limiter


async def problem(schema: Mapping[str, Any], data: Any) -> str | None:
    """Why ``data`` does not match ``schema``, or None when it does (``schema.problem``); a
    schema with patterns is checked in the child. Raises ``TooSlow`` past the deadline and
    ``Unavailable`` when the child cannot check."""
    text = output_schema.key(schema)
    if not output_schema.has_patterns(text):
        return output_schema.explain(output_schema.validator(text), data)
    ask = functools.partial(_CHILD.check, text, data)
    reply = await anyio.to_thread.run_sync(ask, abandon_on_cancel=True, limiter=_limiter())
    if "slow" in reply:
        raise TooSlow(reply["slow"], reply.get("seconds", DEADLINE))
    if "error" in reply:
        raise Unavailable(f"checking the answer failed in the other process: {reply['error']}")
    found: str | None = reply["problem"]
    return found


def started() -> int:
    """How many checking processes this process has started."""
    return _CHILD.started


def child_pid() -> int | None:
    """The checking process's id, while there is one."""
    proc = _CHILD.proc
    return proc.pid if proc is not None and proc.poll() is None else None


def close() -> None:
    """End the checking process, if any: a check waiting on it sees its output close at once
    (and fails as Unavailable), then lets go of the child for it to be reaped here."""
    proc = _CHILD.proc
    if proc is None:
        return
    proc.kill()
    _CHILD.end(proc)


# ---- the child ----------------------------------------------------------------------------------


class _Slow(BaseException):
    """Raised by the timer signal in the middle of a match."""


_running: list[str] = []  # the keywords running now, as the pointers of their regexes


def _on_timer(signum: int, frame: Any) -> None:
    raise _Slow(_running[-1] if _running else None)


def _traced(keyword: str, inner: Any, places: dict[int, str]) -> Any:
    def run(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
        depth = len(_running)
        _running.append(f"{places.get(id(schema), '')}/{_RUNS[keyword]}")
        try:
            yield from inner(validator, value, instance, schema)
        finally:  # also when a generator left unfinished (``is_valid``) is closed later
            del _running[depth:]

    return run


def _places(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[int, str]]:
    if isinstance(value, dict):
        yield id(value), output_schema.pointer(path)
        for key, item in value.items():
            yield from _places(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _places(item, (*path, index))


@functools.lru_cache(maxsize=256)
def _validator(text: str) -> Any:
    """A validator of the schema's dialect whose regex-running keywords note where they are
    (jsonschema's public ``validators.extend``, delegating to the dialect's own keywords)."""
    schema = json.loads(text)
    cls = output_schema.validator_class(schema)
    places = dict(_places(schema))
    wrapped = {k: _traced(k, cls.VALIDATORS[k], places) for k in _RUNS if k in cls.VALIDATORS}
    return jsonschema_validators.extend(cls, wrapped)(schema)


def _check(text: str, data: Any, seconds: float) -> dict[str, Any]:
    try:
        validator = _validator(text)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return {"problem": output_schema.explain(validator, data)}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Slow as slow:
        return {"slow": slow.args[0], "seconds": seconds}
    except Exception as exc:  # e.g. RecursionError on a deep answer: said, and the child goes on
        return {"error": type(exc).__name__}


def serve(seconds: float) -> None:
    """The child: read ``[schema text, answer]`` lines, write one reply line each, until the
    input closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGALRM, _on_timer)
    out = sys.stdout.buffer
    out.write(_READY)
    out.flush()
    for line in sys.stdin.buffer:
        text, data = json.loads(line)
        out.write(json.dumps(_check(text, data, seconds)).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    serve(float(sys.argv[1]))
