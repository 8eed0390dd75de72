"""What every ext_proc stream of one picker shares (:class:`PickShared`)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from prefixroute.core import ReplicaId, Router
from prefixroute.gateway import (
    GATEWAY_STATUSES,
    DecisionEntry,
    FleetView,
    GatewayMetrics,
    GatewayState,
    ReplicaRegistry,
    Tenants,
    Usage,
    end_accounting,
    judge_error_event,
    learned_window,
)
from prefixroute.sync import RouteSync

if TYPE_CHECKING:
    from prefixroute.epp._answer import AnswerReader


@dataclass(slots=True)
class PickShared:
    """What every stream of one picker shares: the gateway's state (router, registry,
    metrics, sync, tokenizer), its tenants, and the picker's own settings."""

    state: GatewayState
    tenants: Tenants
    default_full_duplex: bool = True  # body mode when Envoy does not say (older Envoys)
    fallbacks: int = 0  # endpoints named after the primary, for the proxy to retry on
    clock: Callable[[], float] = time.monotonic  # seconds
    ids: itertools.count[int] = field(default_factory=itertools.count)
    fleet: FleetView | None = None  # the fleet page's recent decisions, when it is mounted
    # Where a clean end's router work runs (:meth:`end`): the picker's server passes the loop's
    # next turn, after Envoy has the last chunk's answer (as the gateway's
    # Release.after_answer); None: at once (PickStream on its own, as its tests drive it).
    later: Callable[[Callable[[], None]], object] | None = None

    @property
    def router(self) -> Router:
        return self.state.router

    @property
    def registry(self) -> ReplicaRegistry:
        return self.state.registry

    @property
    def metrics(self) -> GatewayMetrics:
        return self.state.metrics

    @property
    def sync(self) -> RouteSync | None:
        """sync_redis: each decision, first token and end is also told to the other pickers
        and gateways, as the gateway's proxy tells them (its methods return at once)."""
        return self.state.sync

    def end(self, rid: str, usage: Usage | None, whole: bool, later: bool = False) -> None:
        """The accounting of ``rid`` ends now (``gateway._accounting.end``, the time taken
        now); ``later``: a clean end, whose router work runs where :attr:`later` says."""
        args = (self.router, self.sync, rid, self.clock(), usage, whole)
        if later and self.later is not None:
            self.later(partial(end_accounting, *args))
        else:
            end_accounting(*args)


def judge_answer(
    shared: PickShared, replica: ReplicaId, status: int, *, marked: bool,
    error_status: int | None = None, busy: bool = False,
) -> None:  # fmt: skip
    """The answer's verdict on ``replica``, by the gateway's rules (``gateway._verdict``): a
    gateway status (Envoy could not reach it, or it broke) is a failure, at most one per request
    (``marked``: a fallback already marked the primary); another 5xx counts in its error rate,
    which takes it out only as an outlier, and so does a stream's in-band error of a 5xx
    (``error_status``: ``gateway._sse``; a 4xx one is the request's); any other answer is a
    success. A full replica's answer (``busy``: a 429, SGLang's queue full) is neither: it is
    counted, unblamed, as ``serve`` counts it."""
    registry, now = shared.registry, shared.clock()
    if busy:
        shared.metrics.upstream_failures.labels(replica, "busy").inc()
    elif status < 300 and error_status is not None:
        judge_error_event(shared.metrics, registry, replica, error_status, now)
    elif status >= 500:
        shared.metrics.upstream_failures.labels(replica, "status").inc()
        if status not in GATEWAY_STATUSES:  # 502-504: Envoy's answers when the replica failed
            registry.record_error(replica, now)
        elif not marked:
            registry.record_failure(replica, now, f"status {status}")
    elif status >= 200:
        registry.record_success(replica, now)


def count_answer(
    shared: PickShared, replica: ReplicaId, status: int, reason: str, predicted: int, path: str
) -> None:
    """The requests counter and the fleet page's decision log, as the gateway's: labelled by
    replica id, as the gateway's requests and every other family are, with the pick's reason
    (a fallback that served is routed again only to account for it)."""
    shared.metrics.count_request(replica, status, reason)
    if shared.fleet is not None:
        entry = DecisionEntry(time.time(), replica, reason, status, predicted, path)
        shared.fleet.decisions.record(entry)


def refused(shared: PickShared, replica: ReplicaId, reader: AnswerReader, asked: bool) -> None:
    """What a replica's plain 400 teaches. One that refused the ``stream_options`` the picker
    added (``asked``): no more asking (the proxy cannot resend as serve does; this client got
    the 400). One that says the prompt is over its context window: that window, so the next
    request that needs more goes elsewhere at once (``gateway._context_window``; Envoy relayed
    this one)."""
    if asked and reader.refused_stream_options():
        shared.state.stop_asking_stream_usage(shared.registry.public_name(replica))
    window = reader.window_said()
    if window is not None:
        learned_window(shared.registry, replica, window)
