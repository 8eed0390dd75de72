"""Precise mode's moving parts in the gateway: one KV-event subscriber per configured replica.

The router runs with ``insert_on_route=False`` and speculative entries (see ``_app``), so its
index holds only what the engines reported. Each subscriber feeds one replica's events to a
:class:`~prefixroute.events.PreciseIndexer`, which tells the router (its ``engine_*`` methods)
in the router's hashes. All of them share one ZMQ context, created when the app starts and
terminated when it stops.

Several gateway instances need nothing more: each one subscribes to every engine (the engines
bind, the gateways connect; ZMQ's PUB socket fans each batch out), so all of them build the same
index from the same events (docs/deployment.md). Only the speculative entries stay per instance.

A replica's stream is configured (``--kv-events URL=SPEC``) or, with ``kv_events_each``, made
from a template naming its host (``connect:tcp://{host}:5557``: vLLM's default publisher binds
``tcp://*:5557`` on every replica). The template serves every replica without its own stream,
whenever it joins (the admin API, the picker's file or pods): its stream starts as it is added
and stops as it is removed. Without a template, a replica added later gets no stream (and the
index knows nothing of it, so it is routed to for load alone).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import zmq.asyncio

from prefixroute.core import ConfigError, ReplicaId, Router
from prefixroute.events import (
    EventEndpoint,
    EventSubscriber,
    IndexerStats,
    PreciseIndexer,
    StreamState,
    StreamStats,
)

if TYPE_CHECKING:
    from prefixroute.gateway._registry import ReplicaRegistry

log = logging.getLogger(__name__)


class PreciseMode:
    def __init__(
        self,
        router: Router,
        endpoints: Mapping[ReplicaId, EventEndpoint],
        each: str | None = None,
    ) -> None:
        """``endpoints``: configured streams by replica; ``each``: the template spec for every
        other replica (``{host}`` in it), None: they get none."""
        if router.insert_on_route:
            raise ConfigError("precise mode needs a router that does not insert on route")
        self.router = router
        self.endpoints = dict(endpoints)
        self.each = each
        self.subscribers: dict[ReplicaId, EventSubscriber] = {}
        # The counts of removed replicas' streams (subscriber, indexer stats): their counters
        # stay, and a replica added again at the same URL continues them (docs/gateway.md).
        self.retired: dict[ReplicaId, list[tuple[StreamStats, IndexerStats]]] = {}
        self._context: zmq.asyncio.Context | None = None
        self._stopping: set[asyncio.Task[None]] = set()  # streams of removed replicas

    def states(self) -> dict[str, int]:
        """How many streams are in each state (``StreamState``), every state named."""
        counts = dict.fromkeys(StreamState, 0)
        for subscriber in self.subscribers.values():
            counts[subscriber.state] += 1
        return {str(state): n for state, n in counts.items()}

    def recovering(self) -> bool:
        """A followed stream is ``resyncing``: some of its replica's cached blocks may be
        unknown until reported again (``_kv_report``)."""
        return any(s.state is StreamState.RESYNCING for s in self.subscribers.values())

    def state_of(self, replica: ReplicaId) -> str | None:
        """The state of ``replica``'s stream; None: it has none."""
        subscriber = self.subscribers.get(replica)
        return None if subscriber is None else str(subscriber.state)

    def endpoint_of(self, replica: ReplicaId) -> EventEndpoint | None:
        """Where ``replica``'s events come from: configured, or the template at its host."""
        own = self.endpoints.get(replica)
        host = urlsplit(replica).hostname
        if own is not None or self.each is None or not host:
            return own
        return EventEndpoint.for_host(self.each, host)

    async def start(self) -> None:
        context = self._context = zmq.asyncio.Context()
        self.subscribers = {}
        try:
            for replica in {**self.endpoints, **dict.fromkeys(self.router.replicas)}:
                endpoint = self.endpoint_of(replica)
                if endpoint is not None:
                    self._follow(replica, endpoint, context)
        except BaseException:
            await self.stop()
            raise

    def _follow(
        self, replica: ReplicaId, endpoint: EventEndpoint, context: zmq.asyncio.Context
    ) -> None:
        """Start ``replica``'s stream; ConfigError when another replica's stream already reads
        that address: each would take the other's blocks for its own (an outside audit: two
        data-parallel ranks on one host, one template, both read rank 0's stream, since vLLM
        publishes each rank on the port plus the rank)."""
        for other, subscriber in self.subscribers.items():
            if subscriber.endpoint.address == endpoint.address and other != replica:
                raise ConfigError(
                    f"{replica} and {other} would follow the same KV-event stream "
                    f"({endpoint.address}); give each its own --kv-events (vLLM publishes a "
                    "data-parallel rank on its endpoint's port plus the rank)"
                )
        indexer = PreciseIndexer(replica, self.router, self.router.hasher)
        subscriber = EventSubscriber(endpoint, indexer, context)
        subscriber.open()
        self.subscribers[replica] = subscriber

    def follow(self, registry: ReplicaRegistry) -> None:
        """Start and stop streams as ``registry`` adds and removes replicas."""
        registry.on_added(self.added)
        registry.on_removed(self.removed)

    def added(self, replica: ReplicaId) -> None:
        """The registry's hook: a replica that joined after start follows its template stream
        from then on. One whose stream cannot start (an address ZMQ refuses) is logged and
        served without it, as a replica without a stream is."""
        context = self._context
        if context is None or replica in self.subscribers:
            return  # before start (start follows every replica then), or followed already
        try:
            endpoint = self.endpoint_of(replica)
            if endpoint is not None:
                self._follow(replica, endpoint, context)
        except ConfigError as exc:
            log.warning("KV events of %s not followed: %s", replica, exc)

    def removed(self, replica: ReplicaId) -> None:
        """The registry's hook: a removed replica's stream stops (late events are dropped:
        ``Router.engine_stored`` ignores a replica it no longer has)."""
        subscriber = self.subscribers.pop(replica, None)
        if subscriber is not None:
            counts = (subscriber.stats, subscriber.indexer.stats)
            self.retired.setdefault(replica, []).append(counts)
            task = asyncio.get_running_loop().create_task(subscriber.stop())
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    async def stop(self) -> None:
        for subscriber in self.subscribers.values():
            await subscriber.stop()  # kept, stopped, so their counts stay readable
        for task in list(self._stopping):
            await task
        context, self._context = self._context, None
        if context is not None:
            context.term()

