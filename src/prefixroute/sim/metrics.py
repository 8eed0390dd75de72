"""Scores of one run: prefill work against the oracle floor, cache hits, latency, balance.

The same :class:`PolicyMetrics` is produced by ``prefixroute simulate`` and ``prefixroute bench``
so a simulated run and a live one compare line by line.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from prefixroute.core import BlockHash, BlockHasher, judge_prediction
from prefixroute.sim.records import RequestRecord, RunResult
from prefixroute.sim.workload import Workload

DEFAULT_TTFT_SLO_S = 1.0  # seconds; goodput counts requests whose TTFT is within it


def oracle_floor(workload: Workload, block_size: int) -> int:
    """Prompt tokens that must be computed at least once, with one infinite cache.

    Each distinct full block is computed once; partial tail blocks are always computed; and, as
    in every engine, the last prompt token is always computed (hits are capped at ``prompt-1``).
    """
    hasher = BlockHasher(block_size)
    seen: set[BlockHash] = set()
    floor = 0
    for session in workload.by_start():
        known: list[BlockHash] = []
        for turn in session.turns:
            known = hasher.hash_tokens(turn.tokens, known)
            n = len(turn.tokens)
            limit = max(0, n - 1) // block_size
            hit = 0
            while hit < limit and known[hit] in seen:
                hit += 1
            floor += n - hit * block_size
            seen.update(known)
    return floor


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p90": float("nan"), "p99": float("nan"), "mean": float("nan")}
    arr = np.asarray(values) * 1000.0
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(arr.mean())}


@dataclass(slots=True)
class PolicyMetrics:
    policy: str
    workload: str
    requests: int  # requests issued
    completed: int  # requests that finished
    prompt_tokens: int  # all prompt tokens, tokens
    prefill_tokens: int  # prompt tokens computed by the replicas, tokens
    cached_tokens: int  # prompt tokens reused from a replica's cache, tokens
    oracle_floor: int | None  # minimum prefill with one infinite cache, tokens
    floor_ratio: float | None  # prefill_tokens / oracle_floor
    hit_rate: float  # cached / prompt tokens
    # What the router expected to be cached, tokens (None: no answer said; a live run learns it
    # from the gateway's x-prefixroute-predicted-cached-tokens header, a replica sends none).
    predicted_cached_tokens: int | None
    # Fraction of requests whose actual hit was below the prediction, of those with both (None:
    # none had both).
    stale_rate: float | None
    ttft_ms: dict[str, float]  # p50/p90/p99/mean, milliseconds
    e2e_ms: dict[str, float]
    ttft_total_ms: float  # sum of every request's TTFT (the article's "whole conversation")
    throughput_tok_s: float  # output tokens per second of run time
    requests_per_s: float
    goodput_rps: float  # completed requests per second whose TTFT met the SLO
    slo_attainment: float  # fraction of requests meeting the TTFT SLO
    ttft_slo_ms: float
    duration_s: float  # run time (simulated or wall), seconds
    per_replica_requests: dict[str, int]
    # Simulated runs only (None in a live run, which cannot see them from outside):
    per_replica_busy: dict[str, float] | None  # busy fraction of each replica's lifetime
    evictions: int | None  # blocks evicted by the replicas, blocks
    decision_us: dict[str, float] | None  # routing decision wall time p50/p99/mean, microseconds
    reasons: dict[str, int]  # decisions by reason
    turns: list[dict[str, Any]] = field(default_factory=list)  # per-request detail (small runs)
    itl_ms: dict[str, float] = field(default_factory=dict)  # inter-token latency (live runs)
    errors: int = 0  # requests that failed (live runs)
    # Per replica: its true speed at the end of the run and what the router learned of it:
    # prefill_tokens_per_s, decode_step_s, learned_prefill_tokens_per_s, ... (None: live run)
    per_replica_speed: dict[str, dict[str, float]] | None = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize(
    result: RunResult,
    floor: int | None,
    ttft_slo_s: float = DEFAULT_TTFT_SLO_S,
    detail_limit: int = 12,
) -> PolicyMetrics:
    """The scores of one run (simulated or live) against ``floor`` and a TTFT target."""
    recs = result.records
    done = [r for r in recs if r.finish_s is not None]
    ttfts = [r.ttft_s for r in recs if r.ttft_s is not None]
    prompt = sum(r.prompt_tokens for r in recs)
    # Served: a first token, or an end (a plain answer in a live run shows no first token).
    served = [r for r in recs if r.first_token_s is not None or r.finish_s is not None]
    cached = sum(r.cached_tokens for r in served)
    prefill = sum(r.prompt_tokens - r.cached_tokens for r in served)
    duration = result.duration_s or 1e-9
    good = sum(1 for r in done if r.ttft_s is not None and r.ttft_s <= ttft_slo_s)
    # The SLO is judged where a TTFT can be: not on a live run's plain answers.
    judged = sum(1 for r in recs if not (r.plain and r.first_token_s is None))
    return PolicyMetrics(
        policy=result.policy,
        workload=result.workload,
        requests=len(recs),
        completed=len(done),
        prompt_tokens=prompt,
        prefill_tokens=prefill,
        cached_tokens=cached,
        oracle_floor=floor,
        floor_ratio=prefill / floor if floor else None,
        hit_rate=cached / prompt if prompt else 0.0,
        predicted_cached_tokens=_predicted(recs),
        stale_rate=_stale_rate(recs, result.block_size),
        ttft_ms=_percentiles(ttfts),
        e2e_ms=_percentiles([r.e2e_s for r in done if r.e2e_s is not None]),
        ttft_total_ms=sum(ttfts) * 1000.0,
        throughput_tok_s=sum(r.output_tokens for r in done) / duration,
        requests_per_s=len(done) / duration,
        goodput_rps=good / duration,
        slo_attainment=good / judged if judged else 0.0,
        ttft_slo_ms=ttft_slo_s * 1000.0,
        duration_s=result.duration_s,
        per_replica_requests={rep.replica: rep.requests for rep in result.replicas},
        per_replica_busy=None if result.live else _busy(result, duration),
        evictions=None if result.live else sum(rep.evictions for rep in result.replicas),
        decision_us=None if result.live else _decision_us(recs),
        reasons=dict(Counter(r.reason for r in recs)),
        turns=_turns(recs) if len(recs) <= detail_limit else [],
        per_replica_speed=None if result.live else _speeds(result),
    )


def _predicted(recs: list[RequestRecord]) -> int | None:
    """Predicted cached tokens of the requests told one (None: requests, none told)."""
    told = [r.predicted_cached_tokens for r in recs if r.predicted_cached_tokens is not None]
    return sum(told) if told or not recs else None


def _stale_rate(recs: list[RequestRecord], block: int) -> float | None:
    """Of the requests with both a prediction and the replica's count, the fraction that found
    at least one KV block (``block`` tokens) fewer cached tokens than predicted, as the
    gateway's ``prefixroute_cache_predictions_total`` judges ``over`` (None: requests, none
    with both)."""
    judged = [
        judge_prediction(r.predicted_cached_tokens, r.cached_tokens, block)
        for r in recs
        if r.predicted_cached_tokens is not None and r.cached_reported
    ]
    if not judged:
        return None if recs else 0.0
    return judged.count("over") / len(judged)


def _decision_us(recs: list[RequestRecord]) -> dict[str, float]:
    """Routing decision wall time p50/p99/mean, microseconds (zeros when none was timed)."""
    decisions = [r.decision_ns / 1000.0 for r in recs if r.decision_ns]
    if not decisions:
        return {"p50": 0.0, "p99": 0.0, "mean": 0.0}
    p50, p99 = map(float, np.percentile(decisions, [50, 99]))
    return {"p50": p50, "p99": p99, "mean": float(np.mean(decisions))}


def _busy(result: RunResult, duration: float) -> dict[str, float]:
    """Each replica's busy fraction of its own lifetime in the run."""
    busy = {}
    for rep in result.replicas:
        end = rep.removed_s if rep.removed_s is not None else duration
        life = max(end - rep.added_s, 1e-9)
        busy[rep.replica] = min(1.0, rep.busy_s / life)
    return busy


def _turns(recs: list[RequestRecord]) -> list[dict[str, Any]]:
    """Per-request detail, for runs small enough to read it (the article's examples)."""
    return [
        {
            "request": r.request_id,
            "replica": r.replica,
            "reason": r.reason,
            "prompt_tokens": r.prompt_tokens,
            "cached_tokens": r.cached_tokens,
            "computed_tokens": r.prompt_tokens - r.cached_tokens,
            "predicted_cached_tokens": r.predicted_cached_tokens,
            "ttft_ms": None if r.ttft_s is None else r.ttft_s * 1000.0,
        }
        for r in recs
    ]


def _speeds(result: RunResult) -> dict[str, dict[str, float]]:
    """Each replica's true speed and what the router learned of it (simulated runs)."""
    return {
        rep.replica: {
            "prefill_tokens_per_s": rep.prefill_tokens_per_s,
            "decode_step_s": rep.decode_step_s,
            "learned_prefill_tokens_per_s": rep.learned_prefill_tokens_per_s,
            "learned_decode_step_s": rep.learned_decode_step_s,
            "first_token_overhead_s": rep.first_token_overhead_s,
            "learned_first_token_overhead_s": rep.learned_first_token_overhead_s,
            "attention_tokens": rep.attention_tokens,
            "learned_attention_tokens": rep.learned_attention_tokens,
            "preemptions": rep.preemptions,
        }
        for rep in result.replicas
        if rep.learned_prefill_tokens_per_s > 0
    }
