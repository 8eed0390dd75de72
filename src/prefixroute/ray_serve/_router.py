"""A Ray Serve request router that runs prefixroute's policies: a drop-in for Ray's own.

Ray Serve routes each handle call with a ``RequestRouter``: ``choose_replicas`` returns ranks of
replicas, most preferred first, and Ray sends the request to the least busy replica of the
first rank that has room under ``max_ongoing_requests`` (probing queue lengths when its cache is
stale), backing off and asking again when none has. We return two ranks: the replica our policy
chose, then all the others. So our choice wins whenever it has room, and Ray's own limit and
queue-length logic decide the fallback, as they do for PowerOfTwoChoices.

Configure it per deployment (``request_router_kwargs`` are :class:`RouterSettings` fields)::

    from ray.serve.config import RequestRouterConfig

    @serve.deployment(request_router_config=RequestRouterConfig(
        request_router_class="prefixroute.ray_serve:PrefixRouteRequestRouter",
        request_router_kwargs={"policy": "predicted_ttft", "block_chars": 64},
    ))

Every deployment handle (the proxy, each replica of an ingress deployment, a driver) builds its
own router: each keeps its own prefix index and load view from the requests it routed, like
several gateway instances without sharing, unless ``sync_redis`` is set: then the routers of one
deployment share decisions and load through Redis (``_sync``). Replicas' own
``record_routing_stats`` (keys ``num_running``, ``num_waiting``, ``kv_usage``) reach the load
view, as the gateway's metrics scrape does; the policies that read those numbers see work sent
by other handles too.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from prefixroute.core import ReplicaId
from prefixroute.ray_serve._errors import UnroutableRequest
from prefixroute.ray_serve._key import route_key
from prefixroute.ray_serve._ledger import Ledger
from prefixroute.ray_serve._settings import RouterSettings
from prefixroute.ray_serve._sync import RouterSync

log = logging.getLogger(__name__)


def replica_name(replica_id: ReplicaID) -> ReplicaId:
    """Our id for a Serve replica: its id within the deployment (one router, one deployment)."""
    return ReplicaId(str(replica_id.unique_id))


class PrefixRouteRequestRouter(RequestRouter):
    """Ranks replicas with a prefixroute policy; Ray's limits and backoff do the rest."""

    ledger: Ledger
    settings: RouterSettings
    sync: RouterSync | None = None  # sync_redis: started on the first choose_replicas
    # Each replica's last stats object read: Ray replaces it at each poll and hands out the
    # same one between polls, so it is read once per poll, not once per request (a full batch
    # seen 8 times is learned as the batch size: one poll read by 8 requests taught it).
    _stats_read: dict[str, object]

    def initialize_state(self, **kwargs: Any) -> None:
        """Ray passes ``request_router_kwargs`` here, once, before routing anything."""
        self.settings = RouterSettings.from_kwargs(kwargs)
        self.ledger = self.settings.build_ledger()
        self._stats_read = {}
        s = self.settings
        if s.sync_redis is not None:
            self.sync = RouterSync(self.ledger, s.sync_redis, s.sync_channel, s.sync_history)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if self.sync is not None and not self.sync.started:
            await self.sync.start()  # here: on Ray's router loop, which will run its tasks
        if pending_request is None or not candidate_replicas:
            return [list(candidate_replicas)]
        if pending_request.future.done():  # cancelled meanwhile: Ray's backoff still asks
            return [list(candidate_replicas)]
        try:
            return self._rank(candidate_replicas, pending_request)
        except Exception as exc:
            # Fail this request's caller now, with the reason (UnroutableRequest, or a bug of
            # ours). Returning no replica would make Ray retry forever, and raising would only
            # be logged by Ray's routing task, which then retries the same request.
            if not isinstance(exc, UnroutableRequest):
                log.exception("prefixroute: routing failed")
            if not pending_request.future.done():
                pending_request.future.set_exception(exc)
            return [list(candidate_replicas)]  # Ray sees the finished future and stops

    def _rank(
        self, candidates: list[RunningReplica], pending_request: PendingRequest
    ) -> list[list[RunningReplica]]:
        key = route_key(pending_request.args, pending_request.kwargs)
        by_name = {replica_name(r.replica_id): r for r in candidates}
        for name, replica in by_name.items():
            stats = replica.routing_stats
            if stats and self._stats_read.get(name) is not stats:  # a new poll's
                self._stats_read[name] = stats
                self.ledger.observe(name, stats)
        request_id = str(pending_request.metadata.internal_request_id)
        decision = self.ledger.route(request_id, key, list(by_name))
        self._follow(request_id, pending_request.future)
        chosen = by_name[decision.replica]
        rest = [r for r in candidates if r is not chosen]
        return [[chosen], rest] if rest else [[chosen]]

    def _follow(self, request_id: str, future: asyncio.Future[Any]) -> None:
        """Learn where Ray sent the request, or that it gave up, from the request's future."""
        if self.ledger.watch(request_id, future):
            future.add_done_callback(functools.partial(self._on_future_done, request_id))

    def _on_future_done(self, request_id: str, future: asyncio.Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            self.ledger.cancelled(request_id)
            return
        self._sent(request_id, replica_name(future.result().replica_id))

    def _sent(self, request_id: str, replica: ReplicaId, accepted: bool = False) -> None:
        estimate = self.ledger.sent(request_id, replica, accepted)
        if estimate is not None:  # Ray never shows us the first token: assume it when due
            self._prefill_due(estimate.delay_s, estimate.request_id, estimate.attempt)

    def _prefill_due(self, delay_s: float, request_id: str, attempt: int) -> None:
        asyncio.get_running_loop().call_later(delay_s, self._prefilled, request_id, attempt)

    def _prefilled(self, request_id: str, attempt: int) -> None:
        again = self.ledger.prefilled(request_id, attempt)
        if again is not None:  # requests ahead of it on that replica are not through
            self._prefill_due(again, request_id, attempt)

    # --- Ray's lifecycle hooks ------------------------------------------------------------
    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        """The replica accepted the request (Ray's rejection protocol): an attempt whose
        completion comes without this was rejected (``Ledger``)."""
        request_id = str(pending_request.metadata.internal_request_id)
        self._sent(request_id, replica_name(replica_id), accepted=True)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        """Fired once per attempt Ray sent, however it ended, on Ray's router loop."""
        self.ledger.completed(str(internal_request_id), replica_name(replica_id))

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        names = [replica_name(r.replica_id) for r in replicas]
        self.ledger.sync(names)
        self._stats_read = {n: s for n, s in self._stats_read.items() if n in names}

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.ledger.remove(replica_name(replica_id))
        log.info("prefixroute: replica %s died; dropped from the index", replica_id)
