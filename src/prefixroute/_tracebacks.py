"""Tracebacks of our own bugs, at most one per kind this often (:class:`TracebackLimiter`), and
warnings that a peer can repeat at will, likewise (:class:`WarningLimiter`)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

TRACEBACK_EVERY_S = 10.0  # at most one traceback per (exception type, place) this often, s
_LIMITER_KEYS = 1024  # places remembered; past this the table starts over (bounded memory)


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
        self.every_s = every_s  # seconds between two tracebacks of one kind
        self.clock = clock
        # (type, file, line) -> (when its last traceback was logged, s; how many since, not shown)
        self._seen: dict[tuple[type[BaseException], str, int], tuple[float, int]] = {}

    def exception(self, exc: BaseException, msg: str, *args: object) -> None:
        """``logger.exception(msg, *args)`` for ``exc``, unless one like it was logged lately."""
        key = (type(exc), *_place(exc))
        now = self.clock()
        logged_at, suppressed = self._seen.get(key, (-math.inf, 0))
        if now - logged_at < self.every_s:
            self._seen[key] = (logged_at, suppressed + 1)
            return
        if len(self._seen) >= _LIMITER_KEYS:
            self._seen.clear()
        self._seen[key] = (now, 0)
        if suppressed:
            msg += f" ({suppressed} more like it since the last one, not shown)"
        self.logger.error(msg, *args, exc_info=exc)


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
        self.logger, self.every_s, self.clock = logger, every_s, clock
        self._said: dict[str, tuple[float, int]] = {}  # kind -> (last logged, s; held since)

    def warning(self, kind: str, msg: str, *args: object) -> None:
        """``logger.warning(msg, *args)``, unless a warning of ``kind`` was logged lately."""
        now = self.clock()
        said_at, held = self._said.get(kind, (-math.inf, 0))
        if now - said_at < self.every_s:
            self._said[kind] = (said_at, held + 1)
            return
        if len(self._said) >= _LIMITER_KEYS:
            self._said.clear()
        self._said[kind] = (now, 0)
        if held:
            msg += f" ({held} more like it since the last one, not shown)"
        self.logger.warning(msg, *args)


def _place(exc: BaseException) -> tuple[str, int]:
    """Where ``exc`` was raised: the innermost frame's file and line."""
    tb = exc.__traceback__
    if tb is None:
        return "", 0
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename, tb.tb_lineno
