"""Reading a replica's own numbers from its Prometheus metrics (vLLM or SGLang names).

The gateway's accounting knows what it sent; the engine knows what it is doing (requests
queued inside it, KV-cache usage), including work sent by other gateways. Each health round
scrapes ``/metrics`` and hands the numbers to ``LoadTracker.observe``, which keeps them beside
the gateway's own counts, never mixed in. Several series of one metric (vLLM's ``engine`` label
under data parallelism) are summed for request counts and averaged for cache usage.

**Prefill times, a speed source.** An engine that exports how long its requests spent in
prefill, and how many uncached prompt tokens they computed, tells the router its prefill rate
without the HTTP exchange or the queue ahead in it (``ReplicaSpeed.observe_engine_prefill``).
Both are cumulative, so one scrape interval is the difference of two scrapes
(:class:`PrefillDeltas`):

* vLLM (v1): ``vllm:request_prefill_time_seconds`` (a histogram: ``_sum`` seconds from being
  scheduled to the first token, ``_count`` requests) and
  ``vllm:request_prefill_kv_computed_tokens`` (its ``_sum``: prompt tokens minus cached ones),
  both observed when a request finishes, so the two cover the same requests. Without the
  second (vLLM before it had it, llm-d-inference-sim), ``vllm:prefix_cache_queries_total`` less
  ``vllm:prefix_cache_hits_total``: both counted together when the prefix cache is queried, at
  scheduling. Not ``vllm:prompt_tokens_total``, which vLLM counts at the first token and
  llm-d-inference-sim at the end: less hits counted earlier, it dipped by a request's cached
  tokens while the request ran, which read as a restart, and a scrape between the two gave an
  interval of 21 tokens for two requests, the next 1,058 for one (tests/gateway, against a
  foreign replica).
* SGLang: ``sglang:per_stage_req_latency_seconds{stage="prefill_forward"}`` with
  ``sglang:prompt_tokens_total`` less ``sglang:cached_tokens_total``.

**Tokens counted at another moment than the times** (the two fallbacks above: at scheduling,
or at the end) cover other requests than an interval's times do: a request under way at a
scrape has its tokens on one side and its time on the other. So an interval in which no
request finished adds to the next (the baseline stays). The requests in flight (running or
waiting) at its start had their tokens counted before it, those at its end in it: its tokens
are off by the difference, which cancels but for the change in their number and the spread of
their sizes, about ``|n_end - n_start| + sqrt(n_start + n_end)`` requests' worth. Such an
interval is given once it spans ``SETTLED_SPAN`` times that many finished requests (a tenth or
so off, as an observation; exact, and given at once, when the engine was idle at both ends).
A bound by the sum of the two would do too, and give an engine that always runs 64 requests
one interval per 1,024 finished; this one, per 91.

A replica without these (no metrics endpoint, an older engine, another server) gives no such
observation; its speed is learned from first tokens alone.

**Preemptions** (core/preemptions.py): vLLM's ``vllm:num_preemptions_total`` and SGLang's
``sglang:num_retracted_requests_total`` count requests the engine preempted (summed over the
series; SGLang's gauge ``sglang:num_retracted_reqs`` resets, so it is not read). SGLang adds
its counter at the first retraction, so a page without one counts none so far
(``core.PreemptionCounts`` turns the totals into each interval's).

**The KV cache's size, for the index.** In approximate and token mode the index forgets a
replica's prefixes at a capacity; the engine knows how many tokens its KV cache holds. vLLM
puts it in the labels of its info gauge ``vllm:cache_config_info`` (``kv_cache_size_tokens``
where the version has it, else ``num_gpu_blocks`` x ``block_size``; one series per engine under
data parallelism, summed), SGLang in ``sglang:max_total_num_tokens``. A label that is not a
whole number ("None" before the engine profiled its memory) counts as absent.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
# (prefill seconds sum, prefill request count, computed tokens (sum) | (prompt, cached) pair)
VLLM_PREFILL = "vllm:request_prefill_time_seconds"
VLLM_COMPUTED = "vllm:request_prefill_kv_computed_tokens_sum"
VLLM_QUERIES, VLLM_HITS = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
SGLANG_STAGES = "sglang:per_stage_req_latency_seconds"
SGLANG_PREFILL_STAGE = "prefill_forward"
SGLANG_PROMPT, SGLANG_CACHED = "sglang:prompt_tokens_total", "sglang:cached_tokens_total"
PREEMPTIONS = ("vllm:num_preemptions_total", "sglang:num_retracted_requests_total")
VLLM_CACHE_CONFIG = "vllm:cache_config_info"
SGLANG_KV_TOKENS = "sglang:max_total_num_tokens"
# Finished requests an interval of tokens counted apart from its times needs per request its
# tokens may be off by (module docstring): they are then within about 1/8 of its requests'.
SETTLED_SPAN = 8
MAX_KV_TOKENS = 2**40  # tokens; beyond any engine's KV cache (a node holds tens of millions)


@dataclass(frozen=True, slots=True)
class PrefillTotals:
    """An engine's cumulative prefill counters, as one scrape shows them."""

    seconds: float  # time its requests spent from scheduling to first token, seconds
    requests: float  # requests those seconds cover
    tokens: float  # uncached prompt tokens they computed, tokens
    # The tokens are counted when their requests' times are (at the end): False, at another
    # moment, so that an interval's two cover other requests while any is in flight.
    aligned: bool = True


@dataclass(frozen=True, slots=True)
class EngineLoad:
    num_running: int | None  # requests in the engine's batch
    num_waiting: int | None  # requests queued inside the engine
    kv_usage: float | None  # fraction of the KV cache in use, 0..1
    prefill: PrefillTotals | None = None  # cumulative prefill counters, when exported
    kv_tokens: int | None = None  # tokens the engine's KV cache holds in all, tokens
    preemptions: int = 0  # requests the engine preempted since it started (0: none said)

    @property
    def in_flight(self) -> int | None:
        """Requests the engine holds, running or waiting (None: the page does not say)."""
        if self.num_running is None or self.num_waiting is None:
            return None
        return self.num_running + self.num_waiting


def parse_engine_load(text: str) -> EngineLoad:
    """The numbers in a metrics page; a number the page lacks is None."""
    samples: dict[str, list[float]] = {}
    kv_tokens: list[int] = []
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                # Every number read here is a count, a time or a share: a NaN, an infinity or
                # a negative one is no reading (and would fail the arithmetic below).
                if not 0.0 <= s.value < math.inf:
                    continue
                if s.name == VLLM_CACHE_CONFIG:
                    kv_tokens.append(_config_kv_tokens(s.labels))
                # SGLang has one histogram per stage under one name: keep prefill's.
                stage = s.labels.get("stage", SGLANG_PREFILL_STAGE)
                if s.name.startswith(SGLANG_STAGES) and stage != SGLANG_PREFILL_STAGE:
                    continue
                samples.setdefault(s.name, []).append(s.value)
    except ValueError:  # not Prometheus text
        return EngineLoad(None, None, None)

    def first(names: tuple[str, ...]) -> list[float] | None:
        return next((samples[n] for n in names if samples.get(n)), None)

    running, waiting, usage = first(RUNNING), first(WAITING), first(KV_USAGE)
    sglang_kv = samples.get(SGLANG_KV_TOKENS)
    if not kv_tokens and sglang_kv:
        kv_tokens = [round(v) for v in sglang_kv]  # finite: the loop above left out the rest
    # Every engine's size, or none: a sum missing one engine would be too small (and one past
    # any real machine's is a wrong page: it would size the index past memory).
    kv_total = sum(kv_tokens) if kv_tokens and min(kv_tokens) > 0 else None
    return EngineLoad(
        round(sum(running)) if running else None,
        round(sum(waiting)) if waiting else None,
        sum(usage) / len(usage) if usage else None,
        _prefill_totals(samples),
        kv_total if kv_total is not None and kv_total <= MAX_KV_TOKENS else None,
        round(sum(first(PREEMPTIONS) or [0.0])),
    )


def _config_kv_tokens(labels: dict[str, str]) -> int:
    """Tokens one vLLM engine's KV cache holds, from its cache config's labels (0: not said)."""

    def whole(name: str) -> int:
        value = labels.get(name, "")
        return int(value) if value.isdigit() else 0

    return whole("kv_cache_size_tokens") or whole("num_gpu_blocks") * whole("block_size")


def _prefill_totals(samples: dict[str, list[float]]) -> PrefillTotals | None:
    def total(name: str) -> float | None:
        values = samples.get(name)
        return sum(values) if values else None

    def pair(histogram: str, tokens: Iterable[tuple[float | None, bool]]) -> PrefillTotals | None:
        """The histogram's totals with the first of ``tokens`` (value, aligned) on the page."""
        seconds, count = total(histogram + "_sum"), total(histogram + "_count")
        if seconds is None or count is None:
            return None
        for computed, aligned in tokens:
            if computed is not None:
                return PrefillTotals(seconds, count, computed, aligned)
        return None

    def less(a: str, b: str) -> float | None:
        x, y = total(a), total(b)
        return x - y if x is not None and y is not None else None

    vllm = pair(VLLM_PREFILL, ((total(VLLM_COMPUTED), True),
                               (less(VLLM_QUERIES, VLLM_HITS), False)))  # fmt: skip
    return vllm or pair(SGLANG_STAGES, ((less(SGLANG_PROMPT, SGLANG_CACHED), False),))


@dataclass(frozen=True, slots=True)
class PrefillDelta:
    """One scrape interval of an engine's prefill: what ``observe_engine_prefill`` takes."""

    tokens: float  # uncached prompt tokens computed, tokens
    requests: int  # requests that finished their prefill, requests
    seconds: float  # their time from scheduling to first token, summed, seconds


class PrefillDeltas:
    """The totals an interval starts from per replica, and the interval since then.

    The first scrape of a replica only sets the baseline: its totals cover the engine's whole
    life, at whatever speed it had then. A total that went down means the engine restarted
    (its counters began again from zero): as Prometheus's ``increase()`` does, the new totals
    are the interval's. An interval with no request finished gives nothing and adds to the
    next, as one whose tokens were counted apart from its times does until it has settled
    (module docstring).
    """

    def __init__(self) -> None:
        # Per replica: the totals the next interval starts from, and the requests in flight
        # then (0: none, or not said).
        self._last: dict[str, tuple[PrefillTotals, int]] = {}

    def forget(self, replica: str) -> None:
        self._last.pop(replica, None)

    def restarted(self, replica: str, totals: PrefillTotals | None) -> bool:
        """Whether ``totals`` are below the last seen, or gone from a page that had them: the
        engine's counters began again, so its process did, and its KV cache with it. Call
        before :meth:`update`. Gone counts: a fresh SGLang exports its prefill series only
        from its first request on (a labelled series appears when first used), so after a
        restart they are absent, not lower, and the restart went unseen (the SGLang audit,
        2026-12-07); vLLM's exist at 0 from the start."""
        last = self._last.get(replica)
        if last is None:
            return False
        if totals is None:
            return True
        return (
            totals.seconds < last[0].seconds
            or totals.requests < last[0].requests
            or totals.tokens < last[0].tokens
        )

    def update(
        self, replica: str, totals: PrefillTotals | None, in_flight: int | None = None
    ) -> PrefillDelta | None:
        """The interval since the baseline, ``totals`` scraped with ``in_flight`` requests
        running or waiting (None: not said), or None while there is none to give."""
        if totals is None:
            self._last.pop(replica, None)  # gone from the page: start again when it is back
            return None
        last = self._last.get(replica)
        if last is None:
            self._last[replica] = (totals, in_flight or 0)
            return None
        if self.restarted(replica, totals):  # a fresh engine had nothing in flight before
            last = self._last[replica] = (PrefillTotals(0.0, 0.0, 0.0, totals.aligned), 0)
        base, base_flight = last
        requests = round(totals.requests - base.requests)
        if requests < 1:
            return None
        if not totals.aligned and in_flight is not None:
            off_by = abs(in_flight - base_flight) + math.sqrt(in_flight + base_flight)
            if requests < SETTLED_SPAN * off_by:  # not settled yet (module docstring)
                return None
        self._last[replica] = (totals, in_flight or 0)
        return PrefillDelta(totals.tokens - base.tokens, requests, totals.seconds - base.seconds)
