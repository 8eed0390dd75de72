"""Clients for the chaos suite: one request classified, raw HTTP, slow readers, a canary.

:func:`post` sends one request through aiohttp and says how it ended (:class:`Kind`):

* ``ok``: a 200 with a JSON completion, or a stream that ended with ``data: [DONE]`` and no
  error event;
* ``error``: an explicit error, a JSON error status or an SSE error event (the table's "cut
  with error"); ``data_events`` tells whether anything came before it;
* ``lost``: the connection dropped, no response, or a stream that ended with neither
  ``[DONE]`` nor an error event (a silent cut);
* ``hung``: nothing conclusive within the client's timeout.

:func:`raw_request` writes bytes as given (paths no client library would leave alone) and reads
the answer to EOF.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import aiohttp

from prefixroute._tasks import cancel_and_wait

from .harness import HOST

CHAT = "/v1/chat/completions"
MODEL = "emulated"  # what `prefixroute emulate` serves
JSON_HEADERS = {"Content-Type": "application/json"}


class Kind(StrEnum):
    OK = "ok"
    ERROR = "error"
    LOST = "lost"
    HUNG = "hung"


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: Kind
    status: int  # HTTP status; 0 when none came
    wait_s: float | None  # send to the first event (stream) or the response's head, seconds
    elapsed_s: float  # send to the end, or to giving up, seconds
    data_events: int  # stream: data events before the end; plain: 1 with a body
    detail: str = ""  # error code or why it counts as lost
    text: str = ""  # the assistant's text (for the next turn)
    json_body: bool = False  # a plain answer's body was JSON
    replica: str = ""  # the gateway's x-prefixroute-replica header (who answered)


def session(connections: int = 0) -> aiohttp.ClientSession:
    """A client session whose only limit is each request's own ``timeout_s``."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    return aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=connections))


async def post(
    client: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, Any] | bytes,
    *,
    timeout_s: float,
    headers: Mapping[str, str] | None = None,
) -> Outcome:
    """POST ``body`` to ``url`` and classify the answer (never raises for the server's sake)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    t0 = time.monotonic()
    r = _Reading(t0)
    try:
        async with asyncio.timeout(timeout_s):
            hdrs = {**JSON_HEADERS, **(headers or {})}
            async with client.post(url, data=data, headers=hdrs) as resp:
                r.status = resp.status
                r.replica = resp.headers.get("x-prefixroute-replica", "")
                if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                    r.stream = True
                    async for line in resp.content:
                        r.line(line)
                else:
                    r.wait_s = time.monotonic() - t0
                    r.body = await resp.read()
    except TimeoutError:
        return Outcome(Kind.HUNG, r.status, r.wait_s, time.monotonic() - t0, r.events, "timeout")
    except (aiohttp.ClientError, OSError) as exc:
        r.exc = exc
    return r.outcome(time.monotonic() - t0)


class _Reading:
    """What came back so far, then its :class:`Outcome`."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.status = 0
        self.replica = ""
        self.wait_s: float | None = None
        self.stream = False
        self.events = 0  # data events other than errors and [DONE]
        self.error: str | None = None  # the first error event's code
        self.done = False
        self.garbage = 0  # data lines that were not JSON
        self.text: list[str] = []
        self.body = b""
        self.exc: BaseException | None = None

    def line(self, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            return
        payload = line[5:].strip()
        if self.wait_s is None:
            self.wait_s = time.monotonic() - self.t0
        if payload == "[DONE]":
            self.done = True
            return
        try:
            event = json.loads(payload)
        except ValueError:
            self.garbage += 1
            return
        if isinstance(event, dict) and "error" in event:
            if self.error is None:
                err = event["error"]
                self.error = str(err.get("code") if isinstance(err, dict) else err)
            return
        self.events += 1
        choices = event.get("choices") if isinstance(event, dict) else None
        for choice in choices if isinstance(choices, list) else []:
            if isinstance(choice, dict):
                delta = choice.get("delta")
                content = delta.get("content") if isinstance(delta, dict) else None
                self.text.append(str(choice.get("text") or content or ""))

    def outcome(self, elapsed: float) -> Outcome:
        def out(kind: Kind, detail: str, events: int, text: str = "", js: bool = False) -> Outcome:
            return Outcome(
                kind, self.status, self.wait_s, elapsed, events, detail, text, js, self.replica
            )

        if self.stream:
            if self.error is not None:
                return out(Kind.ERROR, f"error event {self.error}", self.events)
            if self.exc is not None:
                return out(Kind.LOST, f"stream dropped ({type(self.exc).__name__})", self.events)
            if not self.done:
                return out(Kind.LOST, "stream ended without [DONE]", self.events)
            if self.status != 200 or not self.events:
                return out(Kind.LOST, f"odd stream: status {self.status}", self.events)
            return out(Kind.OK, "", self.events, "".join(self.text))
        if self.exc is not None:
            return out(Kind.LOST, f"no response ({type(self.exc).__name__})", 0)
        try:
            obj = json.loads(self.body)
        except ValueError:
            obj = None
        js = isinstance(obj, dict)
        if self.status == 200 and js and obj.get("choices"):
            choice = obj["choices"][0]
            text = choice.get("text") or (choice.get("message") or {}).get("content") or ""
            return out(Kind.OK, "", 1, text, True)
        if self.status >= 400:
            err = obj.get("error") if js else None
            code = err.get("code") if isinstance(err, dict) else "non-JSON"
            return out(Kind.ERROR, f"{self.status} {code}", 0, js=js)
        return out(Kind.LOST, f"unusable {self.status} answer", 0, js=js)


VOCABULARY = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
    "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu amber basil "
    "cedar dune ember fjord grove heath islet jade kelp lagoon meadow nectar orchid prairie"
)
WORDS = tuple(VOCABULARY.split())


def text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def seeded_system(seed: int) -> tuple[random.Random, str]:
    """A scenario's random generator, seeded, and the 150-word system prompt its conversations
    share (drawn from it first)."""
    rng = random.Random(seed)
    return rng, text(rng, 150)


class Conversation:
    """A multi-turn chat: each answer and a new question are appended; restarts after
    ``max_turns`` (a shared system prompt, so the router finds prefixes across clients)."""

    def __init__(self, rng: random.Random, system: str, max_turns: int = 6) -> None:
        self.rng = rng
        self.system = system
        self.max_turns = max_turns
        self.messages: list[dict[str, str]] = []
        self._reset()

    def _reset(self) -> None:
        self.messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": text(self.rng, 40)},
        ]

    def body(self, stream: bool, max_tokens: int) -> dict[str, Any]:
        return {"model": MODEL, "messages": self.messages, "stream": stream,
                "max_tokens": max_tokens}  # fmt: skip

    def answered(self, reply: str) -> None:
        if len(self.messages) >= 2 * self.max_turns:
            self._reset()
            return
        self.messages += [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": text(self.rng, 20)},
        ]


async def converse(
    client: aiohttp.ClientSession,
    url: str,
    rng: random.Random,
    system: str,
    *,
    running: Callable[[], bool],
    body: Callable[[Conversation], dict[str, Any]],
    timeout_s: float,
    sent: Callable[[float, Outcome], None],
    between: Callable[[Outcome], Awaitable[None]] | None = None,
) -> None:
    """One client's conversation while ``running()``: each turn's ``body`` is posted to ``url``
    and its outcome given to ``sent`` with the turn's start; an answered turn carries the
    conversation on; ``between`` runs after every turn (think time, say)."""
    conv = Conversation(rng, system)
    while running():
        request = body(conv)
        t = time.monotonic()
        o = await post(client, url, request, timeout_s=timeout_s)
        sent(t, o)
        if o.kind is Kind.OK:
            conv.answered(o.text)
        if between is not None:
            await between(o)


class Canary:
    """A small chat request every ``interval_s`` (without waiting for the last one to end);
    each must get a 200 within ``timeout_s``. ``async with`` runs it."""

    def __init__(
        self, client: aiohttp.ClientSession, url: str, interval_s: float, timeout_s: float = 5.0
    ) -> None:
        self.client = client
        self.url = url + CHAT
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.sent = 0
        self.failures = 0
        self.why: Counter[str] = Counter()  # failure -> how many
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Canary:
        self._loop = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await cancel_and_wait(self._loop)
        await asyncio.gather(*self._tasks)

    async def _run(self) -> None:
        next_at = time.monotonic()
        while True:
            task = asyncio.create_task(self._one())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            next_at += self.interval_s
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def _one(self) -> None:
        self.sent += 1
        body = {"model": MODEL, "max_tokens": 1,
                "messages": [{"role": "user", "content": f"canary {self.sent}"}]}  # fmt: skip
        outcome = await post(self.client, self.url, body, timeout_s=self.timeout_s)
        if outcome.kind is not Kind.OK:
            self.failures += 1
            self.why[f"{outcome.kind.value} {outcome.detail}".strip()] += 1


@dataclass(frozen=True, slots=True)
class RawResponse:
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes

    def json(self) -> Any:
        """The body as JSON, or None when it is not."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None


def raw_bytes(
    method: str,
    target: str,
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
    keep_alive: bool = False,
) -> bytes:
    """An HTTP/1.1 request with ``target`` exactly as given (``Connection: close`` unless
    ``keep_alive``)."""
    connection = "keep-alive" if keep_alive else "close"
    lines = [f"{method} {target} HTTP/1.1", f"Host: {HOST}", f"Connection: {connection}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def raw_request(port: int, request: bytes, timeout_s: float = 10.0) -> RawResponse | None:
    """Send ``request`` on a new connection, read to EOF; None if it closed without a byte.
    Raises ConnectionRefusedError when nothing listens."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        async with asyncio.timeout(timeout_s):
            writer.write(request)
            await writer.drain()
            data = await reader.read()
    except (ConnectionResetError, BrokenPipeError):
        return None
    finally:
        writer.close()
    return parse_response(data)


def parse_response(data: bytes) -> RawResponse | None:
    """One HTTP/1.1 response (``Content-Length``, chunked or to EOF); None for no bytes."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = bytearray()
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0] or b"0", 16)
            if size == 0:
                break
            body += rest[:size]
            rest = rest[size + 2 :]
        return RawResponse(status, headers, bytes(body))
    if "content-length" in headers:
        rest = rest[: int(headers["content-length"])]
    return RawResponse(status, headers, rest)


class SlowReader:
    """A client on a raw socket with a small receive buffer that reads ``rate`` bytes a second.

    It also announces an Ethernet-sized MSS. On loopback the MSS is about 64 KiB, and Linux
    sizes a sender's socket buffer from its congestion window in segments (10 at start), so
    the gateway's kernel would silently hold 1-2.5 MB for a client that reads nothing
    (measured: a 1.2 MB stream fit, a 4.8 MB one did not); a gateway that writes only as fast
    as its client reads then looks fine on loopback and fails on a real network, where the
    same buffer is about 100 KB. With a 1460-byte MSS loopback behaves like the network.

    ``received``: bytes read so far. ``run`` returns when ``stop`` is set or the server closes.
    """

    RCVBUF = 4096  # bytes; set before connecting, so the advertised window stays small
    MSS = 1460  # bytes, Ethernet's; set before connecting, so the SYN announces it

    def __init__(self, port: int, request: bytes, rate: float = 1.0) -> None:
        self.port = port
        self.request = request
        self.rate = rate
        self.received = 0
        self.closed_by_server = False

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.RCVBUF)
            if hasattr(socket, "TCP_MAXSEG"):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, self.MSS)
            sock.setblocking(False)
            await loop.sock_connect(sock, (HOST, self.port))
            await loop.sock_sendall(sock, self.request)
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0 / self.rate):
                        await stop.wait()
                    break
                byte = await loop.sock_recv(sock, 1)
                if not byte:
                    self.closed_by_server = True
                    return
                self.received += 1
        except OSError:
            self.closed_by_server = True
        finally:
            sock.close()
