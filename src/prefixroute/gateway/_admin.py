"""The admin API: list, add, drain and remove replicas at runtime, behind a bearer token.

    GET    /admin/replicas                  {"replicas": [...]}
    POST   /admin/replicas                  body {"url": "http://host:port"} -> 201 {"replica": ...}
    POST   /admin/replicas/{id}/drain       no new requests; in-flight ones finish -> 200
    DELETE /admin/replicas/{id}             forget it (its in-flight requests still finish) -> 200
    GET    /admin/tenants                   {"default_limits": {...}, "tenants": [...]}
    GET    /admin/tenants/{name}            {"tenant": {limits, in_flight, bucket levels}}
    PUT    /admin/tenants/{name}/limits     body: limit fields (null: the config's) -> 200
    DELETE /admin/tenants/{name}/limits     back to the config file's limits -> 200
    POST   /admin/explain/v1/completions    body: a request as a client sends it (also
    POST   /admin/explain/v1/chat/completions   ?tenant=NAME) -> where it would go, and why

``{id}`` is the replica's URL, URL-quoted (``http%3A%2F%2F10.0.0.11%3A8000``) or as is. Every
call needs ``Authorization: Bearer <token>`` with the token given at start; the comparison is
constant-time (``hmac.compare_digest`` of digests, which hides the length too). Without a
token the admin API is not mounted at all; with ``admin_port`` it is served only on its own
listener (:func:`build_admin_app`). A replica added here is probed at once and, if it answers,
takes traffic from the next request. Limits set here last until the gateway stops.

The endpoint picker (``prefixroute epp``) serves these same handlers on its HTTP listener
(:func:`admin_listener`, as ``admin_port`` does), with one difference: its endpoints belong to
its discovery source (the ``--endpoint`` list, the endpoints file, Kubernetes pods), which would
undo a replica added or removed here, so those two calls answer 409 with the reason
(``membership_refusal``); draining one works, and lasts while the source keeps listing it.

``/admin/explain`` answers "why would my request go there?": the request is keyed exactly as
the proxied path keys it (``GatewayState.route_key``) and the router explains its decision
(``Router.explain``: every candidate's match, load and, from the default policy, predicted TTFT
and score) without routing it, so nothing is recorded and nothing is sent to a replica.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from prefixroute.core import ConfigError, Decision, Endpoint, SpeedPrior
from prefixroute.gateway import _dashboard
from prefixroute.gateway._admission import (
    add_catch_all,
    expect_handler,
    make_request_id_middleware,
    request_id_of,
)
from prefixroute.gateway._auth import bearer_token, secrets_equal
from prefixroute.gateway._context_window import fitting, needed_tokens
from prefixroute.gateway._errors import BadRequest, Conflict, Unauthorized, make_error_middleware
from prefixroute.gateway._fleetview import FLEET, FleetView
from prefixroute.gateway._requests import key_of, parse_body
from prefixroute.gateway._state import STATE, GatewayState
from prefixroute.gateway._tenant_config import (
    LIMIT_NAMES,
    check_tenant_name,
    limits_from,
)
from prefixroute.gateway._tenants import TENANTS, Tenants, TenantScope

MAX_ADMIN_BODY = 64 * 1024  # bytes
EXPLAINED = {Endpoint.COMPLETIONS: "/v1/completions", Endpoint.CHAT: "/v1/chat/completions",
             Endpoint.RESPONSES: "/v1/responses", Endpoint.MESSAGES: "/v1/messages"}  # fmt: skip


def add_routes(app: web.Application, membership_refusal: str | None = None) -> None:
    """The admin API's routes; with ``membership_refusal``, adding and removing a replica
    answer 409 with it (after the token check), for an app whose replicas another source
    owns (the endpoint picker's discovery)."""
    eh = expect_handler  # aiohttp's default can fail (see _admission)
    add: Handler = add_replica
    remove: Handler = remove_replica
    if membership_refusal is not None:
        add = remove = _refuser(membership_refusal)
    app.router.add_get("/admin/replicas", list_replicas, expect_handler=eh)
    app.router.add_post("/admin/replicas", add, expect_handler=eh)
    app.router.add_post(r"/admin/replicas/{ref:.+}/drain", drain_replica, expect_handler=eh)
    app.router.add_delete(r"/admin/replicas/{ref:.+}", remove, expect_handler=eh)
    app.router.add_get("/admin/tenants", list_tenants, expect_handler=eh)
    app.router.add_get("/admin/tenants/{name}", get_tenant, expect_handler=eh)
    app.router.add_put("/admin/tenants/{name}/limits", set_tenant_limits, expect_handler=eh)
    app.router.add_delete("/admin/tenants/{name}/limits", reset_tenant_limits, expect_handler=eh)
    for endpoint, path in EXPLAINED.items():
        app.router.add_post(f"/admin/explain{path}", _explainer(endpoint), expect_handler=eh)


def build_admin_app(main: web.Application) -> web.Application:
    """The admin API alone, sharing ``main``'s state, for ``admin_port`` (which needs a
    token, so the API and the fleet page are both there)."""
    state = main[STATE]
    host = state.config.admin_host or state.config.host
    app, _ = admin_listener(state, main[TENANTS], host, fleet=main[FLEET])
    return app


def admin_listener(
    state: GatewayState,
    tenants: Tenants,
    host: str,
    *,
    fleet: FleetView | None = None,
    routes: Iterable[web.AbstractRouteDef] = (),
    membership_refusal: str | None = None,
) -> tuple[web.Application, FleetView | None]:
    """An app for a listener of its own, bound to ``host``, on the state and tenants of what
    routes (the gateway's ``admin_port``, the endpoint picker's HTTP side), under the main
    listener's rules: ``routes`` for anyone (the picker's metrics and health); the admin API
    with an admin token, else not at all; the fleet page with a token, or on a loopback
    ``host`` for loopback clients only (``_dashboard``); a JSON 404 for anything else, and
    every error as JSON. ``fleet``: the view the page shows (a new one when None).

    Returns the app, and the fleet view to record decisions in when the page is mounted
    (else None: nobody would see them)."""
    app = web.Application(
        middlewares=[
            make_request_id_middleware(),
            make_error_middleware(state.config.retry_after_s),
        ],
        client_max_size=MAX_ADMIN_BODY,
    )
    app[STATE] = state
    app[TENANTS] = tenants
    view = app[FLEET] = fleet if fleet is not None else FleetView()
    app.add_routes(routes)
    if state.config.admin_token is not None:
        add_routes(app, membership_refusal)
    shown = _dashboard.mounted_on(state.config, host)
    if shown:
        _dashboard.add_routes(app)  # the fleet page goes where the admin API goes
    add_catch_all(app)
    return app, view if shown else None


def _authorize(request: web.Request) -> GatewayState:
    state = request.app[STATE]
    token = state.config.admin_token
    given = bearer_token(request.headers.get("Authorization", ""))
    # Compare even when no token came, so timing does not tell which part failed.
    match = secrets_equal(given or "", token or "")
    if not (token is not None and given is not None and match):
        raise Unauthorized("a valid admin bearer token is required")
    return state


async def list_replicas(request: web.Request) -> web.Response:
    state = _authorize(request)
    replicas = []
    for record in state.registry:
        described = state.registry.describe(record)
        if state.precise is not None:  # its KV-event stream: live, resyncing, waiting or none
            described["kv_events"] = state.precise.state_of(record.id)
        replicas.append(described)
    return web.json_response({"replicas": replicas})


async def add_replica(request: web.Request) -> web.Response:
    state = _authorize(request)
    if request.content_length is not None and request.content_length > MAX_ADMIN_BODY:
        raise BadRequest("admin request body too large")
    body = parse_body(await request.read())
    if not isinstance(body, Mapping) or not isinstance(body.get("url"), str):
        raise BadRequest('the body must be {"url": "http://host:port"}')
    try:
        record = state.registry.add(body["url"], _speed_prior(body))
    except ConfigError as exc:
        raise BadRequest(str(exc)) from exc
    if state.health is not None:
        await state.health.check(record, first=True)
    return web.json_response({"replica": state.registry.describe(record)}, status=201)


def _speed_prior(body: Mapping[str, Any]) -> SpeedPrior | None:
    """The replica's own speed priors in an add request's body (None: it gives none);
    raises ConfigError."""
    given = {key: value for key, value in body.items() if key != "url"}
    return SpeedPrior.from_mapping(given) if given else None


async def drain_replica(request: web.Request) -> web.Response:
    state = _authorize(request)
    record = state.registry.find(request.match_info["ref"])
    state.registry.drain(record.id)
    return web.json_response({"replica": state.registry.describe(record)})


async def remove_replica(request: web.Request) -> web.Response:
    state = _authorize(request)
    record = state.registry.find(request.match_info["ref"])
    described = state.registry.describe(record)
    state.registry.remove(record.id)
    return web.json_response({"replica": described})


def _refuser(reason: str) -> Handler:
    async def refuse(request: web.Request) -> web.Response:
        _authorize(request)  # an unauthorised caller learns nothing, not even this
        raise Conflict(reason)

    return refuse


async def list_tenants(request: web.Request) -> web.Response:
    _authorize(request)
    tenants, now = request.app[TENANTS], time.monotonic()
    body = {
        "default_limits": tenants.config.default_limits.as_dict(),
        "tenants": [tenants.describe(name, now) for name in tenants.names()],
    }
    return web.json_response(body)


async def get_tenant(request: web.Request) -> web.Response:
    _authorize(request)
    name = _tenant_name(request)
    return web.json_response({"tenant": request.app[TENANTS].describe(name, time.monotonic())})


async def set_tenant_limits(request: web.Request) -> web.Response:
    """Override a tenant's limits; fields not given (or null) fall back to the config's."""
    _authorize(request)
    name = _tenant_name(request)
    if request.content_length is not None and request.content_length > MAX_ADMIN_BODY:
        raise BadRequest("admin request body too large")
    body = parse_body(await request.read())
    if not isinstance(body, Mapping):
        raise BadRequest(f"the body must be an object with any of: {', '.join(LIMIT_NAMES)}")
    try:
        limits = limits_from({k: v for k, v in body.items() if v is not None}, "limits")
    except ConfigError as exc:
        raise BadRequest(str(exc)) from exc
    tenants, now = request.app[TENANTS], time.monotonic()
    tenants.set_limits(name, limits, now)
    return web.json_response({"tenant": tenants.describe(name, now)})


async def reset_tenant_limits(request: web.Request) -> web.Response:
    _authorize(request)
    name = _tenant_name(request)
    tenants, now = request.app[TENANTS], time.monotonic()
    tenants.set_limits(name, None, now)
    return web.json_response({"tenant": tenants.describe(name, now)})


def _tenant_name(request: web.Request) -> str:
    try:
        return check_tenant_name(request.match_info["name"])
    except ConfigError as exc:
        raise BadRequest(str(exc)) from exc


def _explainer(endpoint: Endpoint) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def explain(request: web.Request) -> web.Response:
        state = _authorize(request)
        obj = parse_body(await request.read())
        key = key_of(endpoint, obj)
        scope = None
        if "tenant" in request.query:
            try:
                name = check_tenant_name(request.query["tenant"])
            except ConfigError as exc:
                raise BadRequest(str(exc)) from exc
            tenants = request.app[TENANTS]
            scope = TenantScope(tenants.get(name, time.monotonic()), tenants)
        key = await state.route_key(endpoint, key, obj, scope)
        view = key.view(state.router, f"explain-{request_id_of(request)}")
        candidates = state.registry.candidates(key.model)
        candidates = fitting(state.registry, candidates, needed_tokens(view))  # as serve routes
        decision = state.router.explain(view, time.monotonic(), candidates)
        return web.json_response(_explained(state, view.prompt_tokens, decision))

    return explain


def _explained(state: GatewayState, prompt_tokens: int, decision: Decision) -> dict[str, Any]:
    """The explanation's JSON: replicas by public name and URL (this is the admin API)."""
    name = state.registry.public_name
    return {
        "replica": name(decision.replica),
        "url": decision.replica,
        "reason": decision.reason.value,
        "policy": state.router.policy.name,
        "prompt_tokens": prompt_tokens,
        "predicted_cached_tokens": decision.predicted_cached_tokens,
        "candidates": [
            {
                "replica": name(c.replica),
                "url": c.replica,
                "chosen": c.replica == decision.replica,
                "matched_blocks": c.matched_blocks,
                "cached_tokens": c.cached_tokens,
                "in_flight": c.in_flight,
                "queued_prefill_tokens": c.queued_prefill_tokens,
                "predicted_ttft_s": c.predicted_ttft_s,
                "score": c.score,
            }
            for c in decision.candidates
        ],
    }
