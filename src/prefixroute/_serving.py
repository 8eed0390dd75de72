"""Serving an aiohttp app in this process, shared by the gateway and the emulated replica.

One place sets the server options both must agree on: ``handler_cancellation`` on (a client
that disconnects cancels its handler, in tests and in production alike), no access log (it
would hold request lines), and a graceful shutdown timeout. :class:`Served` is the lifecycle the
in-process servers share: ``start``/``stop``, ``async with`` (:class:`StartStop`), and a ``url``
once started.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, ClassVar, Self

from aiohttp import web

from prefixroute.core import ConfigError


class StartStop:
    """``start``/``stop``, and ``async with`` for them."""

    async def start(self) -> Any:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


class Served(StartStop):
    """One listening server: ``url`` raises a clear error until it started."""

    served_name: ClassVar[str]  # what the error calls it: "the gateway is not started"
    _url: str | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8000`` (available once started)."""
        if self._url is None:
            raise ConfigError(f"the {self.served_name} is not started")
        return self._url


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
