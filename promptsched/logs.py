"""structlog setup: JSON lines (or console rendering on a terminal) on stderr."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import structlog

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


# The lowest level a library's line is written at (asyncpg, aiohttp, markdown-it, mcp, httpx...).
LIBRARY_FLOOR = logging.INFO


# A bearer token, or anything shaped like one of ours, wherever it appears in a line (a
# library's message or traceback quoting a request): the last step before a line is written.
_SECRET = re.compile(r"(?i)(bearer\s+|pst_)[A-Za-z0-9._~+/=-]+")


def redact(line: str) -> str:
    return _SECRET.sub(r"\1[redacted]", line)


def _redact(logger: Any, method: str, line: Any) -> Any:
    return redact(line) if isinstance(line, str) else line


# The level ``configure`` set (structlog writes every level until then).
_threshold = logging.DEBUG


def enabled(level: str) -> bool:
    """Whether a line at ``level`` is written: a hot path checks before it builds one."""
    return _LEVELS[level] >= _threshold


def configure(level: str = "info", fmt: str = "json") -> None:
    global _threshold
    _threshold = _LEVELS[level]
    renderer: Any
    if fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    else:
        renderer = structlog.processors.JSONRenderer()
    # Structured tracebacks without frame locals: a local may hold a secret (an API key).
    tracebacks: Any = _keep
    if fmt == "json":
        tracebacks = structlog.processors.ExceptionRenderer(
            structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
        )
    timestamper = structlog.processors.TimeStamper(fmt="iso", utc=True)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            timestamper,
            tracebacks if fmt == "json" else structlog.dev.set_exc_info,
            renderer,
            _redact,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    # Libraries (asyncpg, aiohttp) log through the standard library: render their lines the
    # same way, so every line on stderr parses as JSON in production.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.contextvars.merge_contextvars,
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                timestamper,
            ],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                tracebacks,
                renderer,
                _redact,
            ],
        )
    )
    # Only libraries log through the standard library (promptsched's own lines are structlog's),
    # and never at debug, whatever our level: markdown-it's internals alone are hundreds of
    # thousands of lines for a few large outputs. The handler's own level also holds back a
    # library that sets its logger to debug itself.
    libraries = max(_LEVELS[level], LIBRARY_FLOOR)
    handler.setLevel(libraries)
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(libraries)


@contextmanager
def configured(level: str, fmt: str) -> Iterator[None]:
    """``configure`` for a block, then the logging as it was: a command run inside a process
    that has its own (a test calling ``cli.main``) leaves it unchanged."""
    global _threshold
    root = logging.getLogger()
    saved = (structlog.get_config(), _threshold, list(root.handlers), root.level)
    configure(level, fmt)
    try:
        yield
    finally:
        structlog.configure(**saved[0])
        _threshold, root.handlers = saved[1], saved[2]
        root.setLevel(saved[3])


def _keep(logger: Any, method: str, event: Any) -> Any:
    return event


def get(name: str) -> structlog.stdlib.BoundLogger:
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name)
    return logger
