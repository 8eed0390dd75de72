"""Relaying a plain (non-streamed) answer: read whole, then sent (``_relay``'s module docstring).

Read whole so that a failure mid-body can still be retried elsewhere (nothing reached the
client), and so that its usage can be read once it has gone out (``RelayResult.read_usage``).
Bounded twice: an answer over ``MAX_PLAIN_BYTES`` is not held at all, and one over the client
buffer is written with the slow-client cut, not left whole in the transport's buffer.
"""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp
from aiohttp import web

from prefixroute.gateway._config import GatewayConfig
from prefixroute.gateway._errors import error_body
from prefixroute.gateway._relay import (
    RelayResult,
    SlowClient,
    Watch,
    abort,
    hold_for_client,
    response_headers,
    write,
    write_eof,
)
from prefixroute.gateway._upstream_answers import busy_answer

MAX_PLAIN_BYTES = 128 << 20  # a plain answer held for one request at most, bytes


async def relay_plain(
    request: web.Request, resp: aiohttp.ClientResponse, extra: Mapping[str, str],
    config: GatewayConfig,
) -> RelayResult:  # fmt: skip
    """Read the whole body, then answer with it (errors while reading propagate). A body that
    fits ``client_buffer_bytes`` is left to the transport's buffer, so no task waits on a
    client that reads it slowly; a larger one is written here, and a client that makes no room
    for it in ``client_write_timeout_s`` is cut, as a stream's is. Left whole in the buffer, a
    130 MB answer stayed in memory for as long as its client did not read (an outside audit,
    2026-12-07).
    One over ``MAX_PLAIN_BYTES`` is not read: the client gets a 502 saying so, and no one is
    blamed (its request asked for it)."""
    buffer_bytes, write_timeout_s = config.client_buffer_bytes, config.client_write_timeout_s
    with Watch(resp):
        body = await _read_bounded(resp, MAX_PLAIN_BYTES)
    if body is None:
        resp.close()  # the rest unread: the connection cannot be pooled
        message = (f"the replica's answer is over {MAX_PLAIN_BYTES >> 20} MiB, more than the "
                   "gateway holds for one request: ask for it as a stream (stream: true)")
        refusal = web.json_response(error_body(message, "server_error", "answer_too_large"),
                                    status=502)  # fmt: skip
        return RelayResult(refusal, resp.status, None, cut="answer_too_large")
    headers = response_headers(resp.headers, extra)
    plain = resp.status == 200 and "Content-Encoding" not in resp.headers
    busy = busy_answer(resp.status, body)  # (a 2xx is not: its body is not searched)
    kept = body if plain else None
    if len(body) <= buffer_bytes:
        hold_for_client(request, buffer_bytes)
        whole = web.Response(status=resp.status, body=body, headers=headers)
        return RelayResult(whole, resp.status, None, body=kept, busy=busy)
    out = web.StreamResponse(status=resp.status, headers=headers)
    out.content_length = len(body)
    try:
        await out.prepare(request)
        await write(out, body, write_timeout_s)
        await write_eof(out, write_timeout_s)
    except ConnectionResetError:  # the client went away
        return RelayResult(out, resp.status, None, body=kept, busy=busy, client_gone=True)
    except SlowClient:
        abort(request)
        return RelayResult(out, resp.status, None, body=kept, busy=busy, client_gone=True,
                           cut="slow_client")  # fmt: skip
    return RelayResult(out, resp.status, None, body=kept, busy=busy)


async def _read_bounded(resp: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """``resp``'s whole body, or None once it is over ``limit`` bytes (read no further)."""
    if resp.content_length is not None:  # (most answers say their length)
        return await resp.read() if resp.content_length <= limit else None
    if resp.content.at_eof():  # read already (a 4xx looked at, _upstream_answers): aiohttp
        return await resp.read()  # keeps it
    chunks, size = [], 0
    async for chunk in resp.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
