"""An upstream's failure as the gateway names it: a gateway error for the client (``_errors``)
and a short kind for the metrics and the fault rules (``_verdict``)."""

from __future__ import annotations

import aiohttp

from prefixroute.gateway._errors import AnswerTimeout, UpstreamError, UpstreamTimeout


def failure_kind(exc: BaseException) -> str:
    """A short label for an upstream failure (a metrics label value)."""
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect"
    # A reset (ClientOSError: ECONNRESET, EPIPE) breaks the connection as a close does; the
    # connector's own errors, its subclass, were taken above.
    broken = aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError | aiohttp.ClientOSError
    if isinstance(exc, broken):
        return "disconnect"
    return "error"


def upstream_error(
    exc: BaseException, replica: str, plain_limit_s: float | None = None
) -> UpstreamError:
    """The gateway error for a foreign upstream exception (chain it with ``from``).
    ``plain_limit_s``: the read timeout, given when the request wants a plain answer and its
    replica answered others meanwhile; a read that ran out of it is then an
    :class:`AnswerTimeout` (a connection that timed out is not)."""
    if plain_limit_s is not None and isinstance(exc, aiohttp.SocketTimeoutError):
        return AnswerTimeout(
            f"replica {replica} sent nothing for {plain_limit_s:g} s; a plain answer arrives "
            "whole when it is done, so one that takes longer needs a stream or a larger "
            "read_timeout_s (--read-timeout)"
        )
    if isinstance(exc, TimeoutError):
        return UpstreamTimeout(f"replica {replica} did not answer in time")
    return UpstreamError(f"replica {replica} failed: {type(exc).__name__}")
