"""The emulated replica's errors and the one table that turns them into OpenAI-style responses.

The emulated replica's part of the one hierarchy (``prefixroute.core.errors`` draws all of it),
with the status each class answers::

    PrefixrouteError                (core)
    ├── ConfigError                 400 a value the model rejects
    ├── RequestTooLarge             400 the prompt can never fit the KV cache
    ├── ModelNotFound               404 a ``model`` this replica does not serve (core)
    ├── EngineStopped               503 the engine loop is not running (in _engine)
    └── EmulateError                500
        ├── InvalidRequest          400 malformed JSON or a bad field
        └── UnknownResponse         404 a stored response this replica does not hold

Bodies are ``{"error": {"message", "type", "param", "code"}}`` as OpenAI sends them; ``code``
is the HTTP status, as vLLM fills it (so the rows leave ``ErrorSpec.code`` unset). The table is
looked up along the exception's MRO, and an outermost catch-all answers anything else with a
JSON 500 instead of a traceback.
"""

from __future__ import annotations

import functools
import json
import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from prefixroute.core import (
    ConfigError,
    ErrorSpec,
    ModelNotFound,
    PrefixrouteError,
    RequestTooLarge,
    spec_along_mro,
)
from prefixroute.emulate._engine import EngineStopped

log = logging.getLogger(__name__)


class EmulateError(PrefixrouteError):
    """Base of the errors the emulated replica raises on purpose."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param  # the request field at fault, when there is one


class InvalidRequest(EmulateError):
    """The request body is not valid JSON or has a bad field."""


class UnknownResponse(EmulateError):
    """A Responses API call names a response this replica has not stored."""


ERROR_TABLE: dict[type[BaseException], ErrorSpec] = {
    InvalidRequest: ErrorSpec(400, "BadRequestError"),
    ConfigError: ErrorSpec(400, "BadRequestError"),
    RequestTooLarge: ErrorSpec(400, "BadRequestError"),
    ModelNotFound: ErrorSpec(404, "NotFoundError"),
    UnknownResponse: ErrorSpec(404, "invalid_request_error"),  # vLLM's type for it
    EngineStopped: ErrorSpec(503, "ServiceUnavailableError"),
    PrefixrouteError: ErrorSpec(500, "InternalServerError"),
}
_INTERNAL = ErrorSpec(500, "InternalServerError")


def spec_for(exc: BaseException) -> ErrorSpec:
    """The table row of the nearest class on ``exc``'s MRO (the catch-all row otherwise)."""
    return spec_along_mro(ERROR_TABLE, exc, _INTERNAL)


def error_response(
    status: int, err_type: str, message: str, param: str | None = None
) -> web.Response:
    body = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return web.json_response(body, status=status, dumps=_compact)


_compact = functools.partial(json.dumps, separators=(",", ":"))


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Outermost layer: every error becomes a JSON body; never a traceback."""
    try:
        return await handler(request)
    except web.HTTPException as exc:  # routing misses (404/405) from aiohttp itself
        if exc.status < 400:
            raise
        return error_response(
            exc.status, "NotFoundError" if exc.status == 404 else "Error", exc.reason
        )
    except Exception as exc:
        spec = spec_for(exc)
        if spec.status >= 500:
            log.error("request failed: %s: %s", type(exc).__name__, exc)
            message = str(exc) if isinstance(exc, PrefixrouteError) else "internal error"
        else:
            message = str(exc)
        param = exc.param if isinstance(exc, EmulateError) else None
        return error_response(spec.status, spec.type, message, param)
