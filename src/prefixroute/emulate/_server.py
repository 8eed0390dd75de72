"""Running emulated replicas in-process: start on 127.0.0.1 ephemeral ports, stop or kill.

Tests, ``prefixroute serve --emulate N`` and ``prefixroute bench`` all start replicas the same
way, through :class:`EmulatedReplica` (one) or :class:`EmulatedCluster` (several), so the server
settings, ``handler_cancellation`` included, are the same in tests and in production.

``stop()`` is graceful (in-flight requests get ``shutdown_timeout_s`` to finish); ``kill()``
imitates a crashed process: the listening socket closes and every open connection is reset.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from aiohttp import web

from prefixroute._serving import Served, StartStop, listen, stop_accepting
from prefixroute.core import ConfigError
from prefixroute.emulate._app import ENGINE, EVENTS, build_app
from prefixroute.emulate._config import EmulatorConfig
from prefixroute.sim.fleet import Fleet


class EmulatedReplica(Served):
    """One emulated vLLM-like replica served by aiohttp in this process."""

    served_name = "emulated replica"

    def __init__(self, config: EmulatorConfig | None = None) -> None:
        self.config = config or EmulatorConfig()
        self.app = build_app(self.config)
        self._runner: web.AppRunner | None = None
        self._url: str | None = None

    @property
    def running(self) -> bool:
        return self._runner is not None

    @property
    def kv_events_address(self) -> str | None:
        """The KV-event socket's address once started (a bound ``*`` port resolved)."""
        bridge = self.app.get(EVENTS)
        return bridge.publisher.address if bridge is not None else None

    @property
    def kv_events_replay_address(self) -> str | None:
        bridge = self.app.get(EVENTS)
        return bridge.publisher.replay_address if bridge is not None else None

    async def start(self) -> str:
        """Bind and serve; returns the base URL."""
        if self._runner is not None:
            return self.url
        cfg = self.config
        self._runner, self._url = await listen(
            self.app, cfg.host, cfg.port, shutdown_timeout_s=cfg.shutdown_timeout_s
        )
        return self._url

    async def stop(self) -> None:
        """Stop gracefully: no new connections, in-flight requests finish (up to the timeout)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def kill(self) -> None:
        """Stop abruptly, like a crashed process: close the socket, reset every connection."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        await stop_accepting(runner)
        for site in list(runner.sites):
            await site.stop()
        server = runner.server
        if server is not None:
            for conn in server.connections:
                if conn.transport is not None:
                    conn.transport.abort()
        await self.app[ENGINE].stop()
        await asyncio.sleep(0)
        await runner.cleanup()


class EmulatedCluster(StartStop):
    """``n`` emulated replicas sharing one configuration (ports are picked per replica).

    With a ``fleet`` (:class:`prefixroute.sim.fleet.Fleet`, ``n`` replicas), replica ``i`` runs
    the fleet's engine settings for ``r{i}`` and the speed changes named ``r{i}``.
    """

    def __init__(self, n: int, config: EmulatorConfig | None = None, fleet: Fleet | None = None):
        if n < 1:
            raise ConfigError(f"an emulated cluster needs at least one replica, got {n}")
        if fleet is not None and fleet.size != n:
            raise ConfigError(f"the fleet has {fleet.size} replicas, the cluster {n}")
        base = config or EmulatorConfig()
        # An explicit port is the first of ``n`` consecutive ports; 0 stays "any free port".
        # KV-event ports are offset the same way (wildcard ports stay wildcards).
        endpoint = base.kv_events_endpoint
        self.replicas = [
            EmulatedReplica(
                dataclasses.replace(
                    base,
                    port=base.port + i if base.port else 0,
                    kv_events=str(endpoint.with_port_offset(i)) if endpoint else None,
                    **(_fleet_settings(fleet, i) if fleet is not None else {}),
                )
            )
            for i in range(n)
        ]

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    async def start(self) -> list[str]:
        try:
            for r in self.replicas:
                await r.start()
        except BaseException:
            await self.stop()
            raise
        return self.urls

    async def stop(self) -> None:
        await asyncio.gather(*(r.stop() for r in self.replicas))


def _fleet_settings(fleet: Fleet, i: int) -> dict[str, Any]:
    name = f"r{i}"
    return {
        "engine": fleet.configs[i],
        "speed_changes": tuple(ch for ch in fleet.changes if ch.replica == name),
    }


async def start_replicas(
    n: int, config: EmulatorConfig | None = None, fleet: Fleet | None = None
) -> EmulatedCluster:
    """Start ``n`` emulated replicas on 127.0.0.1 (free ports); stop them with ``.stop()``."""
    cluster = EmulatedCluster(n, config, fleet)
    await cluster.start()
    return cluster
