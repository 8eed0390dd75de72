"""Serving an aiohttp app in this process, shared by the gateway and the emulated replica.

One place sets the server options both must agree on: ``handler_cancellation`` on (a client
that disconnects cancels its handler, in tests and in production alike), no access log (it
would hold request lines), and a graceful shutdown timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Coroutine
from typing import Any

from aiohttp import web


async def listen(
    app: web.Application,
    host: str,
    port: int,
    *,
    shutdown_timeout_s: float,
    keepalive_timeout_s: float | None = None,
) -> tuple[web.AppRunner, str]:
    """Bind ``app`` on ``host:port`` (0 picks a free port); returns the runner and base URL."""
    extra: dict[str, Any] = {}
    if keepalive_timeout_s is not None:
        extra["keepalive_timeout"] = keepalive_timeout_s
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=shutdown_timeout_s,
        **extra,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_host, bound_port = runner.addresses[0][:2]
    return runner, f"http://{bound_host}:{bound_port}"


async def wait_for_signal() -> None:
    """Return on SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def run_until_signal(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop when installed, else asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)
