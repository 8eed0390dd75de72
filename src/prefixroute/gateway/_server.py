"""Running the gateway in-process: the same server settings in tests, bench and ``serve``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

from aiohttp import web

from prefixroute._serving import Served, listen
from prefixroute.core import ReplicaId, Router
from prefixroute.events import EventSubscriber
from prefixroute.gateway._admin import build_admin_app
from prefixroute.gateway._app import build_app
from prefixroute.gateway._config import GatewayConfig
from prefixroute.gateway._registry import ReplicaRegistry
from prefixroute.gateway._state import STATE
from prefixroute.gateway._tokenize import PromptTokenizer

log = logging.getLogger("prefixroute.gateway")

CUT_GRACE_S = 1.0  # after the cut: how long cancelled handlers get to write their endings, s
# aiohttp's own graceful close, once the drain is over: it waits this long for each open
# connection's handler, then cancels it and waits this long again (web_protocol's shutdown).
CLOSE_TIMEOUT_S = 0.25


class Gateway(Served):
    """The gateway app served by aiohttp in this process.

    ``handler_cancellation`` is on, in tests and in production alike: a client that disconnects
    cancels its handler, which closes the upstream request and releases its accounting.

    ``stop()`` drains with one bound, ``shutdown_timeout_s``. The listener keeps accepting (a
    load balancer may still send here until it learns we are going), but new requests get a 503
    with ``Connection: close``, as does ``/health``, and every answer closes its connection.
    Once the admitted requests finish, or at the bound, whichever comes first, the ones still
    running are cut: cancelled, with ``limits.cutting`` set so each ends its answer with an
    error (an SSE error event, or a 503). They get ``CUT_GRACE_S`` for that, then aiohttp
    closes the connections (``CLOSE_TIMEOUT_S``, twice at most). ``stop()`` returns within
    about the bound plus 1.5 s. aiohttp's own shutdown would take up to twice its timeout and
    close the listener first, so it only runs after the drain, with a short timeout.

    Slow clients: aiohttp's keep-alive timer, set to ``client_header_timeout_s``, closes a
    connection whose next request has not fully arrived in time, the first request included
    (aiohttp >= 3.14 arms it at connect); a slow body gets a 408 after ``client_body_timeout_s``.
    With ``admin_port`` the admin API listens on an address of its own.
    """

    served_name = "gateway"

    def __init__(
        self, config: GatewayConfig | None = None, *, tokenizer: PromptTokenizer | None = None
    ) -> None:
        self.config = config or GatewayConfig()
        self.app = build_app(self.config, tokenizer)
        self._runner: web.AppRunner | None = None
        self._url: str | None = None
        self._admin_runner: web.AppRunner | None = None
        self._admin_url: str | None = None
        self._hurry = asyncio.Event()  # cut what still runs now, not at the drain bound

    @property
    def admin_url(self) -> str:
        """Base URL of the admin API: its own listener with ``admin_port``, else ``url``."""
        return self._admin_url if self._admin_url is not None else self.url

    @property
    def router(self) -> Router:
        return self.app[STATE].router

    @property
    def registry(self) -> ReplicaRegistry:
        return self.app[STATE].registry

    @property
    def event_streams(self) -> Mapping[ReplicaId, EventSubscriber]:
        """Precise mode's KV-event subscriber per replica (empty in the other modes)."""
        precise = self.app[STATE].precise
        return precise.subscribers if precise is not None else {}

    async def start(self) -> str:
        if self._runner is not None:
            return self.url
        cfg = self.config
        self._runner, self._url = await self._listen(self.app, cfg.host, cfg.port)
        if cfg.admin_port is not None:
            try:
                admin = build_admin_app(self.app)
                self._admin_runner, self._admin_url = await self._listen(
                    admin, cfg.admin_host or cfg.host, cfg.admin_port
                )
            except BaseException:
                await self.stop()
                raise
        return self._url

    async def _listen(
        self, app: web.Application, host: str, port: int
    ) -> tuple[web.AppRunner, str]:
        limits = self.app[STATE].limits
        return await listen(
            app,
            host,
            port,
            shutdown_timeout_s=CLOSE_TIMEOUT_S,  # the drain is ours: see stop()
            keepalive_timeout_s=self.config.client_header_timeout_s,
            closing=lambda: limits.draining,
        )

    async def stop(self) -> None:
        """Drain (up to ``shutdown_timeout_s``), cut what is left, close; see the class."""
        if self._runner is not None:
            await self._drain()
        admin, self._admin_runner, self._admin_url = self._admin_runner, None, None
        if admin is not None:
            await admin.cleanup()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    def hurry(self) -> None:
        """Cut what still runs now rather than at the drain bound (``serve``: a second Ctrl-C,
        which was ignored without a word, the drain waiting on)."""
        self._hurry.set()

    async def _drain(self) -> None:
        limits = self.app[STATE].limits
        bound = self.config.shutdown_timeout_s
        limits.draining = True
        started = time.monotonic()
        log.info("draining: %d requests in flight, waiting up to %g s", limits.in_flight, bound)
        idle = asyncio.ensure_future(limits.wait_idle(bound))
        hurried = asyncio.ensure_future(self._hurry.wait())
        try:
            await asyncio.wait({idle, hurried}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            hurried.cancel()
        if idle.done() and idle.result():
            log.info("drained in %.1f s", time.monotonic() - started)
            return
        idle.cancel()
        cut = limits.cut()
        told = self._hurry.is_set()
        when = "when told to stop again" if told else f"at the {bound:g} s drain bound"
        log.warning("cut %d requests still running %s", cut, when)
        await limits.wait_cut(CUT_GRACE_S)
