"""Request ids: accept the client's ``x-request-id`` or make one; send it upstream and back.

The id is the outermost middleware's job, so every answer carries it, error answers included.
Relayed streams start inside the handler; the proxy adds the header to them itself
(``REQUEST_ID_HEADER`` in its extra headers).

A client's id is kept when it is short, plain text (letters, digits and ``._:@/+=-``, at most
128 characters) and not already used by a request in flight here. Anything else gets a fresh
one. The gateway's own id never collides, and a replica (vLLM takes ``X-Request-Id`` as its
request id) never sees two live requests with the same id from this gateway. Without that
check, one tenant could reuse another's live id, and an engine that keys aborts on it could
act on the wrong request.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Container

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

REQUEST_ID_HEADER = "x-request-id"
REQUEST_ID = web.RequestKey("prefixroute.request_id", str)
_VALID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")


def request_id_of(request: web.Request) -> str:
    """This request's id ("" outside the middleware, e.g. in unit tests of a handler)."""
    rid = request.get(REQUEST_ID)
    return rid if rid is not None else ""


def choose_request_id(given: str, taken: Container[str] = ()) -> str:
    """The client's id when it is acceptable and not ``taken``, else a new one."""
    return given if _VALID.fullmatch(given) and given not in taken else uuid.uuid4().hex


def make_request_id_middleware() -> Middleware:
    in_flight: set[str] = set()  # ids of this app's requests now running

    @web.middleware
    async def request_id_middleware(
        request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        rid = choose_request_id(request.headers.get(REQUEST_ID_HEADER, ""), in_flight)
        in_flight.add(rid)
        request[REQUEST_ID] = rid
        try:
            response = await handler(request)
        finally:
            in_flight.discard(rid)
        if not response.prepared:
            response.headers[REQUEST_ID_HEADER] = rid
        return response

    return request_id_middleware
