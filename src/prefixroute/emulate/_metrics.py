"""vLLM-named Prometheus metrics for the emulated replica, read live from the engine at scrape.

The names are vLLM v1's, so a scraper (or our gateway) that reads a real replica reads this one
too: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``
(a fraction, 0..1, despite the name), ``vllm:prefix_cache_queries_total`` and
``vllm:prefix_cache_hits_total`` (both in tokens), ``vllm:prompt_tokens_total``,
``vllm:generation_tokens_total`` and ``vllm:num_preemptions_total``, and the histograms
``vllm:request_prefill_time_seconds`` (admission to first token, wall seconds) and
``vllm:request_prefill_kv_computed_tokens`` (prompt tokens less cached ones), both observed as
a request finishes, as vLLM does; each labelled ``model_name``; and the info gauge
``vllm:cache_config_info`` whose labels carry the KV cache's ``block_size`` and
``num_gpu_blocks``. The histograms carry their ``_sum`` and
``_count`` (what a scraper averages) and only the ``+Inf`` bucket: vLLM's bucket bounds are not
reproduced.

A collector reads the model when scraped instead of updating gauges on every step: the step loop
stays free of metrics work, and the numbers can never drift from the engine's own.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from prefixroute.emulate._engine import EngineLoop


class EngineCollector(Collector):
    def __init__(self, engine: EngineLoop, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        eng = self.engine
        model = eng.model
        labels = [self.model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=["model_name"])
            g.add_metric(labels, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=["model_name"])
            c.add_metric(labels, value)
            return c

        yield gauge(
            "vllm:num_requests_running", "Requests in the running batch.", model.num_running
        )
        yield gauge(
            "vllm:num_requests_waiting", "Requests waiting to be admitted.", model.num_waiting
        )
        yield gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent.", model.kv_usage
        )
        # vLLM's info gauge of its cache config: the KV cache's size is in its labels.
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=["block_size", "num_gpu_blocks", "enable_prefix_caching"],
        )
        info.add_metric([str(model.config.block_size), str(model.cache.capacity), "True"], 1.0)
        yield info
        yield counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in tokens.", eng.prefix_queries
        )
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.", eng.prefix_hits)
        yield counter("vllm:prompt_tokens", "Prompt tokens admitted.", eng.prompt_tokens)
        yield counter("vllm:generation_tokens", "Output tokens generated.", eng.generation_tokens)
        # Requests preempted (a fleet entry with preempt=1: sim/preemption.py), 0 otherwise.
        yield counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                      model.preemptions)  # fmt: skip
        finished = eng.finished_prefills

        def histogram(name: str, doc: str, total: float) -> HistogramMetricFamily:
            h = HistogramMetricFamily(name, doc, labels=["model_name"])
            h.add_metric(labels, [("+Inf", finished)], total)
            return h

        yield histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            eng.prefill_seconds,
        )
        yield histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            eng.prefill_computed_tokens,
        )


def make_registry(engine: EngineLoop, model_name: str) -> CollectorRegistry:
    """A registry of this replica's own (never the process-global one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine, model_name))
    return registry
