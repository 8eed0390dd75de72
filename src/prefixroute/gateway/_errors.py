"""The gateway's errors and the one table that maps every error to a status and a JSON body.

The gateway's branch of the one hierarchy (``prefixroute.core.errors`` draws all of it), with
the status each class answers (core errors first; gateway errors below ``GatewayError``)::

    PrefixrouteError                      500 anything else we raise on purpose
    ├── ConfigError                       400 a bad value in a request (or in an admin call)
    ├── NoReplicaAvailable                503 no healthy replica serves the request
    ├── RequestTooLarge                   400
    ├── ModelNotFound                     404 no replica serves the requested model
    └── GatewayError                      500
        ├── BadRequest                    400 a request we cannot route
        │   ├── InvalidJSON               400 the body is not JSON
        │   └── MalformedBody             400 the body cannot be read (Connection: close)
        ├── Unauthorized                  401 missing or wrong API key / admin bearer token
        ├── RequestTimeout                408 the client sent its body too slowly
        ├── NotFound                      404 an unknown admin resource
        ├── Conflict                      409 adding a replica twice
        ├── PayloadTooLarge               413 body over --max-body-bytes
        ├── UnsupportedMediaType          415 a prompt body declared as another type than JSON
        ├── TooManyRequests               429 over --max-in-flight (Retry-After)
        │   └── RateLimited               429 a tenant over one of its limits (names it)
        ├── Overloaded                    503 every candidate at its in-flight cap (Retry-After)
        │   └── Shed                      429 the same, from the endpoint picker (protocol 004)
        ├── ShuttingDown                  503 the gateway is draining for shutdown (Retry-After)
        └── UpstreamError                 502 the replica failed before its response started
            └── UpstreamTimeout           504 the replica did not answer in time
                └── AnswerTimeout         504 a plain answer silent past --read-timeout

aiohttp's own HTTP exceptions (an unknown path, a wrong method) keep their status. The lookup
walks the exception's MRO, so a subclass without its own row gets its parent's. The middleware
is the outermost layer: whatever escapes a handler becomes a JSON error, never a traceback.
Once a streamed response has started the status cannot change; the relay ends such streams
with an SSE error event itself, so no error ever reaches this table after the first byte.

On Anthropic's Messages API (``/v1/messages`` and its ``count_tokens``) the same errors take
Anthropic's shape, ``{"type": "error", "error": {"type": ..., "message": ...}}`` with its error
types by status (:func:`anthropic_error_body`): its SDKs and Claude Code read that shape, and
showed the gateway's 401s and 429s as raw JSON.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
from collections.abc import Callable

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from prefixroute._tracebacks import TracebackLimiter
from prefixroute.core import (
    ConfigError,
    ErrorSpec,
    NoReplicaAvailable,
    PrefixrouteError,
    RequestTooLarge,
    spec_along_mro,
)
from prefixroute.core import ModelNotFound as ModelNotFound  # raised by the registry, mapped here

log = logging.getLogger(__name__)


class GatewayError(PrefixrouteError):
    """Base of the errors the gateway raises on purpose."""


class BadRequest(GatewayError):
    """The request cannot be routed as sent."""


class MalformedBody(BadRequest):
    """The body could not be read (bad chunking, a short body, a ``Content-Encoding`` it does
    not have): aiohttp closes the connection after it, so the answer says so
    (``Connection: close``) and a keep-alive client does not lose its next request."""


class InvalidJSON(BadRequest):
    """The body is not valid JSON."""


class Unauthorized(GatewayError):
    """A request without a valid API key, or an admin call without the right bearer token."""


class UnsupportedMediaType(BadRequest):
    """A prompt body declared as something other than JSON."""


class RequestTimeout(GatewayError):
    """The client did not send its whole request body within the configured time."""


class NotFound(GatewayError):
    """An unknown resource (an admin replica id)."""


class Conflict(GatewayError):
    """The resource exists already."""


class PayloadTooLarge(GatewayError):
    """The request body is larger than the configured limit."""


class TooManyRequests(GatewayError):
    """The gateway is at its total in-flight cap."""


class RateLimited(TooManyRequests):
    """A tenant is over one of its limits; the body names the limit, Retry-After says when."""

    def __init__(self, message: str, limit: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.limit = limit  # the limit's config name, e.g. "requests_per_second"
        # Whole seconds, at least 1 (Retry-After takes an integer); None: the configured default.
        self.retry_after_s = None if retry_after_s is None else max(1, math.ceil(retry_after_s))


class Overloaded(GatewayError):
    """Every candidate replica is at its in-flight cap."""


class Shed(Overloaded):
    """:class:`Overloaded` as the endpoint picker answers it. Protocol 004 says a request the
    picker drops under load gets 429, 503 being for no ready endpoint (the reference picker
    answers its InferencePoolResourceExhausted so)."""


class ShuttingDown(GatewayError):
    """The gateway is shutting down and takes no new requests."""


class UpstreamError(GatewayError):
    """The replica failed (refused, reset, 5xx) before any response byte was relayed."""


class UpstreamTimeout(UpstreamError):
    """The replica did not connect or answer within the configured timeout."""


class AnswerTimeout(UpstreamTimeout):
    """A plain (non-streamed) answer's replica sent nothing of it for ``read_timeout_s``, while
    it answered others. Such an answer arrives whole when decoding ends, so the replica is most
    likely at work on a long one: neither retried (another replica would take as long) nor
    taken for the replica's failure (``_verdict``)."""


ERROR_TABLE: dict[type[BaseException], ErrorSpec] = {
    PrefixrouteError: ErrorSpec(500, "internal_error", "internal_error"),
    ConfigError: ErrorSpec(400, "invalid_request_error", "invalid_value"),
    RequestTooLarge: ErrorSpec(400, "invalid_request_error", "context_length_exceeded"),
    NoReplicaAvailable: ErrorSpec(503, "service_unavailable", "no_replica_available", True),
    BadRequest: ErrorSpec(400, "invalid_request_error", "invalid_request"),
    InvalidJSON: ErrorSpec(400, "invalid_request_error", "invalid_json"),
    Unauthorized: ErrorSpec(401, "authentication_error", "invalid_api_key"),
    RequestTimeout: ErrorSpec(408, "invalid_request_error", "request_timeout"),
    NotFound: ErrorSpec(404, "invalid_request_error", "not_found"),
    ModelNotFound: ErrorSpec(404, "invalid_request_error", "model_not_found"),
    Conflict: ErrorSpec(409, "invalid_request_error", "conflict"),
    PayloadTooLarge: ErrorSpec(413, "invalid_request_error", "request_too_large"),
    UnsupportedMediaType: ErrorSpec(415, "invalid_request_error", "unsupported_media_type"),
    TooManyRequests: ErrorSpec(429, "rate_limit_error", "too_many_requests", True),
    RateLimited: ErrorSpec(429, "rate_limit_error", "rate_limit_exceeded", True),
    Overloaded: ErrorSpec(503, "service_unavailable", "replicas_overloaded", True),
    Shed: ErrorSpec(429, "rate_limit_error", "replicas_overloaded", True),
    ShuttingDown: ErrorSpec(503, "service_unavailable", "shutting_down", True),
    UpstreamError: ErrorSpec(502, "upstream_error", "bad_gateway"),
    UpstreamTimeout: ErrorSpec(504, "upstream_error", "upstream_timeout"),
}
INTERNAL = ErrorSpec(500, "internal_error", "internal_error")


def spec_for(exc: BaseException) -> ErrorSpec:
    """The table row of the nearest class on ``exc``'s MRO (the catch-all row otherwise)."""
    return spec_along_mro(ERROR_TABLE, exc, INTERNAL)


_compact = functools.partial(json.dumps, separators=(",", ":"))


def error_body(message: str, err_type: str, code: str | int | None) -> dict[str, object]:
    return {"error": {"message": message, "type": err_type, "param": None, "code": code}}


# Anthropic's error types by status (its API's errors page); any other status: api_error.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 405: "invalid_request_error", 408: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
    504: "timeout_error",
}  # fmt: skip
ANTHROPIC_PATH = "/v1/messages"  # and what is below it (count_tokens)


def anthropic_error_body(message: str, status: int) -> dict[str, object]:
    """An error as Anthropic's Messages API writes it (module docstring)."""
    kind = _ANTHROPIC_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def is_anthropic(path: str) -> bool:
    """Whether ``path`` is Anthropic's Messages API, whose errors take its shape."""
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")


def error_response(exc: BaseException, retry_after_s: int, anthropic: bool = False) -> web.Response:
    """The JSON response for ``exc`` (in Anthropic's shape with ``anthropic``)."""
    if isinstance(exc, web.HTTPException):  # aiohttp's own: unknown route, wrong method
        body = error_body(exc.reason, "invalid_request_error", None)
        if anthropic:
            body = anthropic_error_body(exc.reason, exc.status)
        allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None  # a 405's
        return web.json_response(body, status=exc.status, headers=allow, dumps=_compact)
    spec = spec_for(exc)
    # Never show a foreign exception's text: it may carry internals.
    message = str(exc) if isinstance(exc, PrefixrouteError) else "internal error"
    if isinstance(exc, RateLimited) and exc.retry_after_s is not None:
        retry_after_s = exc.retry_after_s
    headers = {"Retry-After": str(retry_after_s)} if spec.retry_after else None
    body = error_body(message, spec.type, spec.code)
    if isinstance(exc, RateLimited):
        body["error"]["limit"] = exc.limit  # type: ignore[index]
    if anthropic:
        body = anthropic_error_body(message, spec.status)
    return web.json_response(body, status=spec.status, headers=headers, dumps=_compact)


Observer = Callable[[web.Request, web.StreamResponse], None]
CLIENT_CLOSED = 499  # nginx's status for a request whose client went away before its answer


def make_error_middleware(retry_after_s: int, observe: Observer | None = None) -> Middleware:
    """The outermost middleware: maps errors, then shows ``observe`` the final response (a
    request whose client went away, which cancels its handler, as a ``CLIENT_CLOSED`` one: it
    was counted nowhere before)."""
    tracebacks = TracebackLimiter(log)  # one per app: our own bugs, at most 1 per 10 s each

    @web.middleware
    async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except asyncio.CancelledError:
            # The client went away: one DEBUG line, as every client mistake (docs/security.md).
            log.debug("%s %.200r: %d the client went away", request.method, request.path,
                      CLIENT_CLOSED)  # fmt: skip
            if observe is not None:
                _show(observe, request, web.Response(status=CLIENT_CLOSED), tracebacks)
            raise
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            log.debug("%s %.200r: %d", request.method, request.path, exc.status)
            response = error_response(exc, retry_after_s, is_anthropic(request.path))
        except Exception as exc:
            _log_error(request, exc, tracebacks)
            response = error_response(exc, retry_after_s, is_anthropic(request.path))
            if isinstance(exc, MalformedBody):
                response.force_close()
        if observe is not None:
            _show(observe, request, response, tracebacks)
        return response

    return error_middleware


def _show(
    observe: Observer, request: web.Request, response: web.StreamResponse,
    tracebacks: TracebackLimiter,
) -> None:  # fmt: skip
    try:
        observe(request, response)
    except Exception as exc:  # metrics must never turn a good response into an error
        tracebacks.exception(exc, "response observer failed")


def _log_error(request: web.Request, exc: Exception, tracebacks: TracebackLimiter) -> None:
    """One line per error, a traceback only for our own bugs (rate-limited).

    What a client causes (a 4xx, or going away mid-answer) is DEBUG, which ``-v`` shows: at
    a higher level a client could fill the logs at will. The path is quoted and cut short for
    the same reason.
    """
    spec = spec_for(exc)
    if isinstance(exc, ConnectionError):  # aiohttp: writing to a client that disconnected
        log.debug("%s %.200r: the client went away (%s)", request.method, request.path,
                  type(exc).__name__)  # fmt: skip
    elif spec.status == 500:
        tracebacks.exception(exc, "unhandled error on %s %.200r", request.method, request.path)
    elif spec.status < 500:
        log.debug("%s %.200r: %d %s", request.method, request.path, spec.status, spec.code)
    else:
        log.info("%s %.200r: %d %s", request.method, request.path, spec.status, spec.code)
