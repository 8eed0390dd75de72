"""The gateway's Prometheus metrics, on a registry of its own (never the process-global one).

Per request (updated as requests end):

* ``prefixroute_requests_total{replica, status, reason}``: final status; ``replica`` and
  ``reason`` are ``none`` when the request never reached a routing decision.
* ``prefixroute_predicted_cached_tokens_total{replica}`` and
  ``prefixroute_actual_cached_tokens_total{replica}``: the router's prediction and the replica's
  reported ``cached_tokens``, both counted only for responses that reported usage, so the two
  are comparable; ``prefixroute_usage_missing_total{replica}`` counts the rest.
* ``prefixroute_decision_seconds``: time to hash the prompt and decide, seconds.
* ``prefixroute_retries_total{reason}``, ``prefixroute_upstream_failures_total{replica, kind}``.

Read live at scrape: ``prefixroute_in_flight{replica}`` (the router's own load accounting),
``prefixroute_replica_healthy{replica}``, ``prefixroute_prefix_index_blocks`` (distinct
blocks), ``prefixroute_prefix_index_entries`` and ``prefixroute_prefix_index_evictions_total``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from prefixroute.core import Router
from prefixroute.gateway._registry import ReplicaRegistry

# Decisions take microseconds to a few milliseconds (long prompts hash more blocks).
DECISION_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2)


class GatewayMetrics:
    def __init__(self, router: Router, replicas: ReplicaRegistry) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "prefixroute_requests",
            "Requests answered, by replica, HTTP status and routing reason.",
            ["replica", "status", "reason"],
            registry=r,
        )
        self.predicted_cached = Counter(
            "prefixroute_predicted_cached_tokens",
            "Prompt tokens the router predicted cached (responses that reported usage).",
            ["replica"],
            registry=r,
        )
        self.actual_cached = Counter(
            "prefixroute_actual_cached_tokens",
            "Prompt tokens the replica reported cached (usage.prompt_tokens_details).",
            ["replica"],
            registry=r,
        )
        self.usage_missing = Counter(
            "prefixroute_usage_missing",
            "Responses without usage.prompt_tokens_details.cached_tokens.",
            ["replica"],
            registry=r,
        )
        self.decision_seconds = Histogram(
            "prefixroute_decision_seconds",
            "Time to hash a request and choose its replica, seconds.",
            buckets=DECISION_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            "prefixroute_retries",
            "Requests retried on another replica after a failure before the first byte.",
            ["reason"],
            registry=r,
        )
        self.upstream_failures = Counter(
            "prefixroute_upstream_failures",
            "Upstream failures, by replica and kind.",
            ["replica", "kind"],
            registry=r,
        )
        r.register(_LiveCollector(router, replicas))
        # Labelled children by (metric, labels): ``labels()`` takes a lock and builds a key on
        # every call; these are looked up once per request, so keep them.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def _child(self, metric: Counter, *labels: str) -> Any:
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def count_request(self, replica: str, status: int, reason: str) -> None:
        self._child(self.requests, replica, str(status), reason).inc()

    def observe_usage(self, replica: str, predicted: int, actual: int | None) -> None:
        if actual is None:
            self._child(self.usage_missing, replica).inc()
            return
        self._child(self.predicted_cached, replica).inc(predicted)
        self._child(self.actual_cached, replica).inc(actual)


class _LiveCollector(Collector):
    """Numbers read from the router and the registry at scrape time."""

    def __init__(self, router: Router, replicas: ReplicaRegistry) -> None:
        self.router = router
        self.replicas = replicas

    def collect(self) -> Iterator[Metric]:
        in_flight = GaugeMetricFamily(
            "prefixroute_in_flight", "Requests in flight, by replica.", labels=["replica"]
        )
        healthy = GaugeMetricFamily(
            "prefixroute_replica_healthy",
            "1 when the replica may get new requests (healthy and not draining).",
            labels=["replica"],
        )
        for record in self.replicas:
            in_flight.add_metric([record.url], self.replicas.in_flight(record.id))
            ok = record.healthy and not record.draining
            healthy.add_metric([record.url], 1.0 if ok else 0.0)
        yield in_flight
        yield healthy
        index = self.router.index
        yield GaugeMetricFamily(
            "prefixroute_prefix_index_blocks", "Distinct blocks in the prefix index.", len(index)
        )
        yield GaugeMetricFamily(
            "prefixroute_prefix_index_entries",
            "(replica, block) entries in the prefix index.",
            index.entries,
        )
        yield CounterMetricFamily(
            "prefixroute_prefix_index_evictions",
            "Prefix-index entries evicted by per-replica capacity.",
            index.evictions,
        )
