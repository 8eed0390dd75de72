"""Admission limits: the request body size and the gateway's total in-flight cap.

The per-replica cap is not here: it is checked against the router's own load accounting when
candidates are chosen (``ReplicaRegistry.candidates``), so there is one in-flight count per
replica, not two. This counter is the gateway's own admission control: it counts requests from
the moment they are accepted, before any routing decision.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web

from prefixroute.gateway._errors import (
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

    @contextmanager
    def admit(self) -> Iterator[None]:
        """Hold one in-flight slot for the ``with`` body; TooManyRequests when full."""
        if self.draining:
            raise ShuttingDown("the gateway is shutting down")
        if self.in_flight >= self.max_in_flight:
            raise TooManyRequests("the gateway is at its in-flight limit; retry later")
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

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
        except TimeoutError as exc:  # aiohttp closes the connection after the 408 (body unread)
            raise RequestTimeout(
                f"the request body did not arrive within {self.body_timeout_s:g} s"
            ) from exc
        except web.HTTPRequestEntityTooLarge as exc:
            raise PayloadTooLarge(
                f"the request body exceeds the limit of {self.max_body_bytes} bytes"
            ) from exc
