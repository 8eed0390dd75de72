"""The ``Expect`` header, answered without aiohttp's default handler.

aiohttp calls a route's expect handler before any middleware. Its default handler answers an
unknown expectation with a 417 whose text repeats the header value, and a value that is not
valid UTF-8 (``Expect: \\x80``) makes building that text fail: a plain-text 500 that the error
middleware never sees. Found by the header fuzz suite (tests/gateway/test_fuzz.py). This handler
sends ``100 Continue`` as aiohttp does, and answers anything else with a JSON 417.
"""

from __future__ import annotations

import aiohttp
from aiohttp import web

from prefixroute.gateway._errors import error_response
from prefixroute.gateway._request_id import REQUEST_ID_HEADER, choose_request_id


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
    raise web.HTTPNotFound()


def add_catch_all(app: web.Application) -> None:
    """Register last: an unknown path (any method) is a 404 that goes through this expect
    handler and the middlewares too; aiohttp's own 404/405 route would use its default one.
    A known path with a wrong method is then a 404 rather than a 405."""
    app.router.add_route("*", "/{tail:.*}", not_found, expect_handler=expect_handler)
