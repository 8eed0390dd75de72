"""What lives as long as a gateway app runs: its background parts, its upstream session, and
the refusal of new requests once it shuts down (``_app.build_app`` hooks each in)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from prefixroute._pool import upstream_connector
from prefixroute.gateway._health import HealthChecker
from prefixroute.gateway._proxy import Proxy
from prefixroute.gateway._state import STATE


async def events_ctx(app: web.Application) -> AsyncIterator[None]:
    """KV-event subscribers (precise mode), decision sharing (sync_redis) and the tokenizer
    threads, for the app's lifetime."""
    state = app[STATE]
    if state.precise is not None:
        await state.precise.start()
    if state.sync is not None:
        await state.sync.start()  # never fails: an unreachable Redis is retried in background
    try:
        yield
    finally:
        if state.sync is not None:
            await state.sync.stop()
        if state.precise is not None:
            await state.precise.stop()
        if state.tokenizer is not None:
            state.tokenizer.shutdown()
        if state.tracing is not None:
            state.tracing.shutdown()  # exports what is still batched


async def session_ctx(app: web.Application) -> AsyncIterator[None]:
    """The one upstream ``ClientSession``, and the proxy and health checker that use it."""
    state = app[STATE]
    cfg = state.config
    timeout = aiohttp.ClientTimeout(
        total=None,
        connect=cfg.connect_timeout_s,
        sock_connect=cfg.connect_timeout_s,
        sock_read=cfg.read_timeout_s,
    )
    session = aiohttp.ClientSession(
        connector=upstream_connector(cfg.upstream_idle_timeout_s),
        timeout=timeout,
        auto_decompress=False,  # relay bytes as the replica sent them
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),  # forward the client's
        raise_for_status=False,
        # A proxy keeps no cookies: one client's Set-Cookie must never ride on another
        # client's request (aiohttp's default jar stores cookies from host-named replicas).
        cookie_jar=aiohttp.DummyCookieJar(),
    )
    limits = state.limits
    state.proxy = Proxy(
        session, state.router, state.registry, state.metrics, state.sync,
        is_cutting=lambda: limits.cutting, tracing=state.tracing,
        on_usage_refused=state.stop_asking_stream_usage, on_usage_taken=state.stream_usage_taken,
        responses=state.responses,
    )  # fmt: skip
    state.health = HealthChecker(state.registry, session, cfg)
    state.probe_tokens(session)
    try:
        await state.health.check_all(first=True)  # learn models; silent replicas start out
        state.health.start()
        yield
    finally:
        await state.health.stop()
        await state.close_token_probe()
        state.proxy = state.health = None
        await session.close()


async def refuse_new(app: web.Application) -> None:
    """Refuse new requests (``Gateway.stop`` has drained already; this covers a bare runner)."""
    app[STATE].limits.draining = True
