"""Admission limits: the request body size and the gateway's total in-flight cap.

The per-replica cap is not here: it is checked against the router's own load accounting when
candidates are chosen (``ReplicaRegistry.candidates``), so there is one in-flight count per
replica, not two. This counter is the gateway's own admission control: it counts requests from
the moment they are accepted, before any routing decision.

Shutdown reads it too: ``draining`` refuses new requests (503), :meth:`Limits.wait_idle` waits
for the admitted ones, and :meth:`Limits.cut` cancels those still running at the drain bound.
Each admitted request's handler task is tracked for that; the handler ends its answer itself
(``cutting`` tells it why it was cancelled).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web

from prefixroute.gateway._errors import (
    MalformedBody,
    PayloadTooLarge,
    RequestTimeout,
    ShuttingDown,
    TooManyRequests,
)


class Limits:
    def __init__(
        self, max_in_flight: int, max_body_bytes: int, body_timeout_s: float | None = None
    ) -> None:
        self.max_in_flight = max_in_flight  # requests
        self.max_body_bytes = max_body_bytes  # bytes
        self.body_timeout_s = body_timeout_s  # longest time to receive a body, s; None: no limit
        self.in_flight = 0  # requests admitted and not finished
        self.draining = False  # shutting down: refuse new requests
        # The drain bound has passed: admitted handlers are being cancelled. The proxy reads it
        # to end a cut stream with an SSE error event, and a cut plain request with a 503.
        self.cutting = False
        self._tasks: set[asyncio.Task[Any]] = set()  # handler tasks of the admitted requests
        self._idle = asyncio.Event()  # set while nothing is admitted
        self._idle.set()

    @contextmanager
    def admit(self) -> Iterator[None]:
        """Hold one in-flight slot for the ``with`` body; TooManyRequests when full,
        ShuttingDown once draining."""
        if self.draining:
            raise ShuttingDown("the gateway is shutting down; retry on another instance")
        if self.in_flight >= self.max_in_flight:
            raise TooManyRequests("the gateway is at its in-flight limit; retry later")
        task = asyncio.current_task()
        self.in_flight += 1
        self._idle.clear()
        if task is not None:
            self._tasks.add(task)
        try:
            yield
        finally:
            self.in_flight -= 1
            if task is not None:
                self._tasks.discard(task)
            if self.in_flight == 0:
                self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is admitted, up to ``timeout_s``; True if none is left."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def cut(self) -> int:
        """Set ``cutting`` and cancel every admitted request's handler; how many were cut."""
        self.cutting = True
        tasks = [task for task in self._tasks if not task.done()]
        for task in tasks:
            task.cancel()
        return len(tasks)

    async def wait_cut(self, timeout_s: float) -> None:
        """Give the cut handlers up to ``timeout_s`` to write their endings and finish."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)

    async def read_body(self, request: web.Request) -> bytes:
        """The whole request body; PayloadTooLarge past the limit (checked before reading),
        RequestTimeout when it takes longer than ``body_timeout_s`` (a slow client would
        otherwise hold its in-flight slot forever)."""
        length = request.content_length
        if length is not None and length > self.max_body_bytes:
            raise PayloadTooLarge(
                f"the request body is {length} bytes; the limit is {self.max_body_bytes}"
            )
        try:
            async with asyncio.timeout(self.body_timeout_s):
                return await request.read()
        except web.RequestPayloadError as exc:  # bad chunked encoding, a short body: the client's
            raise MalformedBody(
                "the request body is malformed (length, chunked or content encoding)"
            ) from exc
        except TimeoutError as exc:  # aiohttp closes the connection after the 408 (body unread)
            raise RequestTimeout(
                f"the request body did not arrive within {self.body_timeout_s:g} s"
            ) from exc
        except web.HTTPRequestEntityTooLarge as exc:
            raise PayloadTooLarge(
                f"the request body exceeds the limit of {self.max_body_bytes} bytes"
            ) from exc
