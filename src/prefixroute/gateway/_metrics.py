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
  ``exact`` (predicted and reported less than one KV block apart), ``over`` (predicted a block
  or more beyond what the replica had: a stale decision) or ``under``; the stale-decision rate
  is ``over / sum`` (``core/cache_prediction.py`` says why within a block is exact).
* ``prefixroute_decision_seconds``: time to hash the prompt and decide, seconds.
* ``prefixroute_tokenize_seconds`` and ``prefixroute_tokenize_failures_total`` (with a
  tokenizer): the cost of one prompt's tokenization in its worker thread, seconds.
* ``prefixroute_token_probes_total{outcome}`` (approximate mode): replicas asked to count a
  model's tokens on ``/tokenize`` before any answer told its characters per token
  (``_token_probe``): ``learned``, ``unsupported`` (no such endpoint) or ``failed``.
* ``prefixroute_retries_total{reason}``, ``prefixroute_upstream_resends_total``,
  ``prefixroute_first_byte_extensions_total{replica}`` (first-byte deadlines that moved on
  because the replica was still at work: ``_first_byte``),
  ``prefixroute_upstream_failures_total{replica, kind}``
  (every failure seen, whoever's fault), ``prefixroute_request_faults_total{kind}`` (failures a
  request repeated on a second replica, or that a second replica refused as a bad request:
  counted against no replica) and ``prefixroute_cut_streams_total{reason}`` (``slow_client``:
  a client that stopped making room for the stream; ``shutdown``: cut at the drain bound).

Read live at scrape: ``prefixroute_in_flight{replica}`` (the router's own load accounting),
``prefixroute_replica_healthy{replica}`` (0 while out or draining),
``prefixroute_replica_ejections_total{replica}`` (times taken out),
``prefixroute_replica_cache_lost_total{replica}`` (times its whole cache was taken as lost: its
engine restarted or refused connections, ``gateway/_health.py``), each replica's learned speed
(``prefixroute_replica_prefill_tokens_per_second``, ``_decode_step_seconds``,
``_first_token_overhead_seconds``, ``_prefill_attention_seconds``, ``_speed_observations``,
``_effective_prefill_tokens_per_second``: the rate with attention at its typical context, and
``_prefill_alone``: 1 where its prefill runs alone, core/batch_mixing.py)
and how good its TTFT
predictions are (``prefixroute_replica_ttft_prediction_error``: the median of
``|predicted / measured - 1|`` over its last 64 predicted first tokens past the warm-up;
``prefixroute_replica_ttft_predictions_total``), ``prefixroute_chars_per_token{model}`` (each
model's characters per token as the router has learned them from usage; ``model="none"`` for
requests that named none), ``prefixroute_prefix_index_blocks`` (distinct blocks),
``prefixroute_prefix_index_entries``, ``prefixroute_prefix_index_evictions_total`` and
``prefixroute_prefix_index_withdrawn_blocks_total`` (blocks a decision added and took back, the
replica having turned the request away: ``Router.withdraw``).
In precise mode also ``prefixroute_speculative_entries`` and, per replica, the KV-event streams:
``prefixroute_kv_event_batches_total``, ``prefixroute_kv_events_total{type}``,
``prefixroute_kv_event_gaps_total``, ``prefixroute_kv_event_replayed_total``,
``prefixroute_kv_event_resyncs_total{cause}`` (gap, restart, reconnect, cleared, error),
``prefixroute_kv_event_decode_errors_total``, ``prefixroute_kv_event_unknown_total`` (events
of types we do not know, skipped), ``prefixroute_kv_event_blocks_total{kind}``
(stored, removed, orphan, skipped, recalled), ``prefixroute_kv_event_replay_failures_total``,
``prefixroute_kv_event_caught_up_total`` (batches from before a stream was first heard,
replayed), ``prefixroute_kv_event_last_batch_age_seconds`` and
``prefixroute_kv_event_stream_state{state}`` (1 for the current one of waiting, live,
resyncing): ``gateway/_event_metrics.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any, get_args

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from prefixroute.core import Judgement, Router, judge_prediction
from prefixroute.gateway._event_metrics import EventCollector
from prefixroute.gateway._registry import ReplicaRegistry

if TYPE_CHECKING:
    from prefixroute.gateway._precise import PreciseMode

# Decisions take microseconds to a few milliseconds (long prompts hash more blocks).
DECISION_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2)
# Tokenizing a prompt: ~2 microseconds a token (a 1,700-token prompt: a few milliseconds).
TOKENIZE_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.5)


class GatewayMetrics:
    """The per-request families, one declaration each, and the collectors read at scrape."""

    def __init__(self, router: Router, replicas: ReplicaRegistry) -> None:
        self.kv_block = router.kv_block_size()  # a prediction within one block is exact
        self.registry = r = CollectorRegistry(auto_describe=True)
        # Labelled children by (metric, labels): ``labels()`` takes a lock and builds a key on
        # every call; these are looked up once per request, so keep them.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        counter = partial(_counter, r)
        self.requests = counter(
            "prefixroute_requests",
            "Requests answered, by replica, HTTP status (499: the client went away before its "
            "answer ended) and routing reason.",
            "replica", "status", "reason",
        )  # fmt: skip
        self._usage_families(counter, replicas)
        self.tokenize_seconds = Histogram(
            "prefixroute_tokenize_seconds",
            "Time to tokenize one prompt (chat template included) in a worker thread, seconds.",
            buckets=TOKENIZE_BUCKETS,
            registry=r,
        )
        self.tokenize_failures = counter(
            "prefixroute_tokenize_failures",
            "Prompts that could not be tokenized (routed on their text instead).",
        )
        self.token_probes = counter(
            "prefixroute_token_probes",
            "Replicas asked to count a model's tokens (POST /tokenize) before its answers told "
            "its characters per token, by outcome: learned, unsupported, failed.",
            "outcome",
        )
        self.decision_seconds = Histogram(
            "prefixroute_decision_seconds",
            "Time to hash a request and choose its replica, seconds.",
            buckets=DECISION_BUCKETS,
            registry=r,
        )
        self._failure_families(counter)
        r.register(_LiveCollector(router, replicas))

    def _usage_families(self, counter: Callable[..., Counter], replicas: ReplicaRegistry) -> None:
        """What the replicas' usage reports say of the cache predictions. Each replica's series
        exist at 0 from its registration: a series that appears only at its first count leaves
        rate() and alerts on it without data until then."""
        self.predicted_cached = counter(
            "prefixroute_predicted_cached_tokens",
            "Prompt tokens the router predicted cached (responses that reported usage).",
            "replica",
        )
        self.actual_cached = counter(
            "prefixroute_actual_cached_tokens",
            "Prompt tokens the replica reported cached (usage.prompt_tokens_details).",
            "replica",
        )
        self.prompt_tokens = counter(
            "prefixroute_prompt_tokens",
            "Prompt tokens the replica reported (responses that reported cached tokens).",
            "replica",
        )
        self.usage_missing = counter(
            "prefixroute_usage_missing",
            "Responses without usage.prompt_tokens_details.cached_tokens.",
            "replica",
        )
        self.cache_predictions = counter(
            "prefixroute_cache_predictions",
            "Responses with usage, by whether the predicted cached tokens were exact (within "
            "one KV block), over (by a block or more: a stale decision) or under the "
            "replica's report.",
            "replica", "outcome",
        )  # fmt: skip
        for record in replicas:
            self._zero_series(record.id)
        replicas.on_added(self._zero_series)

    def _failure_families(self, counter: Callable[..., Counter]) -> None:
        """Retries, failures and streams cut short."""
        self.retries = counter(
            "prefixroute_retries",
            "Requests sent to another replica after a failure (or a 429) before the first byte.",
            "reason",
        )
        self.resends = counter(
            "prefixroute_upstream_resends",
            "Requests sent again to the same replica: the pooled connection they went out on "
            "had been closed by the replica (its keep-alive timeout), before any answer.",
        )
        self.first_byte_extensions = counter(
            "prefixroute_first_byte_extensions",
            "First-byte deadlines moved on: the replica sent other requests' first tokens or "
            "answers meanwhile (busy, not stopped).",
            "replica",
        )
        self.upstream_failures = counter(
            "prefixroute_upstream_failures",
            "Upstream failures, by replica and kind.",
            "replica", "kind",
        )  # fmt: skip
        self.request_faults = counter(
            "prefixroute_request_faults",
            "Failures judged the request's own (the same on two replicas): no replica marked.",
            "kind",
        )
        self.cut_streams = counter(
            "prefixroute_cut_streams",
            "Responses the gateway ended early: slow_client (not reading) or shutdown (drain).",
            "reason",
        )

    def _zero_series(self, replica: str) -> None:
        """Create ``replica``'s usage and cache-prediction series, at 0."""
        for metric in (self.predicted_cached, self.actual_cached, self.prompt_tokens,
                       self.usage_missing):  # fmt: skip
            self._child(metric, replica)
        for outcome in get_args(Judgement):
            self._child(self.cache_predictions, replica, outcome)

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
        outcome = judge_prediction(predicted, actual, self.kv_block)
        self._child(self.cache_predictions, replica, outcome).inc()

    def watch_precise(self, precise: PreciseMode) -> None:
        """Report precise mode's event streams (read at scrape)."""
        self.registry.register(EventCollector(precise))


def _counter(registry: CollectorRegistry, name: str, doc: str, *labels: str) -> Counter:
    return Counter(name, doc, labels, registry=registry)


class _LiveCollector(Collector):
    """Numbers read from the router and the registry at scrape time."""

    def __init__(self, router: Router, replicas: ReplicaRegistry) -> None:
        self.router = router
        self.replicas = replicas

    def collect(self) -> Iterator[Metric]:
        yield from self._replicas()
        chars = GaugeMetricFamily(
            "prefixroute_chars_per_token",
            "Characters of routing text per engine token, learned per model from usage.",
            labels=["model"],
        )
        for model, learned in self.router.chars_per_token().items():
            chars.add_metric([model if model is not None else "none"], learned.value)
        yield chars
        router = self.router
        yield GaugeMetricFamily(
            "prefixroute_prefix_index_blocks",
            "Distinct blocks in the prefix index.",
            router.index_blocks(),
        )
        yield GaugeMetricFamily(
            "prefixroute_prefix_index_entries",
            "(replica, block) entries in the prefix index.",
            router.index_entries(),
        )
        yield CounterMetricFamily(
            "prefixroute_prefix_index_evictions",
            "Prefix-index entries evicted by per-replica capacity.",
            router.index_evictions(),
        )
        yield CounterMetricFamily(
            "prefixroute_prefix_index_withdrawn_blocks",
            "Prefix-index entries taken back because the replica turned the request away.",
            router.index_withdrawals(),
        )

    def _replicas(self) -> Iterator[Metric]:
        """The per-replica families: in flight, health and learned speed."""
        in_flight = _gauge("prefixroute_in_flight", "Requests in flight, by replica.")
        healthy = _gauge(
            "prefixroute_replica_healthy",
            "1 when the replica may get new requests (healthy and not draining).",
        )
        prefill_rate = _gauge(
            "prefixroute_replica_prefill_tokens_per_second",
            "The replica's prefill rate as the router has learned it (until then its own "
            "priors, the fleet's learned median, or the configured prior).",
        )
        decode_step = _gauge(
            "prefixroute_replica_decode_step_seconds",
            "The replica's per-step decode overhead as the router has learned it, seconds.",
        )
        observations = _gauge(
            "prefixroute_replica_speed_observations",
            "Observations the replica's speed estimate has learned from, by phase (engine: "
            "scrape intervals of its prefill-time metrics; whole: plain answers, also in prefill).",
            "phase",
        )
        slots = _gauge(
            "prefixroute_replica_batch_slots",
            "Requests the replica's engine runs at once, as told (max_running) or learned from "
            "its reports of a full batch; absent while unknown.",
        )
        ejections = CounterMetricFamily(
            "prefixroute_replica_ejections",
            "Times the replica was taken out (failures, or a failed first probe); an ejection "
            "lasts eject_s, shorter than many scrape intervals, so count them here.",
            labels=["replica"],
        )
        # A restart or a refusal the index was cleared for, which no other series shows.
        lost = CounterMetricFamily(
            "prefixroute_replica_cache_lost",
            "Times the router took the replica's whole KV cache as lost and forgot its prefixes "
            "(its engine restarted, or refused connections; precise mode: see the KV events).",
            labels=["replica"],
        )
        for record in self.replicas:
            ejections.add_metric([record.url], record.ejections)
            lost.add_metric([record.url], record.cache_losses)
            in_flight.add_metric([record.url], self.replicas.in_flight(record.id))
            ok = record.healthy and not record.draining
            healthy.add_metric([record.url], 1.0 if ok else 0.0)
            speed = self.router.replica_load(record.id).speed
            prefill_rate.add_metric([record.url], speed.prefill_tokens_per_s)
            decode_step.add_metric([record.url], speed.decode_step_s)
            observations.add_metric([record.url, "prefill"], speed.prefill_observations)
            observations.add_metric([record.url, "decode"], speed.decode_observations)
            observations.add_metric([record.url, "engine"], speed.engine_observations)
            observations.add_metric([record.url, "whole"], speed.whole_observations)
            size = self.router.replica_load(record.id).slots.size
            if size is not None:
                slots.add_metric([record.url], size)
        yield from (in_flight, healthy, ejections, lost, prefill_rate, decode_step,
                    observations, slots)  # fmt: skip
        yield from self._predictions()

    def _predictions(self) -> Iterator[Metric]:
        """The learned first-token overhead and attention, and how good the TTFT predictions
        are."""
        overhead = _gauge(
            "prefixroute_replica_first_token_overhead_seconds",
            "Fixed time of every first token (HTTP, tokenizing, scheduling), as learned.",
        )
        attention = _gauge(
            "prefixroute_replica_prefill_attention_seconds",
            "Prefill seconds a prompt token costs per 1,000 tokens of context before it, as "
            "learned (0: the replica's cost does not grow with the context).",
        )
        effective = _gauge(
            "prefixroute_replica_effective_prefill_tokens_per_second",
            "The replica's prefill rate with attention at its typical context, as learned: what "
            "its first tokens measured (the rate alone is loose where prompts are mostly cached).",
        )
        alone = _gauge(
            "prefixroute_replica_prefill_alone",
            "1 where the replica was learned to run prefill alone while decodes wait (SGLang's "
            "default), 0 where its prefill steps also carry the decodes (vLLM's).",
        )
        error = _gauge(
            "prefixroute_replica_ttft_prediction_error",
            "Median |predicted / measured - 1| of the replica's last predicted TTFTs, past "
            "the speed model's warm-up (absent before any).",
        )
        predictions = CounterMetricFamily(
            "prefixroute_replica_ttft_predictions",
            "TTFTs predicted past the warm-up and then measured.",
            labels=["replica"],
        )
        for record in self.replicas:
            speed = self.router.replica_load(record.id).speed
            overhead.add_metric([record.url], speed.first_token_overhead_s)
            attention.add_metric([record.url], speed.attention_s)
            predictions.add_metric([record.url], speed.ttft_predictions)
            seen = speed.snapshot()
            effective.add_metric([record.url], float(seen["effective_prefill_tokens_per_s"] or 0))
            alone.add_metric([record.url], 0.0 if speed.carries_decodes else 1.0)
            p50 = seen["ttft_error_p50"]
            if isinstance(p50, (int, float)):
                error.add_metric([record.url], p50)
        yield from (overhead, attention, effective, alone, error, predictions)


def _gauge(name: str, doc: str, *labels: str) -> GaugeMetricFamily:
    """A gauge family labelled by replica (and ``labels``), filled at scrape."""
    return GaugeMetricFamily(name, doc, labels=["replica", *labels])
