"""The admin API: list, add, drain and remove replicas at runtime, behind a bearer token.

    GET    /admin/replicas                  {"replicas": [...]}
    POST   /admin/replicas                  body {"url": "http://host:port"} -> 201 {"replica": ...}
    POST   /admin/replicas/{id}/drain       no new requests; in-flight ones finish -> 200
    DELETE /admin/replicas/{id}             forget it (its in-flight requests still finish) -> 200

``{id}`` is the replica's URL, URL-quoted (``http%3A%2F%2F10.0.0.11%3A8000``) or as is. Every
call needs ``Authorization: Bearer <token>`` with the token given at start; the comparison is
constant-time (``hmac.compare_digest``). Without a token the admin API is not mounted at all.
A replica added here is probed at once and, if it answers, takes traffic from the next request.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from aiohttp import web

from prefixroute.core import ConfigError
from prefixroute.gateway._errors import BadRequest, Unauthorized
from prefixroute.gateway._requests import parse_body
from prefixroute.gateway._state import STATE, GatewayState

MAX_ADMIN_BODY = 64 * 1024  # bytes


def add_routes(app: web.Application) -> None:
    app.router.add_get("/admin/replicas", list_replicas)
    app.router.add_post("/admin/replicas", add_replica)
    app.router.add_post(r"/admin/replicas/{ref:.+}/drain", drain_replica)
    app.router.add_delete(r"/admin/replicas/{ref:.+}", remove_replica)


def _authorize(request: web.Request) -> GatewayState:
    state = request.app[STATE]
    token = state.config.admin_token
    given = request.headers.get("Authorization", "")
    scheme, _, credential = given.partition(" ")
    ok = token is not None and scheme.lower() == "bearer"
    # Compare even when the scheme is wrong, so timing does not tell which part failed.
    match = hmac.compare_digest(credential.strip().encode(), (token or "").encode())
    if not (ok and match):
        raise Unauthorized("a valid admin bearer token is required")
    return state


async def list_replicas(request: web.Request) -> web.Response:
    state = _authorize(request)
    return web.json_response({"replicas": [state.registry.describe(r) for r in state.registry]})


async def add_replica(request: web.Request) -> web.Response:
    state = _authorize(request)
    if request.content_length is not None and request.content_length > MAX_ADMIN_BODY:
        raise BadRequest("admin request body too large")
    body = parse_body(await request.read())
    if not isinstance(body, Mapping) or not isinstance(body.get("url"), str):
        raise BadRequest('the body must be {"url": "http://host:port"}')
    try:
        record = state.registry.add(body["url"])
    except ConfigError as exc:
        raise BadRequest(str(exc)) from exc
    if state.health is not None:
        await state.health.check(record, first=True)
    return web.json_response({"replica": state.registry.describe(record)}, status=201)


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
