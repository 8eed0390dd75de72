"""Logging request and response bodies, for debugging only (``--log-bodies``).

Off by default: the gateway's logs never carry prompt or completion text otherwise (the proxy
logs ids, replicas, reasons, statuses and counts). With the flag, each proxied request body and
each whole (non-stream) response body is logged at INFO on ``prefixroute.gateway.bodies``, cut
to ``MAX_LOGGED`` bytes, next to the request id. Streams are not logged.
"""

from __future__ import annotations

import logging

from aiohttp import web

from prefixroute.gateway._request_id import request_id_of

LOG_BODIES = web.AppKey("prefixroute.gateway.log_bodies", bool)
MAX_LOGGED = 4096  # bytes of a body that reach the log
log = logging.getLogger("prefixroute.gateway.bodies")


def log_request_body(request: web.Request, body: bytes) -> None:
    if request.app.get(LOG_BODIES):
        log.info("%s request body (%d bytes): %r", request_id_of(request), len(body), _cut(body))


def log_response_body(request: web.Request, response: web.StreamResponse) -> None:
    if not request.app.get(LOG_BODIES) or not isinstance(response, web.Response):
        return
    body = response.body
    if isinstance(body, bytes):
        log.info(
            "%s response body (%d bytes): %r", request_id_of(request), len(body), _cut(body)
        )


def _cut(body: bytes) -> bytes:
    return body if len(body) <= MAX_LOGGED else body[:MAX_LOGGED] + b"..."
