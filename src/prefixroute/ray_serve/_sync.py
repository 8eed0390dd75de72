"""The Ray Serve router in the Redis sync: several routers of one deployment share one view.

Every deployment handle builds its own router (the proxy, each replica of an ingress deployment,
a driver), each with the index and load view of the requests it routed. With ``sync_redis`` in
``request_router_kwargs``, each router runs the gateways' sync (``prefixroute.sync.RouteSync``:
same channel format, same messages, same Redis history) and so applies every other router's
decisions, withdrawals, predicted first tokens and ends, as several ``prefixroute serve``
instances do.

Threads. The sync's two tasks (publisher, subscriber) run on the loop of Ray's router, which is
where ``choose_replicas`` runs: the sync starts there, the first time Ray asks us to rank (Ray
builds the router and calls ``initialize_state`` lazily, from whatever thread first needs it,
with no loop of its own to rely on). The ledger's hooks come from other threads too (a request's
future may resolve on the caller's loop). So:

* what the ledger records is handed to the sync with ``call_soon_threadsafe`` (the sync's queue
  is an ``asyncio.Queue``, which only its loop may touch), from within the ledger's lock, so the
  messages leave in the order the router recorded them;
* what the others sent is applied to the router with the ledger's lock held (``RouteSync``'s
  ``lock``), like every other call into it.

Replica ids are Ray's (``ReplicaID.unique_id``), the same at every handle of one deployment, and
unlike the gateways' and pickers' URLs: their decisions would be ignored here, and ours there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any

from prometheus_client.registry import CollectorRegistry

from prefixroute.core import Decision, RequestView
from prefixroute.ray_serve._ledger import Ledger
from prefixroute.sync import SECRET_ENV, RouteSync, redacted

log = logging.getLogger(__name__)


class _OnLoop:
    """The ledger's listener: passes each call to the sync on the sync's loop."""

    def __init__(self, sync: RouteSync, loop: asyncio.AbstractEventLoop) -> None:
        self.sync = sync
        self.loop = loop

    def routed(self, view: RequestView, decision: Decision) -> None:
        self._call(self.sync.routed, view, decision)

    def withdrawn(self, request_id: str) -> None:
        self._call(self.sync.withdrawn, request_id)

    def first_token(self, request_id: str) -> None:
        self._call(self.sync.first_token, request_id)

    def completed(self, request_id: str) -> None:
        self._call(self.sync.completed, request_id)

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        # RuntimeError: the loop is closed, the process is going away: nothing left to share
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(fn, *args)


class RouterSync:
    """A ledger's link to the other routers; :meth:`start` on the loop that should run it."""

    def __init__(self, ledger: Ledger, url: str, channel: str, history: int) -> None:
        self.ledger = ledger
        # The metrics go to a registry of their own: a Ray router has no /metrics of ours.
        self.route_sync = RouteSync(
            url, channel, ledger.router, CollectorRegistry(), history=history, lock=ledger.lock,
            secret=os.environ.get(SECRET_ENV) or None,  # signed as the gateways sign (_signing)
        )  # fmt: skip
        self.started = False

    @property
    def connected(self) -> bool:
        """Subscribed: the others' decisions reach this router."""
        return self.route_sync.connected

    async def start(self) -> None:
        """Join, on the running loop; later calls do nothing. Never fails: an unreachable
        Redis is retried in the background, and routing goes on from the local view."""
        if self.started:
            return
        self.started = True  # first: routing tasks racing here start it once
        await self.route_sync.start()
        self.ledger.listener = _OnLoop(self.route_sync, asyncio.get_running_loop())
        log.info("prefixroute: sharing decisions through %s", redacted(self.route_sync.url))

    async def stop(self) -> None:
        """Leave (tests; Ray has no shutdown hook for a router: its loop ends with the process)."""
        self.ledger.listener = None
        await self.route_sync.stop()
        self.started = False
