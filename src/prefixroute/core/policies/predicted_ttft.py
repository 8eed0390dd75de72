"""predicted_ttft: prefixroute's default policy. Cache hit and queue, in one unit: seconds.

For every candidate it predicts the time to first token if the request joined that replica now:

    ttft(r) = (queued_prefill(r) + uncached(r)) / prefill_rate(r)    # work ahead + ours
            + attention(r) * (queued_context(r) + context(r))  # tokens attend to what is
                                         # before them: ours to what r has cached, the queue's
                                         # to theirs (core/context_cost.py), learned, else 0
            + steps(r) * decode_step_s(r)   if r is decoding    # shared batches
            + decode_step_s(r) / 2          if r is decoding    # rest of the step in progress
            + arrival_rate(r) * ttft * mean_uncached(r) / prefill_rate(r)
                                         if our prompt spans several steps (chunks of requests
                                         arriving meanwhile share those steps)
            + overhead(r)                       # every first token's fixed cost (HTTP,
                                                # templating), learned by a gateway; 0 here
            + max(0, slot_wait(r) - queued_prefill(r) / prefill_rate(r))
                                         # every batch slot taken: running requests must
                                         # finish first, unless the queue ahead is longer

where ``uncached(r)`` is the prompt minus what the index says ``r`` has cached, and
``slot_wait(r)`` is ``(in_flight(r) - slots(r) + 1) / completion_rate(r)`` once ``r``'s batch
size is known (told as its ``max_running``, or learned from its reports of a full batch:
:mod:`prefixroute.core.batch_slots`), else 0. Without it, at 8 slots a conversation followed its
prefix into a full batch and waited there for decodes of seconds: the simulator's p99 TTFT was
1.6-2.3x least_loaded's on a mixed fleet; told the size, 0.51-0.83x (docs/results.md, "Routing
at few batch slots"). ``batch_slots=False`` leaves the term out.

A long match on a replica with a long queue loses to a short queue elsewhere exactly when the
queue costs more than the recomputation saves: affinity yields to balance by arithmetic, not by a
threshold. A hot prefix therefore spreads to a second replica once its first home is busy
enough, and new or empty replicas win as soon as their empty queue beats everybody's cached
prefix (cold start).

**Each replica at its own speed.** ``prefill_rate(r)`` and ``decode_step_s(r)`` are what the router
has learned of replica ``r``, and ``attention(r)`` with them (:mod:`prefixroute.core.speed`, from
the TTFTs and decode times of its own requests); ``prefill_tokens_per_s`` and ``decode_step_s`` in
the config are only the priors, used until a replica has enough observations. So queued work is
compared in seconds at each replica's speed: on a fleet where half the replicas prefill 4x slower,
a slow replica's queue and our recomputation on it cost 4x more, and it gets a request only when
that still beats waiting on a fast one, before its queue has had time to build. The delay a request
imposes on others (below) is counted at the replica's own rate too: recomputing a prefix on a slow
replica holds its later arrivals up 4x longer. ``learned_speeds=False`` keeps the fixed constants
for every replica. (The other policies model other routers, which count requests or tokens and know
no speeds; they stay as their sources wrote them.)

The choice minimises predicted TTFT plus the delay the request imposes on others
(:meth:`PredictedTTFT.cost_to_others`): recomputing a prefix delays requests that arrive behind it
(``miss_penalty`` per second of our own prefill), and chunked prefill shares steps with prompts
already prefilling, delaying their first tokens (``interference``). Without the first term the
policy copies long shared prefixes onto idle replicas at the first burst, and the copies cost more
prefill than the bursts they absorb (shared-prefix: 1.26x the oracle floor instead of 1.01x).

Among replicas within ``tie_tolerance_s`` of the best prediction we prefer the longest match (it
keeps the prefix in one place and leaves other caches free), then fewer in-flight requests.

Beyond ``shortlist_above`` candidates (hundreds of replicas) the policy scores a shortlist: the
replicas with the longest matches plus a random sample of the rest (power of d choices), so a
decision costs about the same at 1,000 replicas as at 100. ``benchmarks/scale_sim.py`` measures what
that costs in hit rate and TTFT against scoring everyone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from prefixroute.core.context_cost import context_work
from prefixroute.core.errors import ConfigError
from prefixroute.core.policies._base import RoutingContext
from prefixroute.core.policies._params import ranged
from prefixroute.core.replica_load import ReplicaLoad
from prefixroute.core.types import Decision, DecisionReason, ReplicaId


@dataclass(frozen=True, slots=True)
class PredictedTTFTConfig:
    prefill_tokens_per_s: float = 10_000.0  # replica prefill rate, tokens/s (the article's figure)
    step_tokens: int = 2048  # engine token budget per batch step, tokens (chunked prefill)
    decode_step_s: float = ranged(0.015, 0.0)  # added to each batch step that also decodes, seconds
    tie_tolerance_s: float = ranged(0.002, 0.0)  # predictions this close count as equal, seconds
    # weight of our uncached tokens as work later arrivals wait for
    miss_penalty: float = ranged(0.5, 0.0)
    # weight of the delay our first chunk adds to prefills under way
    interference: float = ranged(1.0, 0.0)
    # weight of the chunks that later arrivals add to our prefill steps
    arrivals: float = ranged(1.0, 0.0)
    learned_speeds: bool = True  # each replica's learned rate and step (False: the constants)
    batch_slots: bool = True  # wait for a free batch slot where the batch size is known
    # Beyond ``shortlist_above`` candidates, score only the ``shortlist_top`` longest matches and
    # ``shortlist_sample`` random others (RoutingContext.shortlist): O(1) instead of O(replicas).
    shortlist_above: int = 64  # candidates, replicas
    shortlist_top: int = 16  # replicas
    shortlist_sample: int = 16  # replicas

    def __post_init__(self) -> None:
        if self.prefill_tokens_per_s <= 0 or self.step_tokens < 1:
            raise ConfigError("prefill_tokens_per_s and step_tokens must be positive")
        if self.shortlist_above < 2 or self.shortlist_top < 0 or self.shortlist_sample < 1:
            raise ConfigError(
                "shortlist_above must be at least 2, shortlist_top at least 0 and "
                "shortlist_sample at least 1"
            )


@dataclass(slots=True)
class PredictedTTFT:
    name: ClassVar[str] = "predicted_ttft"
    config: PredictedTTFTConfig = field(default_factory=PredictedTTFTConfig)

    def predict(self, ctx: RoutingContext, replica: ReplicaId) -> float:
        """Predicted TTFT of this request on ``replica``, seconds."""
        prompt = ctx.request.prompt_tokens
        return self._terms(ctx.load(replica), prompt - ctx.cached[replica], prompt, ctx.now)[0]

    def cost_to_others(self, ctx: RoutingContext, replica: ReplicaId) -> float:
        """Delay this request's prefill imposes on other requests of ``replica``, seconds."""
        prompt = ctx.request.prompt_tokens
        return self._terms(ctx.load(replica), prompt - ctx.cached[replica], prompt, ctx.now)[1]

    def _terms(
        self, load: ReplicaLoad, uncached: int, prompt: int, now: float
    ) -> tuple[float, float]:
        """(predicted TTFT, cost to others), seconds, of a request of ``prompt`` tokens with
        ``uncached`` of them to compute joining the replica whose load it is. One function for
        both: a decision computes both for every candidate, and they share the replica's speeds
        (the hot path)."""
        cfg = self.config
        own_s = 0.0  # the attention part of our own prefill, seconds
        if cfg.learned_speeds:
            speed = load.speed
            rate, step_s = speed.prefill_tokens_per_s, speed.decode_step_s
            attention = speed.attention_s
        else:
            rate, step_s, attention = cfg.prefill_tokens_per_s, cfg.decode_step_s, 0.0
        work = load.queued_prefill_tokens + uncached
        ttft = work / rate
        if attention:
            # Each token attends to the context before it: ours to what is cached here, the
            # queue's to theirs (core/context_cost.py).
            own_s = attention * context_work(prompt - uncached, uncached)
            ttft += attention * load.queued_context + own_s
        in_flight, prefilling = load.in_flight, load.prefilling
        slots = load.slots.size
        if slots is not None and in_flight >= slots and cfg.batch_slots:
            # Every batch slot taken: our prefill starts when enough running requests have
            # finished, unless the prefill queue ahead takes longer still (core/batch_slots.py).
            ttft += max(0.0, load.slots.wait_s(in_flight, now) - load.queued_prefill_tokens / rate)
        if in_flight > prefilling:
            # Each batch step that carries our prefill also carries the decodes, and we arrive
            # on average halfway through a step already running; on an engine whose prefill
            # runs alone, only that half (core/batch_mixing.py).
            carried = not cfg.learned_speeds or load.speed.carries_decodes
            ttft += ((-(-work // cfg.step_tokens) if carried else 0) + 0.5) * step_s
        if cfg.arrivals and uncached > cfg.step_tokens:
            # A prompt longer than one step shares its later steps with requests that arrive
            # meanwhile (they are admitted into the leftover budget): at this replica's recent
            # arrival rate, that many more chunks will ride along before our first token.
            more = load.arrival_rate(now) * ttft * load.mean_uncached()
            ttft += cfg.arrivals * more / rate
        if cfg.learned_speeds:
            # What every first token costs on this replica besides prefill and steps (HTTP,
            # templating, scheduling), where the speed model learns it (0.0 where it does not).
            ttft += load.speed.first_token_overhead_s
        if not in_flight:
            # Nobody there to delay: an idle replica must not look worse than it is, or a
            # replica that never received a shared prefix would never receive anything.
            return ttft, 0.0
        # Chunked prefill puts our first chunk in the same steps as the last chunks of prompts
        # already prefilling there: each of them gets its first token that much later.
        under_way = prefilling * min(uncached, cfg.step_tokens)
        cost = (cfg.miss_penalty * uncached + cfg.interference * under_way) / rate
        return ttft, cost + cfg.miss_penalty * own_s

    def decide(self, ctx: RoutingContext) -> Decision:
        cfg = self.config
        ctx = ctx.shortlist(cfg.shortlist_above, cfg.shortlist_top, cfg.shortlist_sample)
        matches = ctx.matches
        prompt = ctx.request.prompt_tokens
        cached = ctx.cached
        now, load_of, terms = ctx.now, ctx.loads.get, self._terms
        scored: list[tuple[float, ReplicaId]] = []
        ttfts: list[float] = []  # beside scored, for an explanation only
        for r in ctx.candidates:
            ttft, cost = terms(load_of(r), prompt - cached[r], prompt, now)
            scored.append((ttft + cost, r))
            ttfts.append(ttft)
        best_ttft = min(scored)[0]
        near = [r for t, r in scored if t <= best_ttft + cfg.tie_tolerance_s]
        if len(near) > 1:
            top = max(matches[r] for r in near)
            near = [r for r in near if matches[r] == top]
        if len(near) > 1:
            fewest = min(ctx.load(r).in_flight for r in near)
            near = [r for r in near if ctx.load(r).in_flight == fewest]
        chosen = near[0] if len(near) == 1 else ctx.rng.choice(near)
        longest = max(matches.values())
        if longest == 0:
            reason = DecisionReason.LEAST_LOADED
        elif matches[chosen] < longest:
            reason = DecisionReason.HOT_SPOT_YIELD
        else:
            reason = DecisionReason.PREFIX_MATCH
        if not ctx.explain:
            return ctx.decide(chosen, reason)
        # Explaining: each candidate's predicted TTFT beside the score that was minimised.
        explained = {r: (t, s) for (s, r), t in zip(scored, ttfts, strict=True)}
        return ctx.decide(chosen, reason, explained)
