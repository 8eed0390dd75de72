"""The gateway application: OpenAI endpoints in front of replicas, routed by one Router.

Routes: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (routed on the prompt or the
messages), ``GET /v1/models`` (the union of the replicas' models), any other ``/v1/*`` (passed
to a replica chosen on load alone), ``GET /health``, ``GET /metrics`` and, with an admin token,
``/admin/replicas``.

A handler does four things: parse (``_requests``), ask the core and proxy (``_proxy``), and the
accounting rides on the router's dispatch / first token / complete calls. One ``ClientSession``
lives in ``cleanup_ctx`` with explicit timeouts: connect, and ``sock_read`` (the longest silence
between two upstream reads) but no total, which would cut long streams. On shutdown aiohttp stops
accepting, the gateway refuses new requests on open connections, in-flight requests finish
(up to ``shutdown_timeout_s``), and only then is the session closed.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from prefixroute.core import BlockHasher, Router, make_policy
from prefixroute.gateway import _admin
from prefixroute.gateway._config import GatewayConfig
from prefixroute.gateway._errors import InvalidJSON, make_error_middleware
from prefixroute.gateway._health import HealthChecker
from prefixroute.gateway._limits import Limits
from prefixroute.gateway._metrics import GatewayMetrics
from prefixroute.gateway._proxy import OUTCOME, Proxy
from prefixroute.gateway._registry import ReplicaRegistry
from prefixroute.gateway._requests import EMPTY_KEY, Endpoint, RouteKey, parse_body, route_key
from prefixroute.gateway._state import STATE, GatewayState


def build_app(config: GatewayConfig) -> web.Application:
    """A gateway application for ``config`` (its replicas are registered, not yet probed)."""
    router = Router(
        make_policy(config.policy, **config.policy_params),
        BlockHasher(config.block_chars),
        index_capacity_blocks=config.index_capacity_blocks,
        kv_block_size=config.kv_block_size,
        seed=config.seed,
    )
    registry = ReplicaRegistry(router, config)
    for url in config.replicas:
        registry.add(url)
    metrics = GatewayMetrics(router, registry)
    state = GatewayState(
        config, router, registry, metrics, Limits(config.max_in_flight, config.max_body_bytes)
    )

    def observe(request: web.Request, response: web.StreamResponse) -> None:
        if request.path.startswith("/v1/") and request.path != "/v1/models":
            outcome = request.get(OUTCOME)
            replica, reason = (outcome.replica, outcome.reason) if outcome else ("none", "none")
            metrics.count_request(replica, response.status, reason)

    app = web.Application(
        middlewares=[make_error_middleware(config.retry_after_s, observe)],
        client_max_size=config.max_body_bytes,
    )
    app[STATE] = state
    app.cleanup_ctx.append(_session_ctx)
    app.on_shutdown.append(_refuse_new)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_route("*", "/v1/{tail:.+}", passthrough)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics_handler)
    if config.admin_token is not None:
        _admin.add_routes(app)
    return app


async def _session_ctx(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    cfg = state.config
    timeout = aiohttp.ClientTimeout(
        total=None,
        connect=cfg.connect_timeout_s,
        sock_connect=cfg.connect_timeout_s,
        sock_read=cfg.read_timeout_s,
    )
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
        timeout=timeout,
        auto_decompress=False,  # relay bytes as the replica sent them
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),  # forward the client's
        raise_for_status=False,
    )
    state.proxy = Proxy(session, state.router, state.registry, state.metrics)
    state.health = HealthChecker(state.registry, session, cfg)
    try:
        await state.health.check_all(first=True)  # learn models; silent replicas start out
        state.health.start()
        yield
    finally:
        await state.health.stop()
        state.proxy = state.health = None
        await session.close()


async def _refuse_new(app: web.Application) -> None:
    app[STATE].limits.draining = True


def _state(request: web.Request) -> tuple[GatewayState, Proxy]:
    state = request.app[STATE]
    if state.proxy is None:
        raise RuntimeError("the gateway is not running")
    return state, state.proxy


async def _proxied(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    state, proxy = _state(request)
    with state.limits.admit():
        body = await state.limits.read_body(request)
        key = route_key(endpoint, body) if endpoint is not Endpoint.OTHER else _other_key(body)
        return await proxy.forward(request, body, endpoint, key)


def _other_key(body: bytes) -> RouteKey:
    """Any other /v1 call routes on load alone, among the replicas serving its model."""
    if not body:
        return EMPTY_KEY
    try:
        obj = parse_body(body)
    except InvalidJSON:  # not JSON (a file upload, say): the replica judges it
        return EMPTY_KEY
    model = obj.get("model") if isinstance(obj, dict) else None
    return RouteKey("", None, model if isinstance(model, str) else None, False, 0)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _proxied(request, Endpoint.COMPLETIONS)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _proxied(request, Endpoint.CHAT)


async def passthrough(request: web.Request) -> web.StreamResponse:
    return await _proxied(request, Endpoint.OTHER)


async def models(request: web.Request) -> web.Response:
    cards = request.app[STATE].registry.model_cards()
    return web.json_response({"object": "list", "data": cards}, dumps=json.dumps)


async def health(request: web.Request) -> web.Response:
    registry = request.app[STATE].registry
    ready = sum(1 for r in registry if r.healthy and not r.draining)
    body = {"status": "ok" if ready else "unavailable", "replicas": len(registry), "ready": ready}
    return web.json_response(body, status=200 if ready else 503)


async def metrics_handler(request: web.Request) -> web.Response:
    body = generate_latest(request.app[STATE].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
