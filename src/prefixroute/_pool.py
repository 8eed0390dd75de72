"""Keep-alive connections to model servers (the gateway's to its replicas, the load generator's
to its target): a pool, and the resend that a request on a connection the server closed gets.

A replica's HTTP server closes a connection that stays idle past its keep-alive timeout: 5 s
for vLLM (``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``) and SGLang, both on uvicorn. A request written on a
pooled connection just as the replica closes it fails at once, before any answer: the replica
never read it. aiohttp resends such requests only for idempotent methods, and every inference
call is a POST; so without more, one request in eight was answered 502 when requests came at
about the replica's keep-alive interval (2026-12-01), and each such failure counted against a
healthy replica. Two measures, as HTTP clients that pool connections take (hyper's
``retry_canceled_requests``; Envoy's guidance to keep its upstream idle timeout below the
server's):

* the pool closes its own idle connections first (``idle_timeout_s``, 4 s by default: below the
  engines' 5 s);
* a request whose *reused* connection is found closed or reset before any response byte, within
  ``STALE_WITHIN_S`` of the send, is sent again to the same replica, on another connection (at
  most twice). That is not a failure of the replica, and it is counted apart (``on_resend``).
  A failure on a new connection, or a later one, is the replica's, as before.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import aiohttp

# What a closed pooled connection raises before the response starts: the server's FIN
# (disconnected) or its RST (a reset, an OSError). A refused connect is a new connection's.
_CLOSED = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
# Resends on stale pooled connections before a failure counts: each stale connection is dropped
# as it fails, and two closing at the same instant are already rare.
RESENDS = 2
# A stale connection fails as soon as the request is written (the close was already on its
# way). One that fails later was read and worked on: a replica that crashed, or one that drops
# this request; that is a failure to judge, and sending it there again could repeat a long
# prefill, so only failures this soon after the send are resent.
STALE_WITHIN_S = 1.0
# Whether the connection of the request being sent in this task came from the pool: set by
# _Pool.connect, which runs in the sending task (a request's connect is awaited, not spawned).
_reused: ContextVar[bool] = ContextVar("prefixroute_pooled_connection", default=False)


class _Pool(aiohttp.TCPConnector):
    """aiohttp's connector, telling each request whether its connection had served before.

    aiohttp's trace hooks would tell it too, but they cost an await per response chunk (every
    token of a stream); this costs a set lookup per request."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._handed_out: weakref.WeakSet[Any] = weakref.WeakSet()  # protocols, while alive

    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:
        conn = await super().connect(req, traces, timeout)
        protocol = conn.protocol
        _reused.set(protocol in self._handed_out)
        self._handed_out.add(protocol)
        return conn


IDLE_TIMEOUT_S = 4.0  # below vLLM's and SGLang's keep-alive timeout (5 s)


def upstream_connector(
    idle_timeout_s: float = IDLE_TIMEOUT_S, limit: int = 0
) -> aiohttp.TCPConnector:
    """The pool: up to ``limit`` connections (0: no limit; the gateway's admission limits its
    requests), idle ones closed after ``idle_timeout_s``."""
    return _Pool(limit=limit, limit_per_host=0, keepalive_timeout=idle_timeout_s)


async def send(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    body: Callable[[], Any],
    on_resend: Callable[[], None],
    **kwargs: Any,
) -> aiohttp.ClientResponse:
    """``session.request`` (on :func:`upstream_connector`'s pool), sent again when its pooled
    connection turns out closed before the answer began (module docstring), at most
    :data:`RESENDS` times. ``body()`` makes the payload, afresh for each send; ``on_resend`` is
    called before each resend. Use the response in ``async with``."""
    for _ in range(RESENDS):
        _reused.set(False)
        sent = time.monotonic()
        try:
            return await session.request(method, url, data=body(), **kwargs)
        except _CLOSED as exc:
            if not _reused.get() or isinstance(exc, aiohttp.ClientConnectorError):
                raise
            if time.monotonic() - sent > STALE_WITHIN_S:
                raise
        on_resend()  # a stale pooled connection, now dropped: the next is another or a new one
    return await session.request(method, url, data=body(), **kwargs)
