"""The gateway's Prometheus metrics, on a registry of its own (never the process-global one).

Per request (updated as requests end):

* ``prefixroute_requests_total{replica, status, reason}``: final status; ``replica`` and
  ``reason`` are ``none`` when the request never reached a routing decision.
* ``prefixroute_predicted_cached_tokens_total{replica}`` and
  ``prefixroute_actual_cached_tokens_total{replica}``: the router's prediction and the replica's
  reported ``cached_tokens``, both counted only for responses that reported usage, so the two
  are comparable; ``prefixroute_usage_missing_total{replica}`` counts the rest.
  ``prefixroute_prompt_tokens_total{replica}``: the prompt tokens those responses reported, so
  ``actual / prompt`` is the replicas' prefix hit rate and ``predicted / prompt`` the router's.
* ``prefixroute_cache_predictions_total{replica, outcome}``: each of those responses judged
  ``exact`` (predicted == reported), ``over`` (predicted more than the replica had: a stale
  decision) or ``under``; the stale-decision rate is ``over / sum``.
* ``prefixroute_decision_seconds``: time to hash the prompt and decide, seconds.
* ``prefixroute_tokenize_seconds`` and ``prefixroute_tokenize_failures_total`` (with a
  tokenizer): the cost of one prompt's tokenization in its worker thread, seconds.
* ``prefixroute_retries_total{reason}``, ``prefixroute_upstream_failures_total{replica, kind}``
  (every failure seen, whoever's fault), ``prefixroute_request_faults_total{kind}`` (failures a
  request repeated on a second replica, or that a second replica refused as a bad request:
  counted against no replica) and ``prefixroute_cut_streams_total{reason}`` (``slow_client``:
  a client that stopped making room for the stream; ``shutdown``: cut at the drain bound).

Read live at scrape: ``prefixroute_in_flight{replica}`` (the router's own load accounting),
``prefixroute_replica_healthy{replica}``, ``prefixroute_chars_per_token{model}`` (each model's
characters per token as the router has learned them from usage; ``model="none"`` for requests
that named none), ``prefixroute_prefix_index_blocks`` (distinct
blocks), ``prefixroute_prefix_index_entries`` and ``prefixroute_prefix_index_evictions_total``.
In precise mode also ``prefixroute_speculative_entries`` and, per replica, the KV-event streams:
``prefixroute_kv_event_batches_total``, ``prefixroute_kv_events_total{type}``,
``prefixroute_kv_event_gaps_total``, ``prefixroute_kv_event_replayed_total``,
``prefixroute_kv_event_resyncs_total{cause}`` (gap, restart, cleared),
``prefixroute_kv_event_decode_errors_total``, ``prefixroute_kv_event_blocks_total{kind}``
(stored, removed, orphan, skipped) and ``prefixroute_kv_event_stream_state{state}`` (1 for the
current one of waiting, live, resyncing).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from prefixroute.core import Router
from prefixroute.events import StreamState
from prefixroute.gateway._registry import ReplicaRegistry

if TYPE_CHECKING:
    from prefixroute.gateway._precise import PreciseMode

# Decisions take microseconds to a few milliseconds (long prompts hash more blocks).
DECISION_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2)
# Tokenizing a prompt: ~2 microseconds a token (a 1,700-token prompt: a few milliseconds).
TOKENIZE_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.5)


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
        self.prompt_tokens = Counter(
            "prefixroute_prompt_tokens",
            "Prompt tokens the replica reported (responses that reported cached tokens).",
            ["replica"],
            registry=r,
        )
        self.usage_missing = Counter(
            "prefixroute_usage_missing",
            "Responses without usage.prompt_tokens_details.cached_tokens.",
            ["replica"],
            registry=r,
        )
        self.cache_predictions = Counter(
            "prefixroute_cache_predictions",
            "Responses with usage, by whether the predicted cached tokens were exact, over "
            "(a stale decision) or under the replica's report.",
            ["replica", "outcome"],
            registry=r,
        )
        self.tokenize_seconds = Histogram(
            "prefixroute_tokenize_seconds",
            "Time to tokenize one prompt (chat template included) in a worker thread, seconds.",
            buckets=TOKENIZE_BUCKETS,
            registry=r,
        )
        self.tokenize_failures = Counter(
            "prefixroute_tokenize_failures",
            "Prompts that could not be tokenized (routed on their text instead).",
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
        self.request_faults = Counter(
            "prefixroute_request_faults",
            "Failures judged the request's own (the same on two replicas): no replica marked.",
            ["kind"],
            registry=r,
        )
        self.cut_streams = Counter(
            "prefixroute_cut_streams",
            "Responses the gateway ended early: slow_client (not reading) or shutdown (drain).",
            ["reason"],
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

    def observe_usage(
        self, replica: str, predicted: int, actual: int | None, prompt: int | None = None
    ) -> None:
        if actual is None:
            self._child(self.usage_missing, replica).inc()
            return
        if prompt is not None:
            self._child(self.prompt_tokens, replica).inc(prompt)
        self._child(self.predicted_cached, replica).inc(predicted)
        self._child(self.actual_cached, replica).inc(actual)
        outcome = "exact" if predicted == actual else "over" if predicted > actual else "under"
        self._child(self.cache_predictions, replica, outcome).inc()

    def watch_precise(self, precise: PreciseMode) -> None:
        """Report precise mode's event streams (read at scrape)."""
        self.registry.register(_EventCollector(precise))


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
        prefill_rate = GaugeMetricFamily(
            "prefixroute_replica_prefill_tokens_per_second",
            "The replica's prefill rate as the router has learned it (the prior until then).",
            labels=["replica"],
        )
        decode_step = GaugeMetricFamily(
            "prefixroute_replica_decode_step_seconds",
            "The replica's per-step decode overhead as the router has learned it, seconds.",
            labels=["replica"],
        )
        observations = GaugeMetricFamily(
            "prefixroute_replica_speed_observations",
            "Requests the replica's speed estimate has learned from, by phase.",
            labels=["replica", "phase"],
        )
        loads = self.router.loads
        for record in self.replicas:
            in_flight.add_metric([record.url], self.replicas.in_flight(record.id))
            ok = record.healthy and not record.draining
            healthy.add_metric([record.url], 1.0 if ok else 0.0)
            speed = loads.get(record.id).speed
            prefill_rate.add_metric([record.url], speed.prefill_tokens_per_s)
            decode_step.add_metric([record.url], speed.decode_step_s)
            observations.add_metric([record.url, "prefill"], speed.prefill_observations)
            observations.add_metric([record.url, "decode"], speed.decode_observations)
        yield in_flight
        yield healthy
        yield prefill_rate
        yield decode_step
        yield observations
        chars = GaugeMetricFamily(
            "prefixroute_chars_per_token",
            "Characters of routing text per engine token, learned per model from usage.",
            labels=["model"],
        )
        for model, learned in self.router.tokens.models().items():
            chars.add_metric([model if model is not None else "none"], learned.value)
        yield chars
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


class _EventCollector(Collector):
    """Precise mode's KV-event streams, read from the subscribers at scrape time."""

    def __init__(self, precise: PreciseMode) -> None:
        self.precise = precise

    def collect(self) -> Iterator[Metric]:
        def counter(name: str, doc: str, *labels: str) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=["replica", *labels])

        batches = counter("prefixroute_kv_event_batches", "KV-event batches applied.")
        events = counter("prefixroute_kv_events", "KV events applied, by type.", "type")
        gaps = counter("prefixroute_kv_event_gaps", "Sequence gaps (lost batches).")
        replayed = counter("prefixroute_kv_event_replayed", "Batches recovered by replay.")
        resyncs = counter(
            "prefixroute_kv_event_resyncs", "Replica entries cleared, by cause.", "cause"
        )
        errors = counter("prefixroute_kv_event_decode_errors", "Undecodable messages.")
        blocks = counter("prefixroute_kv_event_blocks", "Blocks in KV events, by fate.", "kind")
        state = GaugeMetricFamily(
            "prefixroute_kv_event_stream_state",
            "1 for the stream's current state (waiting, live, resyncing).",
            labels=["replica", "state"],
        )
        router = self.precise.router
        speculative = router.speculative
        for replica, sub in self.precise.subscribers.items():
            st, ix = sub.stats, sub.indexer.stats
            batches.add_metric([replica], st.batches)
            events.add_metric([replica, "BlockStored"], ix.stored_events)
            events.add_metric([replica, "BlockRemoved"], ix.removed_events)
            events.add_metric([replica, "AllBlocksCleared"], ix.cleared_events)
            gaps.add_metric([replica], st.gaps)
            replayed.add_metric([replica], st.replayed)
            for cause in ("gap", "restart", "cleared"):
                resyncs.add_metric([replica, cause], st.resyncs.get(cause, 0))
            errors.add_metric([replica], st.decode_errors)
            blocks.add_metric([replica, "stored"], ix.stored_blocks)
            blocks.add_metric([replica, "removed"], ix.removed_blocks)
            blocks.add_metric([replica, "orphan"], ix.orphan_blocks)
            blocks.add_metric([replica, "skipped"], ix.skipped_blocks)
            for s in StreamState:
                state.add_metric([replica, s.value], 1.0 if sub.state is s else 0.0)
        yield from (batches, events, gaps, replayed, resyncs, errors, blocks, state)
        if speculative is not None:
            yield GaugeMetricFamily(
                "prefixroute_speculative_entries",
                "(replica, block) speculative entries not yet expired.",
                len(speculative),
            )
