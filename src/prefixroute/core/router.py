"""The router: one policy, one prefix index, one load view, and the bookkeeping between them.

Both the simulator and the gateway drive a :class:`Router` the same way::

    view = router.view("req-1", tokens=ids, output_tokens=128)
    decision = router.route(view, now)          # policy decides; index and load are updated
    ...                                         # send it to decision.replica
    router.first_token("req-1", now)            # prefill done
    router.observe_usage("req-1", prompt_tokens=p, cached_tokens=c)  # the replica's usage, if any
    router.complete("req-1", now, output_tokens=n)  # finished, failed or cancelled

A caller that never sees the first token (a plain answer arrives whole) asks
:meth:`~PlainAnswerCalls.first_token_due` when it is predicted, calls
``guess_first_token(rid, now)`` then (and again after the seconds it answers, if any), and ends
with ``complete(..., whole=True)``.

The same calls teach the router what it cannot be told: each replica's speed
(:mod:`prefixroute.core.speed`: a first token's time against the work queued ahead, a
completion's decode time against its output tokens; the priors are the policy's own constants),
each model's characters per token (:mod:`prefixroute.core.token_count`: a text key's tokens and
cached tokens are counted at that ratio) and, with ``capacity=IndexCapacityConfig(learn=True)``,
how much each replica really keeps (:mod:`prefixroute.core.index_capacity`, off by default for
the reason given there).

A LoRA adapter's request (``view(..., adapter=name)``) is hashed in the adapter's own key space
(:meth:`BlockHasher.for_adapter`, within a tenant's seed): vLLM hashes ``lora_name`` into its
blocks, so a prefix cached under one adapter or the base model (not keyed) counts for no other.

Approximate mode (the default) records every decision in the index: the index is the router's
own picture of the caches. Precise mode (``insert_on_route=False``) leaves the index to the
engines' KV events, which an adapter (``prefixroute.events``) passes to the ``engine_*``
methods, and with ``speculative_ttl_s`` records each decision as a short-lived speculative
entry instead, which covers the requests routed before their events arrive (see
:mod:`prefixroute.core.speculative`).

Every change to what the router believes goes through a method here, whoever hears of it: its
own decisions (:meth:`route` and the calls after it), other instances' (:meth:`remote_routed`,
:meth:`remote_dispatch`), an engine's KV events (:meth:`engine_stored`, :meth:`engine_removed`,
:meth:`engine_cleared`), a replica's own numbers (:meth:`observe_replica`, :meth:`size_index`,
:meth:`observe_engine_prefill`, :meth:`observe_token_count`, ``observe_preemptions``:
core/preemptions.py). The index, the load view and the speculative entries are the router's
own: code outside ``core`` reads them through :class:`~prefixroute.core.router_reads.RouterReads`
(``tests/test_router_ownership.py`` holds it to that): every change is in these files.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from collections.abc import Iterable, Sequence

from prefixroute.core.errors import ConfigError, NoReplicaAvailable
from prefixroute.core.hashing import BlockHash, BlockHasher, TokenIds
from prefixroute.core.index import PrefixIndex
from prefixroute.core.index_capacity import IndexCapacity, IndexCapacityConfig
from prefixroute.core.load import LoadTracker
from prefixroute.core.plain_answers import PlainAnswerCalls
from prefixroute.core.policies import Policy, RoutingContext
from prefixroute.core.preemptions import PreemptionCalls
from prefixroute.core.routed_blocks import RoutedBlocks
from prefixroute.core.router_reads import RouterReads
from prefixroute.core.speculative import SpeculativeEntries
from prefixroute.core.speed_config import SpeedConfig, SpeedPrior, speed_priors_of
from prefixroute.core.token_count import TokenCountConfig, TokenCounts
from prefixroute.core.types import Decision, DecisionReason, ReplicaId, RequestView


class Router(RouterReads, PlainAnswerCalls, PreemptionCalls):
    """Routes request views among registered replicas with one policy."""

    def __init__(
        self,
        policy: Policy,
        hasher: BlockHasher | None = None,
        *,
        index_capacity_blocks: int | None = None,
        kv_block_size: int = 16,
        seed: int = 0,
        insert_on_route: bool = True,
        speculative_ttl_s: float | None = None,
        speed: SpeedConfig | None = None,
        tokens: TokenCountConfig | None = None,
        capacity: IndexCapacityConfig | None = None,
    ) -> None:
        self.policy = policy
        self.hasher = hasher or BlockHasher()
        self.index = PrefixIndex(index_capacity_blocks)
        self.loads = LoadTracker(block_size=kv_block_size, speed=speed or speed_priors_of(policy))
        self.usage_reports = 0  # requests whose replica reported its cached tokens
        self.overpredicted = 0  # of those, requests that found fewer cached tokens than predicted
        self.overpredicted_tokens = 0  # tokens predicted cached that were not, tokens
        self.tokens = TokenCounts(tokens)  # characters per token, learned per model
        # what each replica really keeps, learned per replica (approximate mode only)
        self.capacity = IndexCapacity(capacity if capacity is not None else IndexCapacityConfig())
        self.rng = random.Random(seed)
        self.insert_on_route = insert_on_route  # False: the index is fed by engine events
        self.routed = RoutedBlocks()  # what each decision added to the index, while in flight
        ttl = speculative_ttl_s
        self.speculative = SpeculativeEntries(ttl) if ttl is not None else None
        self._replicas: list[ReplicaId] = []  # in order of addition: the default candidates
        self._registered: set[ReplicaId] = set()  # the same, for O(1) membership

    # --- replicas -------------------------------------------------------------------------
    def add_replica(
        self, replica: ReplicaId, capacity_blocks: int | None = None,
        speed: SpeedPrior | None = None,
    ) -> None:  # fmt: skip
        """Register a replica, a new one cold (an empty index entry); ``speed``: its own priors."""
        self.index.add_replica(replica, capacity_blocks)
        if replica not in self._registered:
            self._registered.add(replica)
            self._replicas.append(replica)
            # Precise mode's index follows the engines' own evictions: nothing to learn.
            held = self.index.capacity_of(replica) if self.insert_on_route else None
            self.capacity.track(replica, held)
        self.loads.add_replica(replica, speed)

    def remove_replica(self, replica: ReplicaId) -> None:
        """Stop routing to ``replica`` and forget what it cached."""
        if replica in self._registered:
            self._registered.discard(replica)
            self._replicas.remove(replica)
        self.index.remove_replica(replica)
        self.capacity.forget(replica)
        self.loads.remove_replica(replica)
        if self.speculative is not None:
            self.speculative.remove_replica(replica)

    @property
    def replicas(self) -> list[ReplicaId]:
        return list(self._replicas)

    def has_replica(self, replica: ReplicaId) -> bool:
        """Registered (O(1), unlike ``replica in router.replicas``, which copies the list)."""
        return replica in self._registered

    # --- requests -------------------------------------------------------------------------
    def view(
        self,
        request_id: str,
        *,
        tokens: TokenIds | None = None,
        text: str | None = None,
        prompt_tokens: int | None = None,
        output_tokens: int = 0,
        session_id: str | None = None,
        tenant: str | None = None,
        model: str | None = None,
        known: Sequence[BlockHash] = (),
        seed: int | None = None,
        adapter: str | None = None,
        sequences: int = 1,
        batch: bool = False,
    ) -> RequestView:
        """Build the request view: hash the prompt once (only blocks not in ``known``).

        ``seed`` replaces the hasher's seed for this request: a tenant's own key space, whose
        hashes never equal those made with another seed, so its requests match only its own
        index entries (``known`` must come from the same seed). ``adapter``: the LoRA adapter
        the request runs under, whose key space is nested in the seed's (module docstring).
        A text prompt's tokens are estimated at ``model``'s learned characters per token.
        ``sequences`` and ``batch``: what the replica's usage will count besides the prompt
        and one sequence (``RequestView``; a batch's usage teaches nothing, and several
        sequences' no decode step).
        """
        if (tokens is None) == (text is None):
            raise ConfigError("a request view needs exactly one of tokens or text")
        hasher = self.hasher if seed is None else dataclasses.replace(self.hasher, seed=seed)
        if adapter is not None:
            hasher = hasher.for_adapter(adapter)
        if tokens is not None:
            hashes = hasher.hash_tokens(tokens, known)
            units = len(tokens)
            estimate = units
        else:
            assert text is not None
            hashes = hasher.hash_text(text, known)
            units = len(text)
            estimate = self.tokens.estimate(model, units)
        return RequestView(
            request_id=request_id,
            block_hashes=hashes,
            block_size=self.hasher.block_size,
            prompt_tokens=prompt_tokens if prompt_tokens is not None else estimate,
            prompt_units=units,
            output_tokens=output_tokens,
            session_id=session_id,
            tenant=tenant,
            model=model,
            char_units=text is not None,
            sequences=max(1, sequences),
            batch=batch,
        )

    def route(
        self, request: RequestView, now: float, candidates: Sequence[ReplicaId] | None = None,
        *, explain: bool = False,
    ) -> Decision:  # fmt: skip
        """Choose a replica for ``request`` among ``candidates`` (default: all registered).

        The decision is recorded: the index learns that the replica now holds the prompt (until
        :meth:`withdraw`, if the replica turns the request away), or in precise mode a
        speculative entry says so for a while, and the load view counts the request as in flight
        until :meth:`complete`. With ``explain`` the decision also carries
        what the policy saw of every candidate (``Decision.candidates``: tracing).
        """
        decision = self._decide(request, now, candidates, self.policy, self.rng, explain)
        if self.insert_on_route:
            chain = request.block_hashes
            self.routed.insert(self.index, request.request_id, decision.replica, chain)
        if self.speculative is not None:
            self.speculative.add(decision.replica, request.block_hashes, now, request.request_id)
        self.loads.dispatch(request, decision, now)
        if request.char_units and not (request.batch or request.extended):  # usage: one prompt
            self.tokens.routed(request.request_id, request.model, request.prompt_units)
        return decision

    def explain(
        self, request: RequestView, now: float, candidates: Sequence[ReplicaId] | None = None
    ) -> Decision:
        """Where :meth:`route` would send ``request`` now, with what the policy saw of every
        candidate, recording nothing: the policy decides on copies of its state and of the
        random generator, so the next real decision is the one it would have been anyway."""
        policy, rng = copy.deepcopy(self.policy), copy.deepcopy(self.rng)
        return self._decide(request, now, candidates, policy, rng, explain=True)

    def _decide(
        self, request: RequestView, now: float, candidates: Sequence[ReplicaId] | None,
        policy: Policy, rng: random.Random, explain: bool,
    ) -> Decision:  # fmt: skip
        pool = self._replicas if candidates is None else candidates
        if not pool:
            raise NoReplicaAvailable("no replica available to route to")
        ctx = RoutingContext(
            request, pool, self.index, self.loads, rng, now, self.speculative, explain=explain,
            candidate_set=self._registered if candidates is None else None,
        )  # fmt: skip
        if len(pool) == 1:
            return ctx.decide(pool[0], DecisionReason.ONLY_CANDIDATE)
        return policy.decide(ctx)

    def first_token(self, request_id: str, now: float, measured: bool = True) -> None:
        """The request's first token arrived at ``now`` (its prefill is over).

        ``measured=False`` when ``now`` is an estimate (a timer standing in for a token nobody
        saw): the load view moves on, the speed model does not learn from it.
        """
        self.loads.first_token(request_id, now, measured)

    def observe_usage(self, request_id: str, prompt_tokens: int, cached_tokens: int | None) -> None:
        """The replica reported the request's ``usage``: ``prompt_tokens`` and
        ``prompt_tokens_details.cached_tokens`` (None when it reports no cached tokens). Call
        it before :meth:`complete`.

        A request keyed on text teaches its model's characters per token. With the cached
        tokens, the speed model also learns from the uncached tokens the replica really
        computed, not the prediction, and the router counts predictions that were too high.
        """
        self.tokens.observe(request_id, prompt_tokens)
        if cached_tokens is None:
            return
        if (req := self.loads.observe_usage(request_id, prompt_tokens, cached_tokens)) is None:
            return
        self.usage_reports += 1
        actual = max(0, prompt_tokens - cached_tokens)
        if actual > req.uncached_tokens:
            self.overpredicted += 1
            self.overpredicted_tokens += actual - req.uncached_tokens
        # Predictions are in key blocks, reports in KV blocks: closer than both is agreement.
        tol = int(req.key_block_tokens) + self.loads.block_size
        self.capacity.observe(self.index, req.replica, req.predicted_cached, cached_tokens, tol)

    def observe_token_count(self, model: str | None, chars: int, tokens: int, weight: int) -> None:
        """A replica counted ``tokens`` in ``chars`` characters (its ``/tokenize``, apart from
        any request) of ``model``'s text: weighed as a prompt of ``weight`` tokens."""
        self.tokens.learn(model, chars, tokens, weight)

    def complete(
        self, request_id: str, now: float, output_tokens: int | None = None, *, whole: bool = False
    ) -> None:
        """The request ended at ``now``, however it ended. Pass ``output_tokens`` (the tokens
        really generated, e.g. ``usage.completion_tokens``) when known: the speed model learns
        the decode step from it; without it only the prefill rate is learned. ``whole``: a plain
        answer, read whole at ``now``: with no first token seen, it teaches both at once."""
        self.loads.complete(request_id, now, output_tokens, whole)
        self.tokens.forget(request_id)
        self.routed.forget(request_id)
        if self.speculative is not None:
            self.speculative.forget(request_id)

    def withdraw(self, request_id: str) -> None:
        """The replica did not take the request (full, refused it, unreachable): the blocks
        its decision added to the index are taken out again, unless the index changed there
        since (``core/routed_blocks``); in precise mode, its speculative entries. Call it before
        :meth:`complete`, which every request still gets."""
        self.routed.withdraw(self.index, request_id)
        if self.speculative is not None:
            self.speculative.withdraw(request_id)

    # --- what other router instances decided (prefixroute.sync) ----------------------------
    def remote_routed(
        self, replica: ReplicaId, block_hashes: Sequence[BlockHash], now: float,
        *, live: bool = True, request_id: str | None = None,
    ) -> None:  # fmt: skip
        """Another router instance sent a prompt with these blocks to ``replica``.

        Approximate mode records it in the index, as :meth:`route` records a decision of its
        own; with ``request_id`` (a request :meth:`remote_dispatch` counts, so that
        :meth:`complete` ends it) also what it added, for :meth:`withdraw`. Precise mode, whose
        index only the engines' events write, records a speculative entry instead, and only for
        a ``live`` decision: one replayed from the past (``live=False``) has long been reported
        by the engine, or evicted.
        """
        if not block_hashes or replica not in self._registered:
            return  # one we do not route to: an insert would register it in the index
        if self.insert_on_route and request_id is not None:
            self.routed.insert(self.index, request_id, replica, block_hashes)
        elif self.insert_on_route:
            self.index.insert(replica, block_hashes)
        elif live and self.speculative is not None:
            self.speculative.add(replica, block_hashes, now, request_id)

    def remote_dispatch(
        self,
        request_id: str,
        replica: ReplicaId,
        *,
        prompt_tokens: int,
        output_tokens: int,
        predicted_cached_tokens: int,
        now: float,
    ) -> None:
        """Another router instance sent request ``request_id`` to ``replica``: count it in the
        load view, known by its numbers only (tokens), until :meth:`first_token` (never
        measured: it is heard late) and :meth:`complete`. A reused id ends the earlier one."""
        self.loads.count_dispatch(
            request_id, replica, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
            predicted_cached_tokens=predicted_cached_tokens, now=now,
        )  # fmt: skip

    # --- what the engines report (precise mode's KV events) -------------------------------
    def engine_stored(
        self, replica: ReplicaId, block_hashes: Sequence[BlockHash], *, from_root: bool = True
    ) -> None:
        """``replica``'s engine cached these blocks (our hashes of them). ``from_root=False``
        when they continue a chain reported earlier (see :meth:`PrefixIndex.insert`). A replica
        removed meanwhile stays removed: its late events are dropped."""
        if replica in self._registered:
            self.index.insert(replica, block_hashes, from_root=from_root)

    def engine_removed(self, replica: ReplicaId, block_hashes: Iterable[BlockHash]) -> None:
        """``replica``'s engine evicted these blocks."""
        self.index.remove_blocks(replica, block_hashes)

    def engine_cleared(self, replica: ReplicaId, emptied: bool = False) -> None:
        """``replica``'s engine dropped its whole cache (or its events can no longer be
        trusted: a gap, a restart); it stays registered. ``emptied``: the engine said so
        (``AllBlocksCleared``, sent only with no request running), so its speculative entries
        go too: their requests are over and reported, and their blocks gone."""
        self.index.clear_replica(replica)
        if emptied and self.speculative is not None:
            self.speculative.remove_replica(replica)

    def size_index(self, replica: ReplicaId, blocks: int) -> int | None:
        """``replica``'s index keeps ``blocks`` blocks from now on: its engine's KV cache
        (:mod:`prefixroute.core.engine_kv`). The entries dropped to fit; None when its index is
        unbounded (precise mode, or no bound configured) or it is not registered."""
        if blocks < 1:
            raise ConfigError(f"an index keeps at least one block, got {blocks}")
        if self.index.capacity_of(replica) is None:
            return None
        if self.capacity.get(replica) is not None:  # learning: from the engine's size down
            self.capacity.track(replica, blocks)
        return self.index.resize_replica(replica, blocks)

    # --- what a replica reports about itself ----------------------------------------------
    def observe_replica(
        self, replica: ReplicaId, *, kv_usage: float | None = None,
        num_waiting: int | None = None, num_running: int | None = None,
        max_running: int | None = None,
    ) -> None:  # fmt: skip
        """Numbers ``replica`` reported (a metrics scrape, a simulator step, Ray's stats): KV
        usage (0..1), requests waiting and running, the most it runs at once (batch_slots.py).
        Kept beside the router's own accounting, never mixed in; None leaves the last as is."""
        self.loads.observe(replica, kv_usage=kv_usage, num_waiting=num_waiting,
                           num_running=num_running, max_running=max_running)  # fmt: skip

    def tell_speed(self, replica: ReplicaId, prior: SpeedPrior) -> bool:
        """Own priors reported after it registered (Ray's stats): :meth:`LoadTracker.tell`."""
        return self.loads.tell(replica, prior)

    def observe_engine_prefill(
        self, replica: ReplicaId, *, tokens: float, requests: int, seconds: float
    ) -> None:
        """``replica``'s engine reported (its metrics, between two scrapes) that ``requests``
        requests spent ``seconds`` from being scheduled to their first token, computing
        ``tokens`` uncached tokens: its speed model learns from it (ignored if not registered)."""
        if replica in self._registered:
            self.loads.observe_engine_prefill(replica, tokens, requests, seconds)
