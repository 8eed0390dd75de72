"""The gateway application: OpenAI endpoints in front of replicas, routed by one Router.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``POST /v1/responses`` and
Anthropic's ``POST /v1/messages`` (routed on the prompt or the messages; a stored response's
``GET /v1/responses/{id}`` and its ``cancel`` go to the replica that stored it, ``_responses``),
``POST /generate`` (SGLang's native call, routed on its text or token ids), ``GET /v1/models``
(the union of the replicas' models), the allowlisted passthrough paths of ``_paths``
(``/v1/embeddings``, rerank, score, tokenize...: passed to a replica chosen on load alone),
``GET /health``, ``GET /metrics``, ``GET /openapi.json``, the fleet page ``GET /dashboard``
(``_dashboard``: behind the admin token, or loopback-only without one) and, with an admin token,
``/admin/replicas``. Every other path is a 404 that reaches no replica, and a replica only ever
gets the route's own path (``_paths.upstream_target``), never the client's raw one.

A handler does four things: parse, once (``_admit``: the body read under ``_requests``' strict
rules into the core's route key, put in the tenant's key space, re-encoded, and tokenized with
``_tokenize``), ask the core and proxy (``_proxy``, handed that ``Admitted`` request), and the
accounting rides on the router's dispatch / first token / complete calls.

Modes: by default the router keys requests on characters and its index records its own
decisions (approximate). ``--tokenizer`` keys them on the engine's token ids in blocks of
``kv_block_size``. ``--kv-events`` or ``--kv-events-each`` (precise mode) also leaves the index
to the replicas' KV events (``_precise``) and covers fresh decisions with speculative entries.
``--sync-redis`` shares approximate-mode decisions with other instances (``_sync``). One
``ClientSession`` lives in ``cleanup_ctx`` (``_lifetime``) with explicit timeouts: connect, and
``sock_read`` (the longest silence between two upstream reads) but no total, which would cut
long streams.
On shutdown (``Gateway.stop``) the listener keeps accepting and answers new requests with a 503
and ``Connection: close``, in-flight requests finish up to ``shutdown_timeout_s``, and those
still running then are cut with an explicit error (an SSE error event, or a 503); only then is
the session closed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
from collections.abc import Mapping

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from prefixroute.core import (
    BlockHasher,
    ReplicaId,
    Router,
    SpeedPrior,
    make_policy,
    speed_priors_of,
)
from prefixroute.events import EventEndpoint
from prefixroute.gateway import _admin, _dashboard
from prefixroute.gateway._admission import (
    LOG_BODIES,
    add_catch_all,
    expect_handler,
    log_request_body,
    log_response_body,
    make_request_id_middleware,
    request_id_of,
)
from prefixroute.gateway._config import GatewayConfig
from prefixroute.gateway._errors import Observer, ShuttingDown, make_error_middleware
from prefixroute.gateway._fleetview import FLEET, FleetView
from prefixroute.gateway._lifetime import events_ctx, refuse_new, session_ctx
from prefixroute.gateway._limits import Limits
from prefixroute.gateway._metrics import GatewayMetrics
from prefixroute.gateway._openapi import OPENAPI_PATH, make_openapi_handler
from prefixroute.gateway._paths import PASSTHROUGH_PATHS, is_model_call, make_path_middleware
from prefixroute.gateway._precise import PreciseMode
from prefixroute.gateway._proxy import OUTCOME, Proxy
from prefixroute.gateway._registry import ReplicaRegistry, by_replica
from prefixroute.gateway._requests import (
    Admitted,
    Endpoint,
    check_json_type,
    encode_body,
    is_json_type,
    key_of,
    other_key,
    parse_body,
)
from prefixroute.gateway._state import STATE, GatewayState
from prefixroute.gateway._tenants import (
    TENANT_SCOPE,
    TENANTS,
    Tenants,
    isolated,
    make_tenant_middleware,
    upstream_headers,
)
from prefixroute.gateway._tokenize import HFTokenizer, PromptTokenizer, TokenizerPool
from prefixroute.gateway._tracing import RequestTracing
from prefixroute.sync import RouteSync

# Tokenizer threads: all cores but one, which stays with the event loop (on 2 cores one thread
# kept the loop's longest stall at ~5 ms beside 8k-token prompts; two threads: ~15 ms).
TOKENIZE_WORKERS = max(1, (os.cpu_count() or 2) - 1)

log = logging.getLogger(__name__)


def build_app(config: GatewayConfig, tokenizer: PromptTokenizer | None = None) -> web.Application:
    """A gateway application for ``config`` (its replicas are registered, not yet probed).

    ``tokenizer`` overrides ``config.tokenizer`` (tests pass one that matches their replicas).
    """
    if tokenizer is None and config.tokenizer is not None:
        tokenizer = HFTokenizer(config.tokenizer)
    config.check_precise(tokenizer is not None)
    state = gateway_state(config, tokenizer)
    tenants = Tenants(config.tenancy, config.upstream_api_key, state.metrics.registry)
    fleet = FleetView()  # the dashboard's recent decisions and chart samples
    app = web.Application(
        middlewares=[
            make_request_id_middleware(),  # outermost: every answer carries its request id
            make_error_middleware(config.retry_after_s, _observer(state.metrics, fleet)),
            make_path_middleware(),  # ambiguous raw paths (dot segments, %2f, ...): 404
            make_tenant_middleware(tenants),  # who, and may they: 401 / 429 as JSON errors
        ],
        client_max_size=config.max_body_bytes,
    )
    app[STATE] = state
    app[TENANTS] = tenants
    app[LOG_BODIES] = config.log_bodies
    app[FLEET] = fleet
    app.cleanup_ctx.append(events_ctx)
    app.cleanup_ctx.append(session_ctx)
    app.on_shutdown.append(refuse_new)
    _add_routes(app, config)
    return app


def gateway_state(
    config: GatewayConfig, tokenizer: PromptTokenizer | None,
    speeds: Mapping[ReplicaId, SpeedPrior] | None = None,
) -> GatewayState:  # fmt: skip
    """The router and everything around it that lives as long as the app: the gateway's, and
    the endpoint picker's (which runs on the same wiring). ``speeds``: speed priors by replica,
    for replicas that may join later (the picker's discovered endpoints); by default
    ``config.replica_speeds``, each of which must name a configured replica."""
    policy = make_policy(config.policy, **config.policy_params)
    router = Router(
        policy,
        BlockHasher(config.kv_block_size if tokenizer is not None else config.block_chars),
        # The engines report their evictions in precise mode: no capacity of our own.
        index_capacity_blocks=None if config.precise else config.index_capacity_blocks,
        kv_block_size=config.kv_block_size,
        seed=config.seed,
        insert_on_route=not config.precise,
        speculative_ttl_s=config.speculative_ttl_s if config.precise else None,
        # A real first token carries fixed costs a simulated one does not (HTTP, templating,
        # scheduling): learn_ttft_overhead learns each replica's beside its prefill rate.
        speed=dataclasses.replace(
            speed_priors_of(policy),
            learn_overhead=config.learn_ttft_overhead,
            learn_attention=config.learn_attention,
        ),
    )
    registry = ReplicaRegistry(router, config)
    registry.priors.update(_speed_priors(config) if speeds is None else speeds)
    for url in config.replicas:
        registry.add(url)
    metrics = GatewayMetrics(router, registry)
    state = GatewayState(
        config, router, registry, metrics,
        Limits(config.max_in_flight, config.max_body_bytes, config.client_body_timeout_s),
        asks_stream_usage=config.stream_usage,
    )  # fmt: skip
    if tokenizer is not None:
        state.tokenizer = TokenizerPool(
            tokenizer, TOKENIZE_WORKERS, metrics.tokenize_seconds.observe,
            metrics.tokenize_failures.inc,
        )  # fmt: skip
    if config.precise:
        state.precise = PreciseMode(router, _event_endpoints(config), config.kv_events_each)
        state.precise.follow(registry)  # kv_events_each: streams follow the membership
        metrics.watch_precise(state.precise)
    if config.sync_redis is not None:
        state.sync = RouteSync(
            config.sync_redis, config.sync_channel, router, metrics.registry,
            history=config.sync_history, secret=config.sync_secret,
        )  # fmt: skip
        if config.sync_secret is None:
            log.warning(
                "sync_redis without sync_secret: whoever can publish to that Redis can steer "
                "every instance's routing (docs/security.md)"
            )
        # The stored Responses answers' replicas, shared both ways (_responses).
        state.responses.publish, state.sync.on_stored = state.sync.stored, state.responses.record
    if config.otlp_endpoint is not None:
        state.tracing = RequestTracing.to_otlp(config.otlp_endpoint, config.trace_service_name)
    return state


def _observer(metrics: GatewayMetrics, fleet: FleetView) -> Observer:
    """What the error middleware shows every final answer to: the requests counter and the
    dashboard's recent decisions, for the proxied /v1 calls."""

    def observe(request: web.Request, response: web.StreamResponse) -> None:
        if is_model_call(request.path):
            outcome = request.get(OUTCOME)
            replica, reason = (outcome.replica, outcome.reason) if outcome else ("none", "none")
            metrics.count_request(replica, response.status, reason)
            if outcome is not None:
                fleet.decided(request.path, outcome, response)

    return observe


def _add_routes(app: web.Application, config: GatewayConfig) -> None:
    # Every route gets our expect handler: aiohttp's default can fail (see _admission).
    eh = expect_handler
    app.router.add_post("/v1/completions", completions, expect_handler=eh)
    app.router.add_post("/v1/chat/completions", chat_completions, expect_handler=eh)
    app.router.add_post("/generate", generate, expect_handler=eh)
    app.router.add_post("/v1/responses", responses, expect_handler=eh)
    app.router.add_post("/v1/messages", messages, expect_handler=eh)
    # A stored response, on the replica that stored it (_responses); paths: _paths.
    app.router.add_get("/v1/responses/{response_id}", stored_response, expect_handler=eh)
    app.router.add_post("/v1/responses/{response_id}/cancel", stored_response, expect_handler=eh)
    app.router.add_get("/v1/models", models, expect_handler=eh)
    for path in PASSTHROUGH_PATHS:  # an allowlist: any other /v1 path is the catch-all's 404
        app.router.add_post(path, passthrough, expect_handler=eh)
    app.router.add_get("/health", health, expect_handler=eh)
    app.router.add_get("/metrics", metrics_handler, expect_handler=eh)
    app.router.add_get(OPENAPI_PATH, make_openapi_handler(), expect_handler=eh)
    if config.admin_token is not None and config.admin_port is None:
        _admin.add_routes(app)  # else on its own listener (``Gateway`` runs build_admin_app)
    if _dashboard.mounted_on_main(config):  # /dashboard: who may see it, see _dashboard
        _dashboard.add_routes(app)
    add_catch_all(app)


def _speed_priors(config: GatewayConfig) -> dict[ReplicaId, SpeedPrior]:
    return by_replica(config.replica_speed_priors(), config.replicas, "speed priors")


def _event_endpoints(config: GatewayConfig) -> dict[ReplicaId, EventEndpoint]:
    return by_replica(config.kv_event_endpoints(), config.replicas, "KV events")


def _state(request: web.Request) -> tuple[GatewayState, Proxy]:
    state = request.app[STATE]
    if state.proxy is None:
        raise RuntimeError("the gateway is not running")
    return state, state.proxy


async def _proxied(
    request: web.Request, endpoint: Endpoint, owner: ReplicaId | None = None
) -> web.StreamResponse:
    """Admit, route and relay one request (``owner``: the one replica it may go to)."""
    state, proxy = _state(request)
    try:
        with state.limits.admit():
            admitted = await _admit(request, state, endpoint, owner)
            log_request_body(request.app, admitted.request_id, admitted.body)
            response = await proxy.forward(request, admitted)
            log_response_body(request.app, admitted.request_id, response)
            return response
    except asyncio.CancelledError:
        # Cut at the drain bound before any byte was answered (reading the body, tokenizing,
        # waiting on the replica): a 503, not a reset. A started stream ends itself (_relay).
        if not state.limits.cutting:
            raise  # the client left: aiohttp cancelled its handler
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        state.metrics.cut_streams.labels("shutdown").inc()
        raise ShuttingDown("the gateway shut down before this request was answered") from None


async def _admit(
    request: web.Request, state: GatewayState, endpoint: Endpoint, owner: ReplicaId | None
) -> Admitted:
    """Read the request once: the body parsed and keyed, the key made the router's
    (``GatewayState.route_key``: the tenant's space, which edits the parsed body's
    ``cache_salt``, the adapter, tokens), the replica of the response it continues, if any,
    and the body re-encoded for the replica."""
    body = await state.limits.read_body(request)
    rid = request_id_of(request)
    scope = request.get(TENANT_SCOPE)
    headers = upstream_headers(request.headers, rid, scope)
    obj: object | None
    if endpoint is Endpoint.OTHER:
        obj = _other_json(request, body)
        key = other_key(obj)
    else:
        check_json_type(request.headers.get("Content-Type", ""))
        obj = parse_body(body)
        key = key_of(endpoint, obj)
    key = await state.route_key(endpoint, key, obj, scope)  # edits obj's cache_salt
    if endpoint is Endpoint.RESPONSES:
        owner = state.responses.of_request(key, obj, isolated(scope))
    asked = False
    if obj is not None:  # what the replica reads is what we parsed (see _requests)
        asked = state.ask_stream_usage(endpoint, obj)  # the usage every stream's learning needs
        state.ask_full_kv_report(endpoint, obj)  # precise mode, a stream lost: _kv_report
        if asked:  # a compressed stream cannot be read event by event to hide that usage
            headers["Accept-Encoding"] = "identity"
        body = encode_body(obj)
        headers["Content-Type"] = "application/json"
    fetch = endpoint is Endpoint.OTHER and owner is not None  # a stored response's GET, cancel
    return Admitted(rid, endpoint, key, body, headers, scope, asked, owner, learns=not fetch)


def _other_json(request: web.Request, body: bytes) -> object | None:
    """A passthrough body parsed as the prompt endpoints' are, when it is JSON (declared, or
    undeclared); None for an empty body or another declared type (a file upload, say), which
    is forwarded as sent."""
    ctype = request.content_type  # application/octet-stream when the client sent none
    declared = "Content-Type" in request.headers
    if not body or (declared and not is_json_type(ctype)):
        return None
    return parse_body(body)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _proxied(request, Endpoint.COMPLETIONS)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _proxied(request, Endpoint.CHAT)


async def generate(request: web.Request) -> web.StreamResponse:
    return await _proxied(request, Endpoint.GENERATE)


async def passthrough(request: web.Request) -> web.StreamResponse:
    return await _proxied(request, Endpoint.OTHER)


async def responses(request: web.Request) -> web.StreamResponse:
    return await _proxied(request, Endpoint.RESPONSES)


async def messages(request: web.Request) -> web.StreamResponse:
    return await _proxied(request, Endpoint.MESSAGES)


async def stored_response(request: web.Request) -> web.StreamResponse:
    """``GET /v1/responses/{id}`` or its ``cancel``: to the replica that stored it, in the
    tenant's name (404 where this gateway does not know it: _responses)."""
    scope = request.get(TENANT_SCOPE)
    tenant = scope.tenant.name if scope is not None else None
    owner = request.app[STATE].responses.of_stored(tenant, request.match_info["response_id"])
    return await _proxied(request, Endpoint.OTHER, owner)


async def models(request: web.Request) -> web.Response:
    cards = request.app[STATE].registry.model_cards()
    return web.json_response({"object": "list", "data": cards}, dumps=json.dumps)


async def health(request: web.Request) -> web.Response:
    if request.app[STATE].limits.draining:  # shutting down: take this instance out of rotation
        return web.json_response({"status": "draining"}, status=503)
    registry = request.app[STATE].registry
    ready = sum(1 for r in registry if r.healthy and not r.draining)
    body = {"status": "ok" if ready else "unavailable", "replicas": len(registry), "ready": ready}
    body.update(request.app[STATE].shared_status())
    return web.json_response(body, status=200 if ready else 503)


async def metrics_handler(request: web.Request) -> web.Response:
    body = generate_latest(request.app[STATE].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
