"""The router's view of each replica's load, kept by one bookkeeping path.

The simulator and the gateway both call :meth:`LoadTracker.dispatch` when a request is sent,
:meth:`first_token` when its first output token comes back (prefill is over), and :meth:`complete`
when it ends (success, failure or cancellation alike). Numbers a replica reports (its metrics)
arrive through :meth:`observe`, kept beside, never mixed in.

The same three calls teach each replica's :class:`~prefixroute.core.speed.ReplicaSpeed` its
prefill rate and decode step: a request's time to first token against the work queued ahead of
it plus its own uncached tokens, and its decode phase against the steps it took. Only a first
token the caller measured counts (``first_token(..., measured=True)``, the default); the one
:meth:`complete` implies for a request that never reported one (a failure, a plain answer
read whole) is bookkeeping only. So the load view says how long each replica's queue takes at
its own speed (:meth:`ReplicaLoad.queued_prefill_s`).

A replica that has not warmed up yet (a fresh one, or one the others outpaced) predicts with the
fleet's learned speed, not the configured constants (:meth:`ReplicaSpeed.start_from`): the
estimates of the fleet's median warmed-up replica. The constants are a guess about hardware
nobody measured. In the simulator, with every replica 3x faster than them, the replicas that
warmed up first looked 3x faster than the rest, which stayed at the constants and were sent
nothing for the whole run (two of four, and a fifth that joined later); started from the
fleet, all five served. The median is taken again every ``max(REFIT_EVERY, replicas)`` learned
requests while any replica is cold (a fleet of a thousand: a sort of a thousand per thousand).

While a replica warms up, a measured first token more than ``MISJUDGED`` (2x) sooner or later
than predicted teaches its speed model at once, with the predicted uncached tokens, rather than
at the request's end: a cold replica misjudged (a slow one started from the constants or from a
fast fleet) is sent more than it can do until its estimates are its own, and a decode lasts
seconds. The replica's own count, when it reports one at the end, then corrects that
observation (a wrong cached-token prediction is not a wrong speed). A first token near its
prediction still waits for the end: learning every one early made the fit see first tokens
before any decode phase, and the article's shared-prompt example no longer spread its 50 users
10 per replica. Half the replicas 4x slower than the other half, this took the default policy's
p99 TTFT on the hot-prefix workload from 479 and 324 ms (seeds 0, 1) to 285 and 264.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prefixroute.core.context_cost import context_work
from prefixroute.core.fleet_speed import fleet_median_speed
from prefixroute.core.inflight import InFlight
from prefixroute.core.plain_answers import in_order, passed_unseen, recheck_s
from prefixroute.core.preemptions import clean
from prefixroute.core.preemptions import observe as preemptions_seen
from prefixroute.core.replica_load import ReplicaLoad
from prefixroute.core.speed import REFIT_EVERY, Estimates, ReplicaSpeed, SpeedConfig
from prefixroute.core.speed_config import SpeedPrior
from prefixroute.core.types import Decision, ReplicaId, RequestView


@dataclass(slots=True)
class LoadTracker:
    """Per-replica load, updated by dispatch / first token / completion."""

    block_size: int = 16  # tokens per KV block, for ``active_blocks``
    speed: SpeedConfig = field(default_factory=SpeedConfig)  # priors of every replica's speed
    _loads: dict[ReplicaId, ReplicaLoad] = field(default_factory=dict)
    _requests: dict[str, InFlight] = field(default_factory=dict)
    _cold: dict[ReplicaId, ReplicaLoad] = field(default_factory=dict)  # not warmed up yet
    _fleet: Estimates | None = None  # the fleet's median estimates
    _fleet_kind: bool = True  # its median replica's prefill steps carry decodes (batch_mixing)
    _learned: int = 0  # requests learned from since the fleet's estimates were last taken

    def add_replica(self, replica: ReplicaId, prior: SpeedPrior | None = None) -> None:
        self.get(replica, prior)  # a no-op if known; ``prior``: its own speed priors

    def remove_replica(self, replica: ReplicaId) -> None:  # in-flight requests stay tracked
        self._loads.pop(replica, None)
        self._cold.pop(replica, None)

    def __getitem__(self, replica: ReplicaId) -> ReplicaLoad:
        return self._loads[replica]

    def tell(self, replica: ReplicaId, prior: SpeedPrior) -> bool:
        """``replica``'s own speed priors, given after it registered (a Ray replica's routing
        stats): as if given then, while its speed is not its own yet; else False, no change."""
        load = self._loads.get(replica)
        if load is None:
            return False
        # Its batch size is a fact whenever told, not a prior its estimates replace.
        if prior.max_running is not None:
            load.slots.tell(prior.max_running)
        if load.speed_known or not prior.has_speeds:
            return prior.max_running is not None
        load.speed, load.told = ReplicaSpeed(prior.applied_to(self.speed)), True
        self._cold.pop(replica, None)
        return True

    def get(self, replica: ReplicaId, prior: SpeedPrior | None = None) -> ReplicaLoad:
        """The load of ``replica``, registering it on first sight (``prior``: its own speed
        priors then, which it predicts with until warmed up instead of its fleet's)."""
        load = self._loads.get(replica)
        if load is None:
            speeds = prior if prior is not None and prior.has_speeds else None
            config = self.speed if speeds is None else speeds.applied_to(self.speed)
            load = self._loads[replica] = ReplicaLoad(speed=ReplicaSpeed(config))
            load.told = speeds is not None
            if prior is not None and prior.max_running is not None:
                load.slots.tell(prior.max_running)
            if self.speed.learn and self.speed.fleet_prior and speeds is None:
                self._cold[replica] = load
                if self._fleet is not None:
                    load.speed.start_from(self._fleet, self._fleet_kind)
        return load

    def fleet_estimates(self) -> Estimates | None:
        """What a cold replica starts from (:meth:`ReplicaSpeed.estimates`' order): the median
        replica's estimates as last taken (None before one warmed up while another was cold)."""
        return self._fleet

    def _share_fleet_speed(self) -> None:
        """Every so many learned requests while a replica is cold (module docstring), take the
        fleet's median replica again and start each cold replica from its estimates."""
        self._learned += 1
        if self._learned < max(REFIT_EVERY, len(self._loads)):
            return
        self._learned = 0
        for replica, load in list(self._cold.items()):
            if load.speed.warmed_up:
                del self._cold[replica]
        warm = [load.speed for load in self._loads.values() if load.speed.warmed_up]
        if not warm or not self._cold:
            return
        median = fleet_median_speed(warm)
        self._fleet, self._fleet_kind = median.estimates(), median.carries_decodes
        for load in self._cold.values():
            load.speed.start_from(self._fleet, self._fleet_kind)

    @property
    def replicas(self) -> list[ReplicaId]:
        return list(self._loads)

    def dispatch(self, request: RequestView, decision: Decision, now: float) -> None:
        """A request was sent to ``decision.replica``."""
        self.count_dispatch(
            request.request_id,
            decision.replica,
            prompt_tokens=request.prompt_tokens,
            output_tokens=request.output_tokens,
            predicted_cached_tokens=decision.predicted_cached_tokens,
            now=now,
            # A text key's blocks are characters: in tokens, a block is what the prompt's
            # estimate makes of it.
            key_block_tokens=request.block_size * request.prompt_tokens
            / max(1, request.prompt_units),
            sequences=request.sequences,
            batch=request.batch,
        )

    def count_dispatch(
        self,
        request_id: str,
        replica: ReplicaId,
        *,
        prompt_tokens: int,
        output_tokens: int,
        predicted_cached_tokens: int,
        now: float,
        key_block_tokens: float | None = None,
        sequences: int = 1,
        batch: bool = False,
    ) -> None:
        """A request was sent to ``replica``, known by its numbers only: :meth:`dispatch`'s
        bookkeeping, for a request another router instance routed (it shares them).
        ``key_block_tokens``: one block of its key in tokens (None: one KV block);
        ``sequences``, ``batch``: as ``RequestView``'s."""
        if request_id in self._requests:
            # A reused id: the earlier request is over as far as the load view can tell.
            self.complete(request_id, now)
        uncached = max(0, prompt_tokens - predicted_cached_tokens)
        context = context_work(prompt_tokens - uncached, uncached)
        blocks = -(-(prompt_tokens + output_tokens) // self.block_size)
        load = self.get(replica)
        if not load.prefilling:
            load.busy_since = now  # an idle queue: the replica starts on this request now
        self._requests[request_id] = InFlight(
            replica, load, uncached, output_tokens, blocks,
            dispatched_s=now, decoding=load.decoding > 0,
            queued_ahead=load.queued_prefill_tokens, queue_elapsed_s=now - load.busy_since,
            context=context, context_ahead=load.queued_context,
            dispatched_context_mark=load.dispatched_context + context,
            predicted_cached=prompt_tokens - uncached,
            key_block_tokens=self.block_size if key_block_tokens is None else key_block_tokens,
            seq=load.fixes.dispatched(), sequences=sequences, batch=batch,
            dispatched_mark=load.dispatched_tokens + uncached,
            # Before its speed is its own, no first token is guessed (first_token_due), so the
            # queue seen ahead may hold requests long past their prefill (inflight.learn_whole).
            queue_known=not load.queued_prefill_tokens or load.speed_known,
            slot_wait=load.slots.full(load.in_flight),
        )  # fmt: skip
        in_order(load, self._requests[request_id])
        load.in_flight += 1
        load.prefilling += 1
        load.queued_prefill_tokens += uncached
        load.dispatched_tokens += uncached
        load.queued_context += context
        load.dispatched_context += context
        load._add_arrival(uncached, now)
        load.active_blocks += blocks

    def first_token(self, request_id: str, now: float, measured: bool = True) -> None:
        """The request's prefill is over (its first token arrived).

        ``measured=False`` says ``now`` is not the token's own time (heard late through another
        instance, or read from a buffered answer): the load view moves on, but the speed model
        does not learn from it. A first token nobody saw is guessed: :meth:`guess_first_token`."""
        req = self._requests.get(request_id)
        if req is None or req.prefilled:
            return
        self._prefilled(req, now)
        for other in passed_unseen(req):
            self._prefilled(other, now)
        if measured:
            req.prefilled_mark = req.load.prefilled_tokens  # its decode phase starts here
            req.prefilled_context_mark = req.load.prefilled_context
            req.phase_mark = req.load.phase_fixes.prefills
            req.first_token_s = now
            if req.misjudged() and clean(req):
                req.ttft_obs = req.learn_ttft()
                req.ttft_learned = True

    def first_token_due(self, request_id: str) -> float | None:
        """Seconds after its dispatch that the request's first token is predicted, at its
        replica's estimates, behind the queue it joined (None: not in flight, or past its
        prefill). Only a caller that will not see the first token (a plain answer arrives
        whole) asks, and asking marks the request so: it calls :meth:`guess_first_token` then,
        so that the load view stops counting the request's prefill as queued while it decodes,
        and a first token seen on a request sent after it takes it as come
        (``core/plain_answers.py``).

        None too while the replica's speed is not its own (the fleet's priors or its learned
        median; priors given for this very replica, ``told``, are its own): a guess at a speed
        nobody measured on it empties its queue too soon where it is slower, and more is sent
        there than it can do. Half the replicas 4x slower and every answer plain, the
        simulator's hot-prefix p99 TTFT went from 4.1 s (no guess) to 16 s with guesses at the
        priors; with half the answers plain, guesses at the speeds learned from the streams
        took it from 1.2 s to 0.65-0.87 s; with every answer plain and each replica's true
        speed given as its priors, from 4.1 and 2.7 s to 0.31 and 0.25 s (docs/results.md)."""
        req = self._requests.get(request_id)
        if req is None or req.prefilled:
            return None
        req.unseen = True  # the caller will not see it (core/plain_answers.py)
        return req.predicted_ttft() if req.load.speed_known else None

    def guess_first_token(self, request_id: str, now: float) -> float | None:
        """The request's first token, which nobody will see, is due (``first_token_due``):
        the load view moves on, as with ``first_token(..., measured=False)``, unless requests
        sent to its replica before it are still without one (``core/plain_answers.py``). Then
        nothing changes and the answer is the seconds to wait before guessing again; None once
        guessed (or not in flight)."""
        req = self._requests.get(request_id)
        if req is None or req.prefilled:
            return None
        wait = recheck_s(req, now)
        if wait is None:
            self._prefilled(req, now)
        return wait

    @staticmethod
    def _prefilled(req: InFlight, now: float) -> None:
        """The load view's side of a first token: the request leaves its replica's queue."""
        req.prefilled = True
        load = req.load
        req.through = load.fixes.dispatches
        req.prefill_no = load.phase_fixes.prefilled()
        load.prefilling -= 1
        load.queued_prefill_tokens -= req.uncached_tokens
        load.prefilled_tokens += req.uncached_tokens
        load.prefilled_context += req.context
        if load.prefilling:
            load.busy_since = now  # it moves on to the next request in its queue
            load.queued_context -= req.context
        else:  # an empty queue's work is none: no float residue from the sums
            load.queued_context = 0.0
        load._add_tokens(req.uncached_tokens, now)

    def observe_usage(
        self, request_id: str, prompt_tokens: int, cached_tokens: int
    ) -> InFlight | None:
        """The replica reported the request's prompt and cached tokens (``usage``): its own
        uncached count replaces the prediction in what the speed model learns. Returns the
        request's record, with its predictions (None if the request is not in flight)."""
        req = self._requests.get(request_id)
        if req is None or req.batch:  # a batch's counts are of every prompt, not this one
            return None
        req.actual_uncached = max(0, prompt_tokens - cached_tokens)
        # The requests behind it waited for what it really computed (core/queue_fixes.py).
        load, delta = req.load, req.actual_uncached - req.uncached_tokens
        through = req.through if req.prefilled else load.fixes.dispatches
        context = req.own_context(req.actual_uncached) - req.context
        if delta and through > req.seq:
            load.fixes.add(req.seq, through, delta)
            load.speed.correct_queue(req.seq, through, delta, context)
        if delta and req.prefilled:  # and the decode phases its prefill shared
            load.phase_fixes.add(req.prefill_no, delta, context)
            load.speed.correct_decode(req.prefill_no, delta, context, req.seq)
        return req

    def complete(
        self, request_id: str, now: float, output_tokens: int | None = None, whole: bool = False
    ) -> None:
        """The request ended, however it ended. Safe to call twice.

        With a measured first token, the request teaches its replica's speed model: its TTFT
        (prefill rate), and with ``output_tokens`` given, its decode phase (decode step).
        ``whole``: the answer arrived whole at ``now`` (a plain response, read to its end):
        without a measured first token, its time from dispatch, with ``output_tokens``, teaches
        both at once (``ReplicaSpeed.observe_first_token``'s ``after``)."""
        req = self._requests.pop(request_id, None)
        if req is None:
            return
        if not req.prefilled:
            self._prefilled(req, now)
        load = req.load
        load.in_flight -= 1
        load.active_blocks -= req.blocks
        load.completed += 1
        load.slots.completed(now)
        out = req.output_tokens if output_tokens is None else output_tokens
        load._add_tokens(out, now)
        if not clean(req):  # in flight while its engine preempted (core/preemptions.py)
            return
        if req.first_token_s is None:  # a whole answer warms nothing up: no fleet to share
            if whole:
                req.learn_whole(now, output_tokens)
            return
        self._learn(req, now, output_tokens)
        if self._cold:
            self._share_fleet_speed()

    _learn = staticmethod(InFlight.learn)  # (a name tests/vllm spies on)

    def observe_engine_prefill(
        self, replica: ReplicaId, tokens: float, requests: int, seconds: float
    ) -> None:
        """The engine's own prefill times (``Router.observe_engine_prefill``) teach its speed
        model. The engine does not say how long each prompt's context was: its tokens are taken
        to carry the context work of what this router saw it prefill (core/context_cost.py)."""
        load = self.get(replica)
        done = load.prefilled_tokens
        per_token = load.prefilled_context / done if done else 0.0
        load.speed.observe_engine_prefill(tokens, requests, seconds, tokens * per_token)

    def observe_preemptions(self, replica: ReplicaId, preemptions: int, now: float) -> int:
        """A scrape at ``now`` counted ``preemptions`` by ``replica``'s engine since the last
        (``Router.observe_preemptions``); returns the observations its speed model took back."""
        return preemptions_seen(self.get(replica), preemptions, now)

    def observe(
        self,
        replica: ReplicaId,
        *,
        kv_usage: float | None = None,
        num_waiting: int | None = None,
        num_running: int | None = None,
        max_running: int | None = None,
    ) -> None:
        """Record numbers reported by the replica itself (metrics scrape or simulator step;
        ``max_running``: the batch size its engine says it has, core/batch_slots.py)."""
        load = self.get(replica)
        load.slots.report(num_running, num_waiting, max_running)
        if kv_usage is not None:
            load.kv_usage = kv_usage
        if num_waiting is not None:
            load.num_waiting = num_waiting
        if num_running is not None:
            load.num_running = num_running
