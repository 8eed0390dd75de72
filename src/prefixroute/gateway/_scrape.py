"""Reading a replica's own load numbers from its Prometheus metrics (vLLM or SGLang names).

The gateway's accounting knows what it sent; the engine knows what it is doing (requests
queued inside it, KV-cache usage), including work sent by other gateways. Each health round
scrapes ``/metrics`` and hands the numbers to ``LoadTracker.observe``, which keeps them beside
the gateway's own counts, never mixed in. Several series of one metric (vLLM's ``engine`` label
under data parallelism) are summed for request counts and averaged for cache usage.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")


@dataclass(frozen=True, slots=True)
class EngineLoad:
    num_running: int | None  # requests in the engine's batch
    num_waiting: int | None  # requests queued inside the engine
    kv_usage: float | None  # fraction of the KV cache in use, 0..1


def parse_engine_load(text: str) -> EngineLoad:
    """The load numbers in a metrics page; a number the page lacks is None."""
    found: dict[str, list[float]] = {}
    wanted = set(RUNNING + WAITING + KV_USAGE)
    try:
        for family in text_string_to_metric_families(text):
            if family.name in wanted:
                found.setdefault(family.name, []).extend(s.value for s in family.samples)
    except ValueError:  # not Prometheus text
        return EngineLoad(None, None, None)

    def first(names: tuple[str, ...]) -> list[float] | None:
        return next((found[n] for n in names if found.get(n)), None)

    running, waiting, usage = first(RUNNING), first(WAITING), first(KV_USAGE)
    return EngineLoad(
        round(sum(running)) if running else None,
        round(sum(waiting)) if waiting else None,
        sum(usage) / len(usage) if usage else None,
    )
