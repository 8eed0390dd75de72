"""Precise mode's moving parts in the gateway: one KV-event subscriber per configured replica.

The router runs with ``insert_on_route=False`` and speculative entries (see ``_app``), so its
index holds only what the engines reported. Each subscriber feeds one replica's events to a
:class:`~prefixroute.events.PreciseIndexer`, which tells the router (its ``engine_*`` methods)
in the router's hashes. All of them share one ZMQ context, created when the app starts and
terminated when it stops.

Several gateway instances need nothing more: each one subscribes to every engine (the engines
bind, the gateways connect; ZMQ's PUB socket fans each batch out), so all of them build the same
index from the same events (docs/deployment.md). Only the speculative entries stay per instance.

Replicas added later through the admin API get no event stream: precise mode's streams are
configured at start, one per replica (they are engine settings, not discoverable).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import zmq.asyncio

from prefixroute.core import ConfigError, ReplicaId, Router
from prefixroute.events import EventEndpoint, EventSubscriber, PreciseIndexer

log = logging.getLogger(__name__)


class PreciseMode:
    def __init__(self, router: Router, endpoints: Mapping[ReplicaId, EventEndpoint]) -> None:
        if router.insert_on_route:
            raise ConfigError("precise mode needs a router that does not insert on route")
        self.router = router
        self.endpoints = dict(endpoints)
        self.subscribers: dict[ReplicaId, EventSubscriber] = {}
        self._context: zmq.asyncio.Context | None = None

    async def start(self) -> None:
        context = self._context = zmq.asyncio.Context()
        self.subscribers = {}
        try:
            for replica, endpoint in self.endpoints.items():
                indexer = PreciseIndexer(replica, self.router, self.router.hasher)
                subscriber = EventSubscriber(endpoint, indexer, context)
                await subscriber.start()
                self.subscribers[replica] = subscriber
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        for subscriber in self.subscribers.values():
            await subscriber.stop()  # kept, stopped, so their counts stay readable
        context, self._context = self._context, None
        if context is not None:
            context.term()
