"""A TCP relay in front of a replica that records every request passing through it.

The emulated replica's ``/metrics`` counts tokens, not requests, so a ``GET /metrics`` or a
``POST /reset_prefix_cache`` that got through the gateway would not show there; the paths
scenario puts a :class:`Tap` in front of each replica instead (``Fleet(tap=True)``). Bytes
are relayed untouched both ways; the client-to-replica side is split into HTTP/1.1 requests
(``Content-Length`` and chunked bodies) and each request's line and headers are kept.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Seen:
    """One request that went through a :class:`Tap`."""

    method: str
    target: str  # the request target as sent, unnormalised
    headers: dict[str, str]  # lower-cased names


class _RequestScanner:
    """Splits one connection's client-to-server bytes into HTTP/1.1 requests."""

    def __init__(self, out: list[Seen]) -> None:
        self.out = out
        self.buf = bytearray()
        self.skip = 0  # body bytes still to pass over
        self.chunked = False

    def feed(self, data: bytes) -> None:
        self.buf += data
        while self.buf:
            if self.skip:
                n = min(self.skip, len(self.buf))
                del self.buf[:n]
                self.skip -= n
            elif self.chunked:
                end = self.buf.find(b"\r\n")
                if end < 0:
                    return
                size = int(bytes(self.buf[:end]).split(b";")[0] or b"0", 16)
                del self.buf[: end + 2]
                self.skip = size + 2  # the chunk and its CRLF (the last: just the CRLF)
                self.chunked = size > 0
            else:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
                del self.buf[: end + 4]
                method, _, rest = head[0].partition(" ")
                target = rest.rsplit(" ", 1)[0]
                headers = {}
                for line in head[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                self.out.append(Seen(method, target, headers))
                self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
                self.skip = int(headers.get("content-length", "0") or 0)


class Tap:
    """A TCP relay in front of one replica that records every request passing through."""

    def __init__(self, host: str, upstream_port: int) -> None:
        self.host = host
        self.upstream_port = upstream_port
        self.seen: list[Seen] = []
        self.url = ""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    async def start(cls, host: str, upstream_port: int) -> Tap:
        """Listen on a free port of ``host``, relaying to ``host:upstream_port``."""
        tap = cls(host, upstream_port)
        tap._server = await asyncio.start_server(tap._handle, host, 0)
        port = tap._server.sockets[0].getsockname()[1]
        tap.url = f"http://{host}:{port}"
        return tap

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.upstream_port)
        except OSError:
            writer.close()
            return
        scanner = _RequestScanner(self.seen)
        pumps = [
            asyncio.create_task(_pump(reader, up_writer, scanner.feed)),
            asyncio.create_task(_pump(up_reader, writer, None)),
        ]
        self._tasks.update(pumps)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for task in pumps:
            task.cancel()
            self._tasks.discard(task)
        await asyncio.gather(*pumps, return_exceptions=True)
        for w in (writer, up_writer):
            w.close()


async def _pump(
    src: asyncio.StreamReader, dst: asyncio.StreamWriter, observe: Callable[[bytes], None] | None
) -> None:
    with contextlib.suppress(OSError):
        while data := await src.read(65536):
            if observe is not None:
                observe(data)
            dst.write(data)
            await dst.drain()
