"""At the door: what every request meets before and beside routing, whichever route it takes.

Three small jobs that share one concern, what happens to a request as a request (never as a
prompt), and all key on its id:

**Request ids.** Accept the client's ``x-request-id`` or make one; send it upstream and back.
The id is the outermost middleware's job, so every answer carries it, error answers included.
Relayed streams start inside the handler; the proxy adds the header to them itself
(``REQUEST_ID_HEADER`` in its extra headers). A client's id is kept when it is short, plain
text (letters, digits and ``._:@/+=-``, at most 128 characters) and not already used by a
request in flight here. Anything else gets a fresh one. The gateway's own id never collides, and
a replica (vLLM takes ``X-Request-Id`` as its request id) never sees two live requests with the
same id from this gateway. Without that check, one tenant could reuse another's live id, and an
engine that keys aborts on it could act on the wrong request.

**The Expect header**, answered without aiohttp's default handler. aiohttp calls a route's
expect handler before any middleware. Its default handler answers an unknown expectation with a
417 whose text repeats the header value, and a value that is not valid UTF-8 (``Expect: \\x80``)
makes building that text fail: a plain-text 500 that the error middleware never sees. Found by
the header fuzz suite (tests/gateway/test_fuzz.py). :func:`expect_handler` sends ``100
Continue`` as aiohttp does, and answers anything else with a JSON 417; :func:`add_catch_all`
sends unknown paths through it too.

**Body logging**, for debugging only (``--log-bodies``). Off by default: the gateway's logs never
carry prompt or completion text otherwise (the proxy logs ids, replicas, reasons, statuses and
counts). With the flag, each proxied request body and each whole (non-stream) response body is
logged at INFO on ``prefixroute.gateway.bodies``, cut to ``MAX_LOGGED`` bytes, next to the
request id. Streams are not logged.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Container

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from prefixroute.gateway._errors import error_response

# --- request ids -------------------------------------------------------------------------------
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
    async def request_id_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
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


# --- Expect, and unknown paths -----------------------------------------------------------------
async def expect_handler(request: web.Request) -> web.StreamResponse | None:
    if request.version != aiohttp.HttpVersion11:
        return None  # HTTP/1.0 has no Expect; ignore it, as aiohttp does
    if request.headers.get("Expect", "").lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the final answer's size starts after the 100
        return None
    response = error_response(web.HTTPExpectationFailed(), 0)
    # Answered before the middlewares run: carry a request id like every other answer.
    response.headers[REQUEST_ID_HEADER] = choose_request_id(
        request.headers.get(REQUEST_ID_HEADER, "")
    )
    return response


async def not_found(request: web.Request) -> web.StreamResponse:
    """A 404, or a 405 naming the methods (``Allow``) when another route has the path: "Not
    Found" for ``GET /v1/chat/completions`` sent users looking for a wrong base URL."""
    allowed: set[str] = set()
    for resource in request.app.router.resources():
        match, methods = await resource.resolve(request)
        if match is None:  # its path matched with another method (else methods is empty)
            allowed |= methods
    if allowed:
        raise web.HTTPMethodNotAllowed(request.method, sorted(allowed))
    raise web.HTTPNotFound()


def add_catch_all(app: web.Application) -> None:
    """Register last: an unknown path (any method) is a 404, and a known path with a wrong
    method a 405 (:func:`not_found`), that go through this expect handler and the middlewares
    too; aiohttp's own 404/405 route would use its default one."""
    app.router.add_route("*", "/{tail:.*}", not_found, expect_handler=expect_handler)


# --- body logging ------------------------------------------------------------------------------
LOG_BODIES = web.AppKey("prefixroute.gateway.log_bodies", bool)
MAX_LOGGED = 4096  # bytes of a body that reach the log
body_log = logging.getLogger("prefixroute.gateway.bodies")


def log_request_body(app: web.Application, request_id: str, body: bytes) -> None:
    if app.get(LOG_BODIES):
        body_log.info("%s request body (%d bytes): %r", request_id, len(body), _cut(body))


def log_response_body(app: web.Application, request_id: str, response: web.StreamResponse) -> None:
    if not app.get(LOG_BODIES) or not isinstance(response, web.Response):
        return
    body = response.body
    if isinstance(body, bytes):
        body_log.info("%s response body (%d bytes): %r", request_id, len(body), _cut(body))


def _cut(body: bytes) -> bytes:
    return body if len(body) <= MAX_LOGGED else body[:MAX_LOGGED] + b"..."
