"""Tracebacks of our own bugs, at most one per kind this often (:class:`TracebackLimiter`), and
warnings that a peer can repeat at will, likewise (:class:`WarningLimiter`)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Hashable

TRACEBACK_EVERY_S = 10.0  # at most one traceback per (exception type, place) this often, s
_LIMITER_KEYS = 1024  # places remembered; past this the table starts over (bounded memory)


class _Repeats:
    """Which repeats of a message of one key may be logged: at most one per ``every_s``; the
    ones between are counted, and the count goes with the next one logged."""

    def __init__(self, every_s: float, clock: Callable[[], float]) -> None:
        self.every_s = every_s  # seconds between two messages of one key
        self.clock = clock
        self._seen: dict[Hashable, tuple[float, int]] = {}  # key -> (last logged, s; held since)

    def due(self, key: Hashable) -> int | None:
        """None: hold this one back (counted); else log it, this many having been held."""
        now = self.clock()
        logged_at, held = self._seen.get(key, (-math.inf, 0))
        if now - logged_at < self.every_s:
            self._seen[key] = (logged_at, held + 1)
            return None
        if len(self._seen) >= _LIMITER_KEYS:
            self._seen.clear()
        self._seen[key] = (now, 0)
        return held


def _with_held(msg: str, held: int) -> str:
    return msg + f" ({held} more like it since the last one, not shown)" if held else msg


class TracebackLimiter:
    """Logs an unexpected error's traceback at most once per ``every_s`` per (type, place).

    A bug that a client can trigger at will would otherwise write a multi-KB traceback per
    request. The first one is logged whole; the same type raised at the same line within
    ``every_s`` is only counted, and the count rides on the next traceback logged for it.
    """

    def __init__(
        self,
        logger: logging.Logger,
        every_s: float = TRACEBACK_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self._repeats = _Repeats(every_s, clock)  # keyed by (type, file, line)

    def exception(self, exc: BaseException, msg: str, *args: object) -> None:
        """``logger.exception(msg, *args)`` for ``exc``, unless one like it was logged lately."""
        held = self._repeats.due((type(exc), *_place(exc)))
        if held is not None:
            self.logger.error(_with_held(msg, held), *args, exc_info=exc)


class WarningLimiter:
    """Logs a warning at most once per ``every_s`` per kind; the ones between are counted, and
    the count rides on the next one logged. For what a peer can send at will: 3,000 bad
    messages to a KV-event address wrote 3,000 lines (an outside audit, 2026-12-07); the
    metrics count every one."""

    def __init__(
        self,
        logger: logging.Logger,
        every_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self._repeats = _Repeats(every_s, clock)  # keyed by kind

    def warning(self, kind: str, msg: str, *args: object) -> None:
        """``logger.warning(msg, *args)``, unless a warning of ``kind`` was logged lately."""
        held = self._repeats.due(kind)
        if held is not None:
            self.logger.warning(_with_held(msg, held), *args)


def _place(exc: BaseException) -> tuple[str, int]:
    """Where ``exc`` was raised: the innermost frame's file and line."""
    tb = exc.__traceback__
    if tb is None:
        return "", 0
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename, tb.tb_lineno
