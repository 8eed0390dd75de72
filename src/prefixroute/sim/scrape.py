"""The engines' prefill metrics, scraped: what a gateway reads of a vLLM replica's /metrics.

A gateway scrapes each replica every health round (``scrape_metrics``, on by default) and learns
the replica's prefill rate from vLLM's ``vllm:request_prefill_time_seconds`` and
``vllm:request_prefill_kv_computed_tokens`` (gateway/_scrape.py). Those need no first token, so
they are how a fleet whose clients never stream learns its speeds. The simulator's router saw
none of it, and a fleet sent only plain answers stayed on its priors in every simulated run,
where a gateway in front of vLLM would learn. ``ClusterSim(scrape_s=S)`` (``simulate --scrape
S``) hands the router each replica's interval every ``S`` simulated seconds, as the gateway does
(``Router.observe_engine_prefill``).

The totals are the emulated replica's (emulate/_engine.py), which follow vLLM's: over requests
that finished, the time from admission to first token, and the prompt tokens less cached ones,
counted when the request finishes. An interval in which no request finished gives nothing.
Each round also reports the requests each engine preempted since the last
(``vllm:num_preemptions_total``; ``Router.observe_preemptions``, core/preemptions.py), after
its prefill times, as the gateway does.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefixroute.core import PreemptionCounts, ReplicaId, Router
from prefixroute.sim.replica import EngineRequest


@dataclass(slots=True)
class _Totals:
    requests: int = 0  # finished with a first token, requests
    seconds: float = 0.0  # their admission-to-first-token time, summed, seconds
    tokens: int = 0  # their prompt tokens less cached ones, tokens


class EngineScrapes:
    """Each replica's prefill totals, and what the last scrape saw of them."""

    def __init__(self) -> None:
        self._now: dict[ReplicaId, _Totals] = {}
        self._seen: dict[ReplicaId, _Totals] = {}
        self._preempted = PreemptionCounts()  # each engine's preemptions, last scraped

    def finished(self, replica: ReplicaId, req: EngineRequest) -> None:
        """``req`` finished on ``replica``: counted as vLLM counts it then."""
        if req.start_s is None or req.first_token_s is None:
            return
        t = self._now.setdefault(replica, _Totals())
        t.requests += 1
        t.seconds += req.first_token_s - req.start_s
        t.tokens += req.prompt_tokens - req.cached_tokens

    def scrape(self, router: Router, replicas: list[tuple[ReplicaId, int]], at: float) -> None:
        """One scrape round at ``at`` of ``replicas`` (each with its engine's preemptions so
        far): each one's interval since the last, to the router."""
        for rid, preempted in replicas:
            self._scrape_prefill(router, rid)
            since = self._preempted.update(rid, preempted)  # None: the first, a baseline
            if since is not None:
                router.observe_preemptions(rid, since, at)

    def _scrape_prefill(self, router: Router, rid: ReplicaId) -> None:
        now = self._now.get(rid)
        if now is None:
            return
        seen = self._seen.setdefault(rid, _Totals())
        requests = now.requests - seen.requests
        if requests > 0:
            router.observe_engine_prefill(
                rid,
                tokens=now.tokens - seen.tokens,
                requests=requests,
                seconds=now.seconds - seen.seconds,
            )
        self._seen[rid] = _Totals(now.requests, now.seconds, now.tokens)
