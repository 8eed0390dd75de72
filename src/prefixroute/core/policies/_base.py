"""What every policy sees and returns: the routing context and the policy protocol; and what
several policies share: the base of the parameter-less ones (:class:`PickPolicy`) and the
readings of a context that more than one rule is written in (load spread, match rate, ...)."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from prefixroute.core.index import PrefixIndex
from prefixroute.core.load import LoadTracker
from prefixroute.core.replica_load import ReplicaLoad
from prefixroute.core.speculative import SpeculativeEntries
from prefixroute.core.types import (
    CandidateScore,
    Decision,
    DecisionReason,
    ReplicaId,
    RequestView,
)


@dataclass(slots=True)
class RoutingContext:
    """Everything a policy may consult for one decision. Built by the router per request."""

    request: RequestView
    candidates: Sequence[ReplicaId]  # replicas that may take it (healthy, serving the model)
    index: PrefixIndex
    loads: LoadTracker
    rng: random.Random
    now: float  # seconds, the caller's clock
    speculative: SpeculativeEntries | None = None  # recent decisions not yet in the index
    _matches: dict[ReplicaId, int] | None = field(default=None)
    _cached: dict[ReplicaId, int] | None = field(default=None)
    explain: bool = False  # fill Decision.candidates (tracing, /admin/explain)
    # The candidates as a set, where the caller keeps one (the router's registered replicas,
    # when every one is a candidate): a shortlist then builds none per decision.
    candidate_set: AbstractSet[ReplicaId] | None = None

    @property
    def matches(self) -> dict[ReplicaId, int]:
        """Matched blocks per candidate (0 when none); computed once, on first use.

        With speculative entries, a replica's match is the longer of what the index knows and
        what recent decisions sent it (precise mode: events not arrived yet).
        """
        if self._matches is None:
            self._matches = self._match_each(self.candidates)
        return self._matches

    def _match_each(self, replicas: Sequence[ReplicaId]) -> dict[ReplicaId, int]:
        """Matched blocks of each of ``replicas``, 0 included: the index's, or the recent
        decisions' where those are longer."""
        hashes = self.request.block_hashes
        found = self.index.match_each(hashes, replicas)
        if self.speculative is not None:
            for r, m in self.speculative.match(hashes, replicas, self.now).items():
                if m > found[r]:
                    found[r] = m
        return found

    @property
    def cached(self) -> dict[ReplicaId, int]:
        """Prompt tokens each candidate should find cached, as an engine counts them.

        Engines never report the whole prompt cached: the last token is always recomputed to
        produce logits, so the hit is capped at the full blocks inside ``prompt - 1`` units,
        and, counted in tokens (characters converted at the model's learned ratio, rounded),
        at ``prompt_tokens - 1``: a prediction never exceeds the prompt.
        """
        if self._cached is None:
            matches = self.matches
            # Once per distinct match length, not per candidate: most candidates share a few
            # lengths (0, a common system prompt), and the conversion is the costly part.
            tokens = {m: self._tokens(m) for m in set(matches.values())}
            self._cached = {r: tokens[m] for r, m in matches.items()}
        return self._cached

    def _tokens(self, blocks: int) -> int:
        """A match of ``blocks`` blocks in prompt tokens, as :attr:`cached` counts them."""
        req = self.request
        cap = max(0, req.prompt_units - 1) // req.block_size
        most = max(0, req.prompt_tokens - 1)
        return min(round(min(blocks, cap) * (req.block_size * req.tokens_per_unit)), most)

    def cached_tokens(self, replica: ReplicaId) -> int:
        """Prompt tokens ``replica`` should find cached (see :attr:`cached`).

        A policy that never read the matches (round robin, least loaded, ...) gets the chosen
        replica's alone: one index lookup instead of one per candidate."""
        if self._cached is not None:
            return self._cached[replica]
        if self._matches is not None:
            return self._tokens(self._matches[replica])
        return self._tokens(self._match_each((replica,))[replica])

    def load(self, replica: ReplicaId) -> ReplicaLoad:
        return self.loads.get(replica)

    def shortlist(self, above: int, top: int, sample: int) -> RoutingContext:
        """This context narrowed to the candidates worth scoring, when there are many.

        With more than ``above`` candidates and an index that keeps its holder map, scoring
        every replica costs milliseconds per decision at a thousand replicas. The shortlist is
        the ``top`` replicas with the longest matches (whole match levels, from
        :meth:`PrefixIndex.deepest_holders`), every replica the holder map cannot see, and
        ``sample`` replicas drawn at random: the best of a random sample balances load nearly as
        well as the best of all (power of d choices). Matches are exact for all of them. Returns
        ``self`` unchanged below the threshold, without the holder map, or with speculative
        entries (precise mode), so small clusters are scored exactly as before.
        """
        cands = self.candidates
        if len(cands) <= above or not self.index.has_holder_map or self.speculative is not None:
            return self
        hashes = self.request.block_hashes
        pool = self.candidate_set if self.candidate_set is not None else set(cands)
        matches = {
            r: m for r, m in self.index.deepest_holders(hashes, top).items() if r in pool
        }
        others = [r for r in self.index.gapped_replicas if r in pool and r not in matches]
        others += (r for r in self.rng.sample(cands, min(sample, len(cands))) if r not in matches)
        found = self.index.match(hashes, others)
        for r in others:
            matches[r] = found.get(r, 0)
        # Sorted: the holder map's sets iterate in hash order, which differs between processes,
        # and candidate order decides ties; sorting keeps a seeded simulation reproducible.
        return RoutingContext(
            self.request,
            sorted(matches),
            self.index,
            self.loads,
            self.rng,
            self.now,
            None,
            matches,
            explain=self.explain,
        )

    def decide(
        self,
        replica: ReplicaId,
        reason: DecisionReason,
        predicted: Mapping[ReplicaId, tuple[float, float]] | None = None,
    ) -> Decision:
        """A decision for ``replica`` with its predicted cached tokens filled in.

        ``predicted`` (candidate -> (predicted TTFT, score), from policies that compute them)
        goes into the explanation; it is read only when the context was asked to explain.
        """
        if not self.explain:
            return Decision(replica, reason, self.cached_tokens(replica))
        return Decision(replica, reason, self.cached_tokens(replica), self._explained(predicted))

    def _explained(
        self, predicted: Mapping[ReplicaId, tuple[float, float]] | None
    ) -> tuple[CandidateScore, ...]:
        out: list[CandidateScore] = []
        for r in self.candidates:
            load = self.load(r)
            ttft, score = predicted[r] if predicted is not None else (None, None)
            out.append(
                CandidateScore(
                    r,
                    self.matches[r],
                    self.cached[r],
                    load.in_flight,
                    load.queued_prefill_tokens,
                    ttft,
                    score,
                )
            )
        return tuple(out)


class Policy(Protocol):
    """A routing policy: one deciding method, parameters in a frozen config."""

    name: ClassVar[str]

    def decide(self, ctx: RoutingContext) -> Decision:
        """Choose one of ``ctx.candidates`` (never empty) and say why."""
        ...


@dataclass(frozen=True, slots=True)
class NoParams:
    """The config of a policy without parameters: ``make_policy`` accepts none for it."""


@dataclass(slots=True)
class PickPolicy(ABC):
    """A policy without parameters: one rule picks the replica, always for the same reason.

    A subclass sets ``name`` and ``reason`` and writes :meth:`pick`; the config, the registry's
    constructor call and the decision around the pick are this class's.
    """

    name: ClassVar[str]
    reason: ClassVar[DecisionReason]
    config: NoParams = field(default_factory=NoParams)

    def decide(self, ctx: RoutingContext) -> Decision:
        return ctx.decide(self.pick(ctx), self.reason)

    @abstractmethod
    def pick(self, ctx: RoutingContext) -> ReplicaId:
        """One of ``ctx.candidates`` (never empty)."""


def in_flight_range(ctx: RoutingContext) -> tuple[int, int]:
    """The fewest and the most requests in flight on any candidate (the load imbalance)."""
    counts = [ctx.load(r).in_flight for r in ctx.candidates]
    return min(counts), max(counts)


def match_rate(ctx: RoutingContext) -> tuple[int, float]:
    """The longest prefix match among the candidates, in blocks, and the fraction of the prompt
    it covers (matched units / prompt units; 0.0 for an empty prompt)."""
    longest = max(ctx.matches.values())
    units = ctx.request.prompt_units
    return longest, longest * ctx.request.block_size / units if units else 0.0


def matching(ctx: RoutingContext, blocks: int) -> list[ReplicaId]:
    """The candidates that match exactly ``blocks`` blocks, in candidate order."""
    return [r for r in ctx.candidates if ctx.matches[r] == blocks]


def smallest_trees(ctx: RoutingContext) -> list[ReplicaId]:
    """The candidates whose index holds the fewest blocks (the most free cache), in order."""
    sizes = {r: ctx.index.blocks_of(r) for r in ctx.candidates}
    smallest = min(sizes.values())
    return [r for r in ctx.candidates if sizes[r] == smallest]


def least_loaded_of(ctx: RoutingContext, replicas: Sequence[ReplicaId]) -> ReplicaId:
    """The replica with fewest in-flight requests, then least queued prefill, ties at random."""
    best_key: tuple[int, int] | None = None
    best: list[ReplicaId] = []
    for r in replicas:
        load = ctx.load(r)
        key = (load.in_flight, load.queued_prefill_tokens)
        if best_key is None or key < best_key:
            best_key, best = key, [r]
        elif key == best_key:
            best.append(r)
    return best[0] if len(best) == 1 else ctx.rng.choice(best)
