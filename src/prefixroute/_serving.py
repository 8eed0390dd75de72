"""Serving an aiohttp app in this process, shared by the gateway and the emulated replica.

One place sets the server options both must agree on: ``handler_cancellation`` on (a client
that disconnects cancels its handler, in tests and in production alike), no access log (it
would hold request lines), and a graceful shutdown timeout. :class:`Served` is the lifecycle the
in-process servers share: ``start``/``stop``, ``async with`` (:class:`StartStop`), and a ``url``
once started.

Answers aiohttp writes itself, below any middleware, come from :class:`_Protocol`: a request
its parser rejects (too many headers, a huge URL, Content-Length beside Transfer-Encoding, a bad
chunk size, a bad method, TLS on the plain port) gets an OpenAI-style JSON 4xx that never
repeats the client's bytes, and one DEBUG line, not aiohttp's ERROR traceback per bad request
(a client could flood the logs with them). Tracebacks of our own bugs go through
:class:`TracebackLimiter`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
import socket
import sys
import uuid
from collections.abc import Callable, Coroutine
from http import HTTPStatus
from types import TracebackType
from typing import Any, ClassVar, Self

from aiohttp import http_exceptions as hx
from aiohttp import web
from aiohttp.http import RawRequestMessage
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from prefixroute._tracebacks import TracebackLimiter
from prefixroute.core import ConfigError

log = logging.getLogger(__name__)
_compact = functools.partial(json.dumps, separators=(",", ":"))

REQUEST_ID_HEADER = "x-request-id"  # as the gateway's request-id middleware
_FRAMING = "the request's framing is invalid (Content-Length, Transfer-Encoding or chunks)"
# Connections the kernel completes before we accept them. aiohttp's default, 128, drops the
# SYNs of a burst past it, and each dropped client waits for its retransmit (1 s, then 3 s):
# 871 of 1,000 connections made at once did (2026-12-01). 2,048 as uvicorn and gunicorn; the
# kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG = 2048


class StartStop:
    """``start``/``stop``, and ``async with`` for them."""

    async def start(self) -> Any:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


class Served(StartStop):
    """One listening server: ``url`` raises a clear error until it started."""

    served_name: ClassVar[str]  # what the error calls it: "the gateway is not started"
    _url: str | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8000`` (available once started)."""
        if self._url is None:
            raise ConfigError(f"the {self.served_name} is not started")
        return self._url


def parse_error(status: int, exc: BaseException | None) -> tuple[int, str]:
    """The status and our own words for a request aiohttp could not parse or handle.

    aiohttp's messages quote the offending bytes, so none of them is passed on. It raises one
    class (``LineTooLong``) for a long request line and a long header; the quoted line tells
    them apart: a request target starts with ``/`` (or is absolute, or ``*``), possibly after
    the method (aiohttp's pure-Python parser quotes the whole request line).
    """
    if isinstance(exc, hx.LineTooLong):
        line = exc.args[0] if exc.args else b""
        head = (
            bytes(line).lstrip(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ ")
            if isinstance(line, bytes | bytearray)
            else b""
        )
        limit = exc.args[1] if len(exc.args) > 1 else "the limit"
        if head.startswith((b"/", b"http://", b"https://", b"*")):
            return 414, f"the request line is longer than {limit} bytes"
        return 431, f"a header field is longer than {limit} bytes"
    if isinstance(exc, hx.BadHttpMethod):
        return 400, "the request method is not valid HTTP (TLS sent to a plain HTTP port?)"
    if isinstance(exc, hx.BadStatusLine):
        return 400, "the request line is malformed"
    if isinstance(exc, hx.InvalidHeader):
        return 400, "a header is malformed"
    if isinstance(exc, hx.InvalidURLError):
        return 400, "the request target is not a valid URL"
    if isinstance(exc, hx.PayloadEncodingError):
        return 400, _FRAMING
    if isinstance(exc, hx.HttpProcessingError):
        text = exc.message if isinstance(exc.message, str) else ""
        if "Too many headers" in text:
            return 431, "the request has too many header fields"
        if any(word in text for word in ("Content-Length", "Transfer-Encoding", "chunk")):
            return 400, _FRAMING
        code = exc.code if 400 <= exc.code < 500 else 400
        return code, "the request is not valid HTTP/1.1"
    if status == HTTPStatus.INTERNAL_SERVER_ERROR:
        return status, "internal error"
    try:
        return status, HTTPStatus(status).phrase.lower()
    except ValueError:
        return status, "error"


def json_error(status: int, message: str) -> web.Response:
    """An OpenAI-style error body (``code`` is the status)."""
    kind = "invalid_request_error" if status < 500 else "internal_error"
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status, dumps=_compact)


class _Protocol(RequestHandler):
    """aiohttp's connection handler with JSON error answers and quiet client faults.

    ``closing()`` true (the gateway is draining) makes every answer close its connection
    (``Connection: close``), so clients reconnect elsewhere instead of reusing this one.
    """

    __slots__ = ("_closing", "_tracebacks")

    def __init__(
        self,
        manager: web.Server,
        *,
        closing: Callable[[], bool] | None,
        tracebacks: TracebackLimiter,
        **kwargs: Any,
    ) -> None:
        super().__init__(manager, **kwargs)
        self._closing = closing
        self._tracebacks = tracebacks

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        status, text = parse_error(status, exc)
        rid = uuid.uuid4().hex  # every answer carries a request id, this one too
        if status >= 500 and exc is not None and not isinstance(exc, asyncio.TimeoutError):
            self._tracebacks.exception(exc, "%s: error handling a request from %s", rid,
                                       request.remote)  # fmt: skip
        elif status >= 500:
            log.warning("%s: request from %s failed: %d %s", rid, request.remote, status, text)
        else:  # the client's fault: one line, and only when asked for (-v)
            log.debug("%s: bad request from %s: %d %s", rid, request.remote, status, text)
        if request.writer.output_size > 0:  # as aiohttp: too late for an answer
            raise ConnectionError("the response started already; cannot send an error")
        resp = json_error(status, text)
        resp.headers[REQUEST_ID_HEADER] = rid
        resp.force_close()
        return resp

    def data_received(self, data: bytes) -> None:
        """aiohttp answers a framing error in a body being read (a bad chunk size) only after
        that request, whose handler meanwhile waits for the rest of the body (until its
        timeout). Fail the body at once instead (the handler answers 400), and close after."""
        queued = len(self._messages)
        super().data_received(data)
        request = self._current_request
        if request is None or len(self._messages) == queued:
            return
        # A parse error while this request's body is unfinished is an error in that body.
        if not isinstance(self._messages[-1][0], RawRequestMessage) and not (
            request.content.is_eof()
        ):
            request.content.set_exception(web.RequestPayloadError(_FRAMING))
            self.close()  # the queued error answer is dropped with the connection

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """aiohttp's own tracebacks (a handler returning no response): rate-limited.

        A body that fails to arrive or decode is the client's mistake, answered 400 by the
        handler; aiohttp raises it again while draining the rest after the answer, as an
        "unhandled exception". That is a DEBUG line, as every client mistake is."""
        exc = kw.get("exc_info")
        if not isinstance(exc, BaseException):
            exc = sys.exc_info()[1]
        if isinstance(exc, web.RequestPayloadError):
            why = type(exc.__cause__ or exc).__name__
            log.debug("request body unreadable after the answer was sent (%s)", why)
        elif exc is None:
            log.error(*args)
        else:
            self._tracebacks.exception(exc, *args)

    async def finish_response(
        self, request: BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        if self._closing is not None and self._closing():
            resp.force_close()  # before prepare: the headers say Connection: close
        return await super().finish_response(request, resp, start_time)


class _Server(web.Server):
    """aiohttp's low-level server, making :class:`_Protocol` connections."""

    def __init__(
        self, base: web.Server, closing: Callable[[], bool] | None, tracebacks: TracebackLimiter
    ) -> None:
        super().__init__(
            base.request_handler,
            request_factory=base.request_factory,
            handler_cancellation=base.handler_cancellation,
            loop=base._loop,
            **base._kwargs,
        )
        self._closing = closing
        self._tracebacks = tracebacks

    def __call__(self) -> RequestHandler:
        return _Protocol(
            self,
            loop=self._loop,
            closing=self._closing,
            tracebacks=self._tracebacks,
            **self._kwargs,
        )


class _Runner(web.AppRunner):
    """``AppRunner`` whose server is a :class:`_Server`."""

    def __init__(
        self, app: web.Application, closing: Callable[[], bool] | None, **kwargs: Any
    ) -> None:
        super().__init__(app, **kwargs)
        self._closing = closing

    async def _make_server(self) -> web.Server:
        base = await super()._make_server()  # startup signals, then the app's handler args
        return _Server(base, self._closing, TracebackLimiter(log))

    async def cleanup(self) -> None:
        await stop_accepting(self)
        await super().cleanup()


async def stop_accepting(runner: web.BaseRunner) -> None:
    """Stop taking connections, and let those already accepted be set up, before the listening
    socket closes (every runner of :func:`listen` does this first in ``cleanup()``).

    asyncio accepts a connection in one loop iteration and sets it up (transport, then
    ``connection_made``) over the next two. One accepted just before the socket closed was
    missed by the server's shutdown: aiohttp neither answered nor closed it, and on Python 3.11
    its transport failed to attach and left the socket open. Its client waited for its own
    timeout (the emulator's kill and the gateway's stop, 2026-12-01).
    """
    loop = asyncio.get_running_loop()
    for site in runner.sites:
        server = getattr(site, "_server", None)  # aiohttp's asyncio.Server of the site
        for sock in getattr(server, "sockets", ()):
            loop.remove_reader(sock.fileno())
    for _ in range(3):  # the accepting task, then the transport's connection_made
        await asyncio.sleep(0)


async def listen(
    app: web.Application,
    host: str,
    port: int,
    *,
    shutdown_timeout_s: float,
    keepalive_timeout_s: float | None = None,
    closing: Callable[[], bool] | None = None,
) -> tuple[web.AppRunner, str]:
    """Bind ``app`` on ``host:port`` (0 picks a free port); returns the runner and base URL.

    A port that cannot be bound (in use, a privileged port, an address not on this host) is
    a :class:`ConfigError` naming it, which the command line prints as one line.

    ``runner.cleanup()`` can take up to twice ``shutdown_timeout_s``: aiohttp first waits that
    long for each connection's handler, then cancels it and waits that long again. ``closing``:
    while it returns true, each answer closes its connection. The listen backlog is
    :data:`LISTEN_BACKLOG`.
    """
    extra: dict[str, Any] = {}
    if keepalive_timeout_s is not None:
        extra["keepalive_timeout"] = keepalive_timeout_s
    runner = _Runner(
        app,
        closing,
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=shutdown_timeout_s,
        **extra,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, backlog=LISTEN_BACKLOG)
        await site.start()
    except OSError as exc:  # in use, not ours, no such address: one line, not a traceback
        await runner.cleanup()
        raise ConfigError(f"cannot listen on {host}:{port}: {_bind_error(exc)}") from exc
    except BaseException:
        await runner.cleanup()
        raise
    bound, bound_port = runner.addresses[0][:2]  # an IPv6 host is bracketed in a URL
    return runner, f"http://{f'[{bound}]' if ':' in bound else bound}:{bound_port}"


async def wait_for_signal() -> None:
    """Return on SIGINT or SIGTERM."""
    stop = asyncio.Event()
    on_signal(stop.set)
    await stop.wait()


def on_signal(handler: Callable[[], object]) -> None:
    """Call ``handler`` on the running loop at SIGINT or SIGTERM, from now on."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, handler)


def _bind_error(exc: OSError) -> str:
    """Why a bind failed, in the C library's words (a resolver's EAI_* code is no errno:
    ``os.strerror`` read it as "unknown error -2")."""
    if isinstance(exc, socket.gaierror) and exc.strerror:
        return exc.strerror.lower()
    return os.strerror(exc.errno).lower() if exc.errno else str(exc)


def run_on_uvloop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop when installed, else asyncio's default loop: how every server of
    ours runs (and the benchmarks' clients, so that both sides measure the same loop)."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)
