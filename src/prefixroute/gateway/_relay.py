"""Relaying one upstream response to the client, byte for byte.

* Headers go both ways untouched (Authorization included) except hop-by-hop headers, which
  belong to one connection, and ``Content-Length``, which aiohttp sets for what it sends.
* A plain response is read whole and sent as one body (a JSON completion is small, and reading
  it whole lets a failure mid-body still be retried: nothing has reached the client), within
  bounds (``_relay_plain``).
* An event stream is written out chunk by chunk as it arrives (cut at event boundaries, see
  ``_sse``). The client's response starts with the first complete event, so a replica that dies
  before sending any event can still be retried. After that, an upstream failure ends the stream
  with an SSE error event and ``data: [DONE]``: the status is already sent and cannot change.

Upstream errors before the client's response started are raised as ``UpstreamError`` (the
proxy retries them); the client going away is not an upstream failure and is never retried.

**Slots follow the engine, not the client.** The transport may hold up to ``buffer_bytes`` for
a client that reads slowly, so the relay keeps reading the replica at the replica's pace and
hears its end while the client is still reading; ``on_upstream_end`` then releases the
replica's in-flight slot at once. Past that buffer a write waits for the client, and a client
that takes more than ``write_timeout_s`` to make room is cut (its connection aborted, counted):
a reader at one byte a second holds neither a replica slot nor a task for long.

**Shutdown.** When the drain bound passes, the gateway cancels the handlers still running
(``is_cutting`` is then true): a started stream ends with an SSE error event and ``[DONE]``,
so no client mistakes a cut for a complete answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from prefixroute.gateway._errors import (
    anthropic_error_body,
    error_body,
    is_anthropic,
)
from prefixroute.gateway._failures import failure_kind, upstream_error
from prefixroute.gateway._sse import (
    SSEScanner,
    first_error_event,
    is_event_stream_type,
    only_comments,
)
from prefixroute.gateway._upstream_answers import ReplicaBusy, busy_answer
from prefixroute.gateway._usage import Usage, answer_in_body

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
# Content-Encoding: aiohttp decoded the client's body, and the replica gets it decoded (a
# forwarded gzip header on a plain body made replicas fail with 500, blamed on them).
_NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length", "expect", "content-encoding"}
_NOT_RELAYED = HOP_BY_HOP | {"content-length"}


@dataclass(slots=True)
class RelayResult:
    response: web.StreamResponse  # what the handler returns
    status: int  # upstream status, relayed as is
    cached_tokens: int | None  # usage.prompt_tokens_details.cached_tokens, when reported
    failure: str | None = None  # the stream broke after it started: the failure kind
    client_gone: bool = False  # the client stopped reading (or was cut for reading too slowly)
    cut: str | None = None  # we ended the stream early: "slow_client" or "shutdown"
    usage: Usage | None = None  # the replica's token counts, when it reported them
    error_status: int | None = None  # a 200 stream reported an error in-band: its code (_sse)
    body: bytes | None = None  # a plain answer's body, its usage not read yet (read_usage)
    # A plain Responses answer's id (read_usage; a stream's is told as it comes: StreamControl)
    response_id: str | None = None
    busy: bool = False  # a full replica's answer, relayed with nowhere else to go (_verdict)

    def read_usage(self) -> Usage | None:
        """The usage (and a Responses answer's id), read from a plain answer's body on the
        first call: the gateway reads it once the answer has gone out (its parse is no wait of
        the client's, 10-60 us)."""
        if self.body is not None:
            self.usage, self.response_id = answer_in_body(self.body)
            self.body = None
            self.cached_tokens = self.usage.cached_tokens if self.usage is not None else None
        return self.usage


@dataclass(slots=True)
class StreamControl:
    """What the proxy tells a stream relay, and the calls by which it hears back."""

    replica: str  # the replica as clients may see it (error messages)
    on_started: Callable[[], None]  # the client's response started: no retry from here on
    on_first_data: Callable[[], None]  # the first event with output went out (first token)
    # The replica is done with it: release its slot, with the usage it reported (or None).
    on_upstream_end: Callable[[Usage | None], None]
    is_cutting: Callable[[], bool]  # the shutdown drain bound has passed
    buffer_bytes: int  # bytes the transport may hold for a slow client
    write_timeout_s: float  # longest wait for a client to make room, seconds
    hide_usage: bool = False  # the gateway asked for the usage: keep its event from the client
    # A Responses stream's id (its replica may store it), told before the client sees it: a
    # client that continues it the moment it reads the end must find its replica known.
    on_response_id: Callable[[str], None] | None = None
    can_move: bool = False  # another replica may take it: a busy replica's stream goes there


class SlowClient(Exception):
    """The client did not make room for our writes in time."""


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
    return is_event_stream_type(resp.headers.get("Content-Type", ""))


WATCH_S = 1.0  # seconds between looks at an upstream connection while its answer is read


class Watch:
    """aiohttp's C parser, given a malformed chunk by a replica, drops the connection without
    ending the body's reader: a read then waited forever, past the read timeout, holding the
    client and its in-flight slot. Every ``WATCH_S`` while an answer is read, a connection
    found gone with the body neither ended nor failed fails it, as a reset does."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp
        self.handle = asyncio.get_running_loop().call_later(WATCH_S, self._look)

    def _look(self) -> None:
        content, conn = self.resp.content, self.resp.connection
        if content.is_eof() or content.exception() is not None or conn is None:
            return  # ended (or released): nothing left to watch
        if conn.protocol is None or conn.protocol.transport is None:
            lost = "the replica's connection closed with its answer unfinished"
            content.set_exception(aiohttp.ClientPayloadError(lost))
            return
        self.handle = asyncio.get_running_loop().call_later(WATCH_S, self._look)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.cancel()


async def relay_stream(
    request: web.Request,
    resp: aiohttp.ClientResponse,
    extra: Mapping[str, str],
    ctl: StreamControl,
) -> RelayResult:
    """Relay an event stream as it arrives; raises UpstreamError only before the first byte."""
    relay = _StreamRelay(request, resp, extra, ctl)
    failure: str | None = None
    try:
        with Watch(resp):
            failure = await relay.pump()
        await relay.end(failure)
    except ConnectionResetError:  # the client went away (aiohttp's reset error subclasses it)
        return RelayResult(relay.started(), resp.status, None, failure, client_gone=True)
    except SlowClient:
        out = relay.started()
        abort(request)
        return RelayResult(out, resp.status, None, failure, client_gone=True, cut="slow_client")
    except asyncio.CancelledError:
        if relay.out is None or not ctl.is_cutting():
            raise  # a client that left, or a first-byte deadline: not ours to answer
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        await relay.end_at_shutdown()
        return RelayResult(relay.started(), resp.status, None, None, cut="shutdown")
    scanner = relay.scanner
    usage = scanner.usage if scanner is not None else None
    cached = usage.cached_tokens if usage is not None else None
    error = scanner.error_status if scanner is not None else None
    return RelayResult(relay.started(), resp.status, cached, failure, usage=usage,
                       error_status=error, busy=relay.busy)  # fmt: skip


class _StreamRelay:
    """One event stream on its way to the client: read, cut at event boundaries, written.

    The client's response starts with the first complete event (``out`` is None until then),
    so a replica that fails before any event can still be retried elsewhere."""

    def __init__(
        self,
        request: web.Request,
        resp: aiohttp.ClientResponse,
        extra: Mapping[str, str],
        ctl: StreamControl,
    ) -> None:
        self.request, self.resp, self.extra, self.ctl = request, resp, extra, ctl
        # A compressed stream cannot be cut at event boundaries: relay it raw, unobserved.
        compressed = "Content-Encoding" in resp.headers
        responses = ctl.on_response_id is not None  # a Responses stream: its id is watched for
        self.scanner = None if compressed else SSEScanner(ctl.hide_usage, responses)
        self.out: web.StreamResponse | None = None  # the client's response, once started
        self._waiting_first = True  # no data event relayed yet
        self._held = b""  # keep-alive comments that came before the first event (_relay)
        self._id_untold = ctl.on_response_id is not None  # a Responses stream's id, not told
        self.busy = False  # it opened with a full replica's error, relayed (nowhere else)

    def started(self) -> web.StreamResponse:
        assert self.out is not None, "the client's response had started"
        return self.out

    async def pump(self) -> str | None:
        """Relay until the upstream ends; the failure kind when it broke after the start."""
        while True:
            try:
                chunk = await self.resp.content.readany()
            except (aiohttp.ClientError, TimeoutError) as exc:
                if self.out is None:
                    raise upstream_error(exc, self.ctl.replica) from exc
                return failure_kind(exc)
            await self._relay(chunk)
            if not chunk:  # the upstream ended its stream
                return None

    async def _relay(self, chunk: bytes) -> None:
        scanner = self.scanner
        if chunk:
            ready = scanner.feed(chunk) if scanner is not None else chunk
        else:
            ready = scanner.flush() if scanner is not None else b""
        if self.out is None and chunk and scanner is not None and ready and only_comments(ready):
            # Keep-alive comments before any event are no start: held, so that a replica
            # that fails now is still retried elsewhere and the first-byte deadline still runs
            # (a replica that only ever pinged held a stream past every timeout).
            self._held += ready
            return
        if self._held:
            ready, self._held = self._held + ready, b""
        if self.out is None and ready and scanner is not None and not scanner.saw_data:
            error = first_error_event(ready)
            self.busy = error is not None and busy_answer(*error)  # a full replica's, in-band
            if self.busy and self.ctl.can_move:  # elsewhere, as its 503 would go
                raise ReplicaBusy(f"replica {self.ctl.replica} is busy (in-band)")
        if self.out is None and (ready or not chunk):
            self.out = web.StreamResponse(
                status=self.resp.status, headers=response_headers(self.resp.headers, self.extra)
            )
            await self.out.prepare(self.request)
            hold_for_client(self.request, self.ctl.buffer_bytes)
            self.ctl.on_started()
        if ready:
            if self._id_untold and scanner is not None and scanner.response_id is not None:
                self._id_untold = False
                assert self.ctl.on_response_id is not None
                self.ctl.on_response_id(scanner.response_id)
            if self._waiting_first and (scanner is None or scanner.saw_data):
                self._waiting_first = False
                self.ctl.on_first_data()
            await write(self.started(), ready, self.ctl.write_timeout_s)

    async def end(self, failure: str | None) -> None:
        """The replica is done: release its slot, then end the client's stream (with an SSE
        error event when the upstream broke)."""
        ctl = self.ctl
        usage = self.scanner.usage if self.scanner is not None and failure is None else None
        ctl.on_upstream_end(usage)
        if failure is not None:
            message = f"replica {ctl.replica} failed mid-stream ({failure})"
            await self._end_in_error(message, 502, "upstream_error", ctl.write_timeout_s)
        else:
            await write_eof(self.started(), ctl.write_timeout_s)

    async def end_at_shutdown(self) -> None:
        """The drain bound passed: release the slot, and tell the client the stream was cut."""
        self.ctl.on_upstream_end(None)
        message, timeout_s = "the gateway shut down mid-stream", min(self.ctl.write_timeout_s, 1.0)
        with contextlib.suppress(SlowClient):
            await self._end_in_error(message, 503, "service_unavailable", timeout_s)

    async def _end_in_error(self, message: str, status: int, kind: str, timeout_s: float) -> None:
        """End the client's stream with an error event, after the finish chunks held for a
        fingerprint that will not come (``_sse``)."""
        out = self.started()
        if self.scanner is not None and (held := self.scanner.release()):
            await write(out, held, timeout_s)
        body = error_body(message, kind, status)
        await _end_with_error(out, body, timeout_s, self._anthropic(message, status))

    def _anthropic(self, message: str, status: int) -> dict[str, object] | None:
        """The error in Anthropic's shape on its Messages API, else None."""
        if not is_anthropic(self.request.path):
            return None
        return anthropic_error_body(message, status)


def hold_for_client(request: web.Request, buffer_bytes: int) -> None:
    """Let the transport buffer up to ``buffer_bytes`` before writes wait for the client."""
    transport = request.transport
    if transport is not None:
        transport.set_write_buffer_limits(high=buffer_bytes)


def abort(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()


async def write(out: web.StreamResponse, data: bytes, timeout_s: float) -> None:
    try:
        async with asyncio.timeout(timeout_s):
            await out.write(data)
    except TimeoutError:
        raise SlowClient from None


async def _end_with_error(
    out: web.StreamResponse, error: Mapping[str, object], timeout_s: float,
    anthropic: Mapping[str, object] | None = None,
) -> None:  # fmt: skip
    """End a started stream the way vLLM ends a failed one: an error event, then [DONE]; on
    Anthropic's Messages API as its streams end in error (``event: error``, its shape, no
    [DONE])."""
    if anthropic is not None:
        event = f"event: error\ndata: {json.dumps(anthropic, separators=(',', ':'))}\n\n"
    else:
        body = json.dumps(error, separators=(",", ":"))
        event = f"data: {body}\n\ndata: [DONE]\n\n"
    try:
        await write(out, event.encode(), timeout_s)
    except ConnectionResetError:
        return
    await write_eof(out, timeout_s)


async def write_eof(out: web.StreamResponse, timeout_s: float) -> None:
    with contextlib.suppress(ConnectionResetError):
        try:
            async with asyncio.timeout(timeout_s):
                await out.write_eof()
        except TimeoutError:
            raise SlowClient from None
