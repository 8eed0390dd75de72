"""What every ext_proc stream of one picker shares (:class:`PickShared`)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prefixroute.core import Router
from prefixroute.gateway import FleetView, GatewayMetrics, GatewayState, ReplicaRegistry, Tenants
from prefixroute.sync import RouteSync


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
