"""Fake replicas for gateway tests: a handler function behind a real socket (no patching).

``FakeReplica`` serves whatever its handler returns and records the requests it saw.
``SilentReplica`` accepts TCP connections, reads, and never answers. ``ClosingReplica`` closes
a connection, unanswered, when a second POST arrives on it (a keep-alive timeout's race).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

MODEL = "emulated"


def completion_body(cached: int = 0, prompt: int = 10) -> bytes:
    return json.dumps(
        {
            "id": "cmpl-fake",
            "object": "text_completion",
            "created": 0,
            "model": MODEL,
            "choices": [{"index": 0, "text": " ok", "finish_reason": "length"}],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": 1,
                "total_tokens": prompt + 1,
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }
    ).encode()


def held_until(release: asyncio.Event) -> Handler:
    """A handler that answers a plain completion only once ``release`` is set, so the tests can
    hold requests in flight."""

    async def held(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return web.Response(body=completion_body(), content_type="application/json")

    return held


async def queue_full(request: web.Request) -> web.StreamResponse:
    """A full replica's 429 with ``Retry-After: 0`` ("route elsewhere"), as TGI and queue
    limits in front of engines answer."""
    body = {"object": "error", "message": "The request queue is full.",
            "type": "rate_limit_error", "param": None, "code": 429}  # fmt: skip
    return web.json_response(body, status=429, headers={"Retry-After": "0"})


SGLANG_FULL = {"object": "error", "message": "The request queue is full.",
               "type": "Service Unavailable", "param": None, "code": 503}  # fmt: skip


async def sglang_queue_full(request: web.Request) -> web.StreamResponse:
    """SGLang's answer to a request over its ``--max-queued-requests`` bound (the scheduler's
    abort with 503): a plain request gets the 503; a stream gets a 200, the error as its first
    event, then ``[DONE]``."""
    body = await request.json()
    if not body.get("stream"):
        return web.json_response(SGLANG_FULL, status=503)
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await out.prepare(request)
    error = {"error": {k: v for k, v in SGLANG_FULL.items() if k != "object"}}
    await out.write(f"data: {json.dumps(error)}\n\ndata: [DONE]\n\n".encode())
    await out.write_eof()
    return out


async def one_event_stream(request: web.Request) -> web.StreamResponse:
    """A handler that streams one event, ``ok``, then ``[DONE]``."""
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await out.prepare(request)
    await out.write(b'data: {"choices":[{"text":"ok"}]}\n\ndata: [DONE]\n\n')
    await out.write_eof()
    return out


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


async def serve_every_path(handler: Handler, **runner: Any) -> tuple[web.AppRunner, str]:
    """A server on 127.0.0.1 (a free port) that hands every method and path to ``handler``:
    its runner (``cleanup()`` stops it) and its URL."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    running = web.AppRunner(app, access_log=None, **runner)
    await running.setup()
    await web.TCPSite(running, "127.0.0.1", 0).start()
    host, port = running.addresses[0][:2]
    return running, f"http://{host}:{port}"


@dataclass
class FakeReplica:
    handler: Handler | None = None  # None: answer a fixed completion
    failing: bool = False  # when set: /health and everything else answer 500
    models: tuple[str, ...] = (MODEL,)
    health: bool = True  # False: no /health endpoint (404), as some OpenAI-compatible servers
    models_endpoint: bool = True  # False: no /v1/models either (404)
    # False: the engines' server-information paths answer 404, unrecorded, as on most
    # OpenAI-compatible servers; the gateway asks them in the background when a replica joins
    # (gateway/_server_info.py), and a test that reads ``seen[-1]`` must not race that ask.
    # True: they go to the handler and into ``seen`` like any other path.
    server_info: bool = False
    # False: POST /tokenize answers 404, unrecorded, as on most OpenAI-compatible servers (the
    # gateway asks it once per model in approximate mode: gateway/_token_probe.py). True: it
    # goes to the handler and into ``seen``.
    tokenize: bool = False
    seen: list[Seen] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> str:
        self._runner, self.url = await serve_every_path(self._dispatch, handler_cancellation=True)
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        if self.failing:
            return web.json_response({"error": {"message": "boom"}}, status=500)
        if request.path == "/health":
            return web.Response(status=200 if self.health else 404)
        if request.path == "/v1/models" and not self.models_endpoint:
            return web.json_response({"error": {"message": "not found"}}, status=404)
        if request.path == "/v1/models":
            cards = [{"id": m, "object": "model"} for m in self.models]
            return web.json_response({"object": "list", "data": cards})
        if request.path in ("/get_server_info", "/server_info") and not self.server_info:
            return web.json_response({"detail": "Not Found"}, status=404)
        if request.path == "/tokenize" and not self.tokenize:
            return web.json_response({"detail": "Not Found"}, status=404)
        body = await request.read()
        self.seen.append(Seen(request.method, request.path_qs, dict(request.headers), body))
        if self.handler is not None:
            return await self.handler(request)
        return web.Response(body=completion_body(), content_type="application/json")


class _RawReplica:
    """A replica written on raw sockets (``_handle``, per connection), for answers aiohttp's
    server would not give: ``stop`` closes every connection and waits for their handlers."""

    def __init__(self) -> None:
        self.url = ""
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        await self._handle(reader, writer)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        for w in self._writers:
            w.close()
        await asyncio.gather(*self._handlers, return_exceptions=True)  # each sees its end
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


class SilentReplica(_RawReplica):
    """Answers ``GET /health``; accepts every other request and never sends a byte of it."""

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if not head.startswith(b"GET /health "):
                    break  # hang: read whatever comes, answer nothing
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
            while await reader.read(65536):
                pass


class ClosingReplica(_RawReplica):
    """A replica whose keep-alive timeout fires just as a request is sent on an idle connection.

    Every GET is answered (health probes, ``/v1/models``). A POST is answered with a plain
    completion, keeping the connection open, unless a POST was answered on that connection
    already: then the connection is closed unanswered, with a FIN, or with a RST when ``reset``.
    ``posts``: POSTs received; ``connections``: connections accepted.
    """

    def __init__(self, reset: bool = False, every_post: bool = False, delay_s: float = 0.0) -> None:
        self.reset = reset
        self.delay_s = delay_s  # how long the request seems worked on before the close
        self.every_post = every_post  # close on every POST, a new connection's first included
        self.posts = 0
        self.connections = 0
        super().__init__()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        answered_post = False
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                if head.startswith(b"GET "):
                    body = json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode()
                else:
                    self.posts += 1
                    if answered_post or self.every_post:
                        await asyncio.sleep(self.delay_s)
                        self._close(writer)
                        return
                    answered_post = True
                    body = completion_body()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
                await writer.drain()

    def _close(self, writer: asyncio.StreamWriter) -> None:
        if self.reset:  # linger 0: the close sends a RST, not a FIN
            linger = struct.pack("ii", 1, 0)
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
        writer.close()


class BadChunkReplica(_RawReplica):
    """Answers ``GET /health``; answers every other request 200 with a chunked body whose first
    chunk is fine (``first``) and whose next chunk-size line is not hex, then closes."""

    def __init__(self, first: bytes, content_type: str) -> None:
        super().__init__()
        self.first, self.content_type = first, content_type

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"GET "):
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                await reader.readexactly(int(length.group(1)) if length else 0)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: " + self.content_type.encode()
                             + b"\r\nTransfer-Encoding: chunked\r\n\r\n")  # fmt: skip
                writer.write(b"%x\r\n%s\r\n" % (len(self.first), self.first))
                await writer.drain()
                await asyncio.sleep(0.05)
                writer.write(b"zzzz\r\nnot a chunk\r\n")
                await writer.drain()
                writer.close()
                return
