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

**Calls that share Ray's request id.** Every handle call a replica makes while serving one
request inherits that request's ``internal_request_id`` (Ray says so: "an internal request ID
can be shared by dependent handle calls"), so an ingress that fans out (``asyncio.gather`` of
several calls) or calls again makes several requests under one id. Each gets its own id in our
ledger (the internal id and a number, kept on the ``PendingRequest``, which a retry reuses), and
a completion notice, which names only the internal id, ends the oldest of them sent to that
replica. Ray's base router hands a replica found for a request to the pending request
registered under its id, the first of them, and the others waited for ever while their routing
tasks spun (an outside audit, 2026-12-07): here a replica goes to the request whose routing
task found it (:meth:`PrefixRouteRequestRouter._fulfill_next_pending_request`).

**Bad settings.** ``initialize_state`` runs in Ray's long-poll callback, where an exception is
only logged, and every call then waited for a router that was never built. A bad setting is
kept instead and fails each call with it, and is logged once at error level.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import threading
import weakref
from typing import Any

from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from prefixroute.core import ConfigError, ReplicaId
from prefixroute.ray_serve._errors import UnroutableRequest
from prefixroute.ray_serve._key import route_key
from prefixroute.ray_serve._ledger import Ledger
from prefixroute.ray_serve._settings import RouterSettings
from prefixroute.ray_serve._sync import RouterSync

log = logging.getLogger(__name__)

OWN_ID = "_prefixroute_id"  # our ledger id of a PendingRequest, kept on it (module docstring)


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
    _bad_settings: ConfigError | None = None  # kept to fail each call with (module docstring)

    def initialize_state(self, **kwargs: Any) -> None:
        """Ray passes ``request_router_kwargs`` here, once, before routing anything."""
        self._bad_settings = None
        self._stats_read = {}
        self._numbers = itertools.count()
        self._ids: dict[str, list[str]] = {}  # Ray's internal id -> our ids, oldest first
        self._ids_lock = threading.Lock()  # the futures' callbacks may run in other threads
        self._routing: weakref.WeakKeyDictionary[asyncio.Task[Any], PendingRequest]
        self._routing = weakref.WeakKeyDictionary()  # a routing task -> the request it routes
        try:
            self.settings = RouterSettings.from_kwargs(kwargs)
            self.ledger = self.settings.build_ledger()  # (the policy and its params checked)
        except (ConfigError, TypeError, ValueError) as exc:
            # The defaults keep the hooks working; every call fails with the reason.
            self._bad_settings = exc if isinstance(exc, ConfigError) else ConfigError(str(exc))
            self.settings = RouterSettings()
            self.ledger = self.settings.build_ledger()
            log.error("prefixroute: request_router_kwargs refused, every call fails: %s", exc)
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
            if self._bad_settings is not None:
                raise self._bad_settings
            task = asyncio.current_task()
            if task is not None:  # the request this routing task routes (module docstring)
                self._routing[task] = pending_request
            return self._rank(candidate_replicas, pending_request)
        except Exception as exc:
            # Fail this request's caller now, with the reason (UnroutableRequest, or a bug of
            # ours). Returning no replica would make Ray retry forever, and raising would only
            # be logged by Ray's routing task, which then retries the same request.
            if not isinstance(exc, UnroutableRequest | ConfigError):
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
        request_id = self._own_id(pending_request)
        decision = self.ledger.route(request_id, key, list(by_name))
        self._follow(request_id, pending_request.future)
        chosen = by_name[decision.replica]
        rest = [r for r in candidates if r is not chosen]
        return [[chosen], rest] if rest else [[chosen]]

    def _own_id(self, pending_request: PendingRequest) -> str:
        """Our ledger id of ``pending_request``: its internal id and a number, the same for
        its retries (Ray reuses the object; module docstring)."""
        own = getattr(pending_request, OWN_ID, None)
        if own is None:
            internal = str(pending_request.metadata.internal_request_id)
            own = f"{internal}#{next(self._numbers)}"
            setattr(pending_request, OWN_ID, own)
            with self._ids_lock:
                self._ids.setdefault(internal, []).append(own)
        return str(own)

    def _forget_ended(self, internal: str) -> None:
        """Drop the ids under ``internal`` whose requests the ledger no longer follows."""
        with self._ids_lock:
            kept = [own for own in self._ids.get(internal, ()) if self.ledger.follows(own)]
            if kept:
                self._ids[internal] = kept
            else:
                self._ids.pop(internal, None)

    def _fulfill_next_pending_request(
        self, replica: RunningReplica, request_metadata: Any = None
    ) -> None:
        """Ray's call when a routing task found ``replica``: give it to the request that task
        routes, as ranked; Ray's own lookup by internal id otherwise (module docstring)."""
        task = asyncio.current_task()
        routed = self._routing.pop(task, None) if task is not None else None
        if routed is None or routed.future.done():
            super()._fulfill_next_pending_request(replica, request_metadata)
            return
        self._record_queue_wait_time(routed)
        routed.future.set_result(replica)
        if self._pending_requests_by_id.get(routed.metadata.internal_request_id) is routed:
            self._remove_pending_request_from_indices(routed)

    def _follow(self, request_id: str, future: asyncio.Future[Any]) -> None:
        """Learn where Ray sent the request, or that it gave up, from the request's future."""
        if self.ledger.watch(request_id, future):
            future.add_done_callback(functools.partial(self._on_future_done, request_id))

    def _on_future_done(self, request_id: str, future: asyncio.Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            self.ledger.cancelled(request_id)
            self._forget_ended(request_id.rpartition("#")[0])
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
        own = getattr(pending_request, OWN_ID, None)
        if own is not None:
            self._sent(str(own), replica_name(replica_id), accepted=True)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        """Fired once per attempt Ray sent, however it ended, on Ray's router loop; it names
        Ray's internal id only, so it ends the oldest of ours under it sent to that replica."""
        internal, name = str(internal_request_id), replica_name(replica_id)
        with self._ids_lock:
            ours = list(self._ids.get(internal, ()))
        for own in ours:
            if self.ledger.completed(own, name):
                break
        self._forget_ended(internal)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        names = [replica_name(r.replica_id) for r in replicas]
        self.ledger.sync(names)
        self._stats_read = {n: s for n, s in self._stats_read.items() if n in names}

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.ledger.remove(replica_name(replica_id))
        log.info("prefixroute: replica %s died; dropped from the index", replica_id)
