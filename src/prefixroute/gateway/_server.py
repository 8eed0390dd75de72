"""Running the gateway in-process: the same server settings in tests, bench and ``serve``."""

from __future__ import annotations

from types import TracebackType

from aiohttp import web

from prefixroute.core import ConfigError, Router
from prefixroute.gateway._app import build_app
from prefixroute.gateway._config import GatewayConfig
from prefixroute.gateway._registry import ReplicaRegistry
from prefixroute.gateway._state import STATE


class Gateway:
    """The gateway app served by aiohttp in this process.

    ``handler_cancellation`` is on, in tests and in production alike: a client that disconnects
    cancels its handler, which closes the upstream request and releases its accounting.
    ``stop()`` drains: no new connections, in-flight requests get ``shutdown_timeout_s``.
    """

    def __init__(self, config: GatewayConfig | None = None) -> None:
        self.config = config or GatewayConfig()
        self.app = build_app(self.config)
        self._runner: web.AppRunner | None = None
        self._url: str | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8000`` (available once started)."""
        if self._url is None:
            raise ConfigError("the gateway is not started")
        return self._url

    @property
    def router(self) -> Router:
        return self.app[STATE].router

    @property
    def registry(self) -> ReplicaRegistry:
        return self.app[STATE].registry

    async def start(self) -> str:
        if self._runner is not None:
            return self.url
        runner = web.AppRunner(
            self.app,
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=self.config.shutdown_timeout_s,
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.config.host, self.config.port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        host, port = runner.addresses[0][:2]
        self._runner = runner
        self._url = f"http://{host}:{port}"
        return self._url

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
