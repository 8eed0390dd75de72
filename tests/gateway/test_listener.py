"""The listener every server of ours binds (``_serving.listen``) takes a burst of connections.

The kernel completes connections into a queue the server accepts from; past the queue's length
(the listen backlog) it drops the client's SYN, and that client waits for its retransmit, 1 s and
then 3 s. aiohttp's default backlog of 128 did that to 871 of 1,000 connections made at once here
(2026-12-01). Linux counts each such drop in ``TcpExtListenOverflows``.
"""

from __future__ import annotations

import asyncio
import resource
from pathlib import Path

import pytest
from aiohttp import web

from prefixroute._serving import listen

NETSTAT = Path("/proc/net/netstat")
BURST = 1_000  # connections made at once


def listen_overflows() -> int:
    """The kernel's count of connections dropped for a full accept queue, all sockets."""
    lines = NETSTAT.read_text().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=True):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:], strict=True))
            return int(table["ListenOverflows"])
    raise AssertionError("no TcpExt counters")


def _enough_files(needed: int) -> bool:
    """Raise this process's open-file limit to ``needed`` if it is lower and the hard limit
    allows; whether it is now high enough (both ends of every connection are ours)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed and (hard == resource.RLIM_INFINITY or hard >= needed):
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
        soft = needed
    return soft >= needed


@pytest.mark.skipif(not NETSTAT.exists(), reason="Linux's TCP counters are needed")
async def test_a_burst_of_connections_is_not_dropped() -> None:
    if not _enough_files(2 * BURST + 256):
        pytest.skip("the open-file limit is below two per connection")
    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/health", health)
    runner, url = await listen(app, "127.0.0.1", 0, shutdown_timeout_s=1)
    port = int(url.rsplit(":", 1)[1])
    before = listen_overflows()
    try:
        opened = await asyncio.gather(
            *(asyncio.open_connection("127.0.0.1", port) for _ in range(BURST))
        )
        dropped = listen_overflows() - before
        # Every connection is served, not just queued.
        for reader, writer in opened[:: BURST // 10]:
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        for _, writer in opened:
            writer.close()
    finally:
        await runner.cleanup()
    assert dropped == 0
