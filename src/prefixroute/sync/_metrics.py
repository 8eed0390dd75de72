"""The Redis sync's Prometheus families (``_sync``), on the gateway's own registry."""

from __future__ import annotations

from prometheus_client import Counter, Gauge
from prometheus_client.registry import CollectorRegistry


class SyncMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(name, doc, labels, registry=registry)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, registry=registry)

        self.published = counter(
            "prefixroute_sync_published",
            "Messages published to the other instances: routing decisions, their ends, and "
            "a heartbeat every second (so more than the others apply).",
        )
        self.applied = counter(
            "prefixroute_sync_applied",
            "Other instances' routing decisions applied to this instance's index.",
        )
        self.dropped = counter(
            "prefixroute_sync_dropped",
            "Messages (decisions, ends, heartbeats) not published because the queue was full "
            "(Redis slow, down, or refusing PUBLISH).",
        )
        self.errors = counter(
            "prefixroute_sync_errors",
            "Sync failures: redis (connection lost or refused, timeouts), decode, auth (a message "
            "not signed under sync_secret), internal.",
            "kind",
        )
        self.skipped = counter(
            "prefixroute_sync_skipped",
            "Other instances' decisions not applied: unknown_replica (a replica this instance "
            "does not route to, or names otherwise: instances must name replicas alike), replayed "
            "(with sync_secret: a decision sent more than 60 s from now, or again after its "
            "request's end; its index entry is applied, not its load), other_hashing (an "
            "instance whose heartbeat says it hashes prompts otherwise: block size, seed).",
            "reason",
        )
        self.replayed = counter(
            "prefixroute_sync_replayed",
            "Decisions applied from the Redis history on (re)connecting (warm start).",
        )
        self.connected = gauge(
            "prefixroute_sync_connected",
            "1 while subscribed to the other instances' decisions (history applied), else 0.",
        )
        self.remote_in_flight = gauge(
            "prefixroute_sync_remote_in_flight",
            "Other instances' requests counted in this instance's load view.",
        )
        self.expired = counter(
            "prefixroute_sync_expired",
            "Other instances' requests dropped from the load view without hearing their end "
            "(their instance silent, or saying fewer are open, or ten minutes passed).",
        )
