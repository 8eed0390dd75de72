"""Relaying one upstream response to the client, byte for byte.

* Headers go both ways untouched (Authorization included) except hop-by-hop headers, which
  belong to one connection, and ``Content-Length``, which aiohttp sets for what it sends.
* A plain response is read whole and sent as one body (a JSON completion is small, and reading
  it whole lets a failure mid-body still be retried: nothing has reached the client).
* An event stream is written out chunk by chunk as it arrives (cut at event boundaries, see
  ``_sse``). The client's response starts with the first complete event, so a replica that dies
  before sending any event can still be retried. After that, an upstream failure ends the stream
  with an SSE error event and ``data: [DONE]``: the status is already sent and cannot change.

Upstream errors before the client's response started are raised as ``UpstreamError`` (the
proxy retries them); the client going away is not an upstream failure and is never retried.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from prefixroute.gateway._errors import UpstreamError, UpstreamTimeout, error_body
from prefixroute.gateway._sse import SSEScanner
from prefixroute.gateway._usage import cached_tokens_in_body

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# Host and Content-Length describe the new request; Expect is answered by this server already.
_NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length", "expect"}
_NOT_RELAYED = HOP_BY_HOP | {"content-length"}


@dataclass(slots=True)
class RelayResult:
    response: web.StreamResponse  # what the handler returns
    status: int  # upstream status, relayed as is
    cached_tokens: int | None  # usage.prompt_tokens_details.cached_tokens, when reported
    failure: str | None = None  # the stream broke after it started: the failure kind
    client_gone: bool = False  # the client stopped reading


def _without(headers: Mapping[str, str], drop: frozenset[str]) -> CIMultiDict[str]:
    connection = headers.get("Connection")
    if connection:  # headers named in Connection are hop-by-hop too (RFC 9110, 7.6.1)
        drop = drop | {t.strip().lower() for t in connection.split(",")}
    return CIMultiDict([(k, v) for k, v in headers.items() if k.lower() not in drop])


def request_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """The client's headers as the replica should see them."""
    return _without(headers, _NOT_FORWARDED)


def response_headers(headers: CIMultiDictProxy[str], extra: Mapping[str, str]) -> CIMultiDict[str]:
    out = _without(headers, _NOT_RELAYED)
    out.update(extra)
    return out


def is_event_stream(resp: aiohttp.ClientResponse) -> bool:
    return resp.headers.get("Content-Type", "").startswith("text/event-stream")


def failure_kind(exc: BaseException) -> str:
    """A short label for an upstream failure (a metrics label value)."""
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect"
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return "disconnect"
    return "error"


def upstream_error(exc: BaseException, replica: str) -> UpstreamError:
    """The gateway error for a foreign upstream exception (chain it with ``from``)."""
    if isinstance(exc, TimeoutError):
        return UpstreamTimeout(f"replica {replica} did not answer in time")
    return UpstreamError(f"replica {replica} failed: {type(exc).__name__}")


async def relay_plain(resp: aiohttp.ClientResponse, extra: Mapping[str, str]) -> RelayResult:
    """Read the whole body, then answer with it (errors while reading propagate)."""
    body = await resp.read()
    out = web.Response(status=resp.status, body=body, headers=response_headers(resp.headers, extra))
    plain = resp.status == 200 and "Content-Encoding" not in resp.headers
    return RelayResult(out, resp.status, cached_tokens_in_body(body) if plain else None)


async def relay_stream(
    request: web.Request,
    resp: aiohttp.ClientResponse,
    extra: Mapping[str, str],
    replica: str,
    on_first_data: Callable[[], None],
) -> RelayResult:
    """Relay an event stream as it arrives; raises UpstreamError only before the first byte."""
    # A compressed stream cannot be cut at event boundaries: relay it raw, unobserved.
    scanner = SSEScanner() if "Content-Encoding" not in resp.headers else None
    out: web.StreamResponse | None = None
    failure: str | None = None
    waiting_first = True
    try:
        while True:
            try:
                chunk = await resp.content.readany()
            except (aiohttp.ClientError, TimeoutError) as exc:
                if out is None:
                    raise upstream_error(exc, replica) from exc
                failure = failure_kind(exc)
                break
            if chunk:
                ready = scanner.feed(chunk) if scanner is not None else chunk
            else:  # the upstream ended its stream
                ready = scanner.flush() if scanner is not None else b""
            if out is None and (ready or not chunk):
                headers = response_headers(resp.headers, extra)
                out = web.StreamResponse(status=resp.status, headers=headers)
                await out.prepare(request)
            if ready:
                if waiting_first and (scanner is None or scanner.saw_data):
                    waiting_first = False
                    on_first_data()
                assert out is not None
                await out.write(ready)
            if not chunk:
                break
    except ConnectionResetError:  # the client went away (aiohttp's reset error subclasses it)
        assert out is not None
        return RelayResult(out, resp.status, None, failure, client_gone=True)
    assert out is not None
    cached = scanner.cached_tokens if scanner is not None else None
    if failure is not None:
        await _end_with_error(out, f"replica {replica} failed mid-stream ({failure})")
    else:
        await _write_eof(out)
    return RelayResult(out, resp.status, cached, failure)


async def _end_with_error(out: web.StreamResponse, message: str) -> None:
    """End a started stream the way vLLM ends a failed one: an error event, then [DONE]."""
    body = json.dumps(error_body(message, "upstream_error", 502), separators=(",", ":"))
    try:
        await out.write(f"data: {body}\n\ndata: [DONE]\n\n".encode())
    except ConnectionResetError:
        return
    await _write_eof(out)


async def _write_eof(out: web.StreamResponse) -> None:
    with contextlib.suppress(ConnectionResetError):
        await out.write_eof()
