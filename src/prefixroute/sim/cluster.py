"""One simulated run: a workload, a router with one policy, and replicas on a kernel clock.

The cluster drives the core exactly as the gateway does: ``Router.view`` once per request,
``Router.route`` to choose, ``first_token`` and ``complete`` from the replica's step results.
Replicas are :class:`ReplicaModel` instances stepped on the kernel by a :class:`ReplicaStepper`,
the step loop the emulator runs on its real-time kernel.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from prefixroute.core import (
    BlockHash,
    BlockHasher,
    ConfigError,
    IndexCapacityConfig,
    Policy,
    ReplicaId,
    RequestTooLarge,
    RequestView,
    Router,
    SpeedConfig,
    SpeedPrior,
)
from prefixroute.core.context_cost import doubling_context
from prefixroute.sim.collector import YoungCollections
from prefixroute.sim.fleet import Fleet, SpeedChange
from prefixroute.sim.kernel import ARRIVAL, URGENT, Kernel
from prefixroute.sim.records import ReplicaRecord, RequestRecord, RunResult, SpeedSample
from prefixroute.sim.replica import EngineRequest, ReplicaConfig, ReplicaModel, StepResult
from prefixroute.sim.scrape import EngineScrapes
from prefixroute.sim.stepper import ReplicaStepper
from prefixroute.sim.workload import ClusterEvent, Session, Workload

__all__ = ["ClusterSim", "ReplicaRecord", "RequestRecord", "RunResult", "SpeedSample"]


@dataclass(slots=True)
class _Live:
    model: ReplicaModel
    stepper: ReplicaStepper  # steps the model; calls ClusterSim._end with each step's result
    accepting: bool = True


class ClusterSim:
    """Runs one workload under one policy. Build a new one per run."""

    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        replicas: int = 4,
        replica_config: ReplicaConfig | None = None,
        seed: int = 0,
        on_progress: Callable[[int], None] | None = None,
        fleet: Fleet | None = None,
        trace_speeds: bool = False,
        index_capacity_scale: float = 1.0,
        index_capacity: IndexCapacityConfig | None = None,
        speed: SpeedConfig | None = None,
        plain: float = 0.0,
        scrape_s: float = 0.0,
        tell_speeds: bool = False,
    ) -> None:
        self.workload = workload
        self.policy = policy
        self.replica_config = replica_config or ReplicaConfig()
        # Replica r{i} runs fleet.configs[i]; without a fleet every replica runs replica_config.
        self.fleet = fleet or Fleet.uniform(replicas, self.replica_config)
        self.replicas = self.fleet.size
        # A decode step of no time never ends in the kernel (a zero-second plan idles it:
        # sim/stepper.py): every conversation stopped after its first turn, reported as failed.
        steps = [c.decode_step_s for c in self.fleet.configs]
        steps += [ch.decode_step_s for ch in self.fleet.changes if ch.decode_step_s is not None]
        if min(steps) <= 0:
            raise ConfigError("the simulator needs a decode step above 0 s on every replica")
        self.seed = seed
        self.on_progress = on_progress  # called with the number of completed requests
        self.trace_speeds = trace_speeds  # sample learned vs true speed after each completion
        # The router is told each replica's KV size times this (1: the truth; 4: a gateway
        # configured with 4x the replicas' real cache), and learns from there when
        # ``index_capacity`` says so (None: the Router's default).
        self.index_capacity_scale = index_capacity_scale
        self.index_capacity = index_capacity
        self.speed = speed  # the router's speed priors and learning (None: the policy's priors)
        # The share of answers that are plain (not streamed), drawn per request from the seed:
        # as a gateway sees one, the router is told no first token but guesses it
        # (Router.first_token_due), and learns from the whole answer's time.
        if not 0.0 <= plain <= 1.0:
            raise ConfigError(f"plain must be a share between 0 and 1, got {plain}")
        self.plain = plain
        # Every ``scrape_s`` seconds the router reads each engine's prefill metrics, as a
        # gateway's health round does (sim/scrape.py); 0: never.
        if not 0.0 <= scrape_s < float("inf"):
            raise ConfigError(f"scrape_s must be 0 (no scraping) or positive, got {scrape_s}")
        self.scrape_s = scrape_s
        # The router is given each replica's true prefill rate, decode step and batch size as
        # its own priors (SpeedPrior), as an operator who knows the fleet gives --replica-speed.
        self.tell_speeds = tell_speeds

    def run(self) -> RunResult:
        wall0 = time.perf_counter()
        self._kernel = Kernel()
        cfg = self.replica_config
        self._router = Router(
            self.policy,
            BlockHasher(cfg.block_size),
            index_capacity_blocks=self._told(cfg.kv_capacity_blocks),
            kv_block_size=cfg.block_size,
            seed=self.seed,
            capacity=self.index_capacity,
            speed=self.speed,
        )
        self._live: dict[ReplicaId, _Live] = {}
        self._stats: dict[ReplicaId, ReplicaRecord] = {}
        self._records: list[RequestRecord] = []
        self._plain_draws = random.Random(self.seed)  # which answers are plain
        self._scrapes = EngineScrapes() if self.scrape_s > 0 else None
        self._pending: dict[str, _Pending] = {}
        self._done = 0
        self._collections = YoungCollections()
        self._accepting_ids: list[ReplicaId] | None = None  # cache of _candidates()
        self._all_accepting = False  # those are the router's replicas, in its order
        self._trace: list[SpeedSample] = []
        self._completed: dict[ReplicaId, int] = {}
        for i in range(self.replicas):
            self._add_replica(ReplicaId(f"r{i}"))
        # Sessions are read one arrival ahead, so a workload built on demand (a trace replayed a
        # million times) is never all in memory. ARRIVAL keeps first turns ahead of the other
        # events of their instant, where scheduling them all up front used to put them.
        self._sessions = self.workload.by_start()
        self._next_session()
        for ev in self.workload.cluster_events:
            self._kernel.at(ev.at_s, partial(self._cluster_event, ev), URGENT)
        for change in self.fleet.changes:
            self._kernel.at(change.at_s, partial(self._speed_change, change), URGENT)
        if self._scrapes is not None:
            self._kernel.after(self.scrape_s, self._scrape)
        with self._collections:  # the cyclic collector: young generations only (collector.py)
            self._kernel.run()
            return self._result(wall0)

    def _result(self, wall0: float) -> RunResult:
        cfg = self.replica_config
        for rid, live in self._live.items():
            self._close_stats(rid, live.model)
            if self._router.has_replica(rid):
                self._record_speed(rid)
        finish = [r.finish_s for r in self._records if r.finish_s is not None]
        return RunResult(
            policy=self.policy.name,
            workload=self.workload.name,
            block_size=cfg.block_size,
            duration_s=max(finish, default=0.0),
            records=self._records,
            replicas=list(self._stats.values()),
            index_blocks=self._router.index_blocks(),
            index_evictions=self._router.index_evictions(),
            events=self._kernel.processed,
            wall_s=time.perf_counter() - wall0,
            speed_trace=self._trace,
        )

    def _scrape(self) -> None:
        """A scrape round (sim/scrape.py); the next one, unless nothing else is left to run."""
        assert self._scrapes is not None
        replicas = [(rid, live.model.preemptions) for rid, live in self._live.items()
                    if self._router.has_replica(rid)]  # fmt: skip
        self._scrapes.scrape(self._router, replicas, self._kernel.now)
        if self._kernel.peek() != float("inf"):
            self._kernel.after(self.scrape_s, self._scrape)

    # --- cluster membership ---------------------------------------------------------------
    def _add_replica(self, rid: ReplicaId) -> None:
        config = self.fleet.config_of(rid, self.replica_config)
        model = ReplicaModel(config, fast_forward=True, report_decodes=False)
        self._live[rid] = _Live(model, ReplicaStepper(self._kernel, model, partial(self._end, rid)))
        self._accepting_ids = None
        self._stats[rid] = ReplicaRecord(rid, added_s=self._kernel.now)
        told = SpeedPrior(config.prefill_tokens_per_s, config.decode_step_s, config.max_running)
        speed = told if self.tell_speeds else None
        self._router.add_replica(rid, self._told(config.kv_capacity_blocks), speed=speed)
        self._stats[rid].kv_capacity_blocks = config.kv_capacity_blocks

    def _told(self, kv_blocks: int) -> int:
        """The index capacity the router is given for a replica of ``kv_blocks`` blocks."""
        return max(1, round(kv_blocks * self.index_capacity_scale))

    def _record_speed(self, rid: ReplicaId) -> None:
        """What the router has learned of ``rid``'s speed, for the report."""
        speed = self._router.replica_load(rid).speed
        st = self._stats[rid]
        st.learned_prefill_tokens_per_s = speed.prefill_tokens_per_s
        st.learned_decode_step_s = speed.decode_step_s
        st.learned_first_token_overhead_s = speed.first_token_overhead_s
        doubling = doubling_context(speed.prefill_tokens_per_s, speed.attention_s)
        st.learned_attention_tokens = doubling or 0.0
        learned = self._router.index_capacity(rid)
        st.index_capacity_blocks = int(learned.blocks) if learned is not None else None

    def _sample_speed(self, rid: ReplicaId, now: float) -> None:
        done = self._completed[rid] = self._completed.get(rid, 0) + 1
        speed = self._router.replica_load(rid).speed
        true = self._live[rid].model.config
        self._trace.append(
            SpeedSample(
                now, rid, done, speed.prefill_tokens_per_s, true.prefill_tokens_per_s,
                speed.decode_step_s, true.decode_step_s,
            )
        )  # fmt: skip

    def _speed_change(self, change: SpeedChange) -> None:
        live = self._live.get(ReplicaId(change.replica))
        if live is not None:
            live.model.set_speed(change.prefill_tokens_per_s, change.decode_step_s)

    def _cluster_event(self, ev: ClusterEvent) -> None:
        rid = ReplicaId(ev.replica)
        if ev.action == "add" and rid not in self._live:
            self._add_replica(rid)
        elif ev.action == "remove" and rid in self._live and self._live[rid].accepting:
            live = self._live[rid]
            live.accepting = False
            self._accepting_ids = None
            self._record_speed(rid)
            self._router.remove_replica(rid)
            self._stats[rid].removed_s = self._kernel.now
            # Requests not yet started move elsewhere; running ones drain where they are.
            moved = list(live.model.waiting)
            live.model.waiting.clear()
            for req in moved:
                self._reroute(self._pending[req.request_id])

    def _reroute(self, p: _Pending) -> None:
        """``p`` never started on the replica it was sent to (that one left): route it again."""
        p.record.rerouted += 1
        self._router.complete(p.record.request_id, self._kernel.now, output_tokens=0)
        self._dispatch(p)

    def _close_stats(self, rid: ReplicaId, model: ReplicaModel) -> None:
        st = self._stats[rid]
        st.busy_s = model.busy_s
        st.prefill_tokens = model.prefill_tokens
        st.cached_tokens = model.cached_tokens
        st.evictions = model.cache.evictions
        st.preemptions = model.preemptions
        st.prefill_tokens_per_s = model.config.prefill_tokens_per_s
        st.decode_step_s = model.config.decode_step_s
        st.first_token_overhead_s = model.config.first_token_overhead_s
        st.attention_tokens = model.config.attention_tokens

    # --- requests -------------------------------------------------------------------------
    def _next_session(self) -> None:
        session = next(self._sessions, None)
        if session is not None:
            self._kernel.at(session.start_s, partial(self._first_turn, session), ARRIVAL)

    def _first_turn(self, session: Session) -> None:
        self._next_session()
        self._arrive(session, 0, ())

    def _arrive(self, session: Session, turn: int, known: Sequence[BlockHash]) -> None:
        t = session.turns[turn]
        now = self._kernel.now
        rec = RequestRecord(
            request_id=f"{session.session_id}/{turn}",
            session_id=session.session_id,
            turn=turn,
            arrival_s=now,
            prompt_tokens=len(t.tokens),
            output_tokens=t.output_tokens,
        )
        self._records.append(rec)
        view = self._router.view(
            rec.request_id,
            tokens=t.tokens,
            output_tokens=t.output_tokens,
            session_id=session.session_id,
            tenant=session.tenant,
            known=known,
        )
        plain = rec.plain = self.plain > 0 and self._plain_draws.random() < self.plain
        self._pending[rec.request_id] = _Pending(rec, view, session, turn, plain)
        self._dispatch(self._pending[rec.request_id])

    def _candidates(self) -> list[ReplicaId] | None:
        """Replicas taking new requests, in order of addition; rebuilt only when one changes.
        None when they are the router's own replicas in its order (its default candidates: it
        keeps their set, which a shortlist at a thousand replicas would otherwise rebuild)."""
        if self._accepting_ids is None:
            self._accepting_ids = [rid for rid, live in self._live.items() if live.accepting]
            self._all_accepting = self._accepting_ids == self._router.replicas
        return None if self._all_accepting else self._accepting_ids

    def _dispatch(self, p: _Pending) -> None:
        now = self._kernel.now
        t0 = time.perf_counter_ns()
        decision = self._router.route(p.view, now, self._candidates())
        p.record.decision_ns += time.perf_counter_ns() - t0
        rid = decision.replica
        p.record.replica = rid
        p.record.reason = decision.reason.value
        p.record.predicted_cached_tokens = decision.predicted_cached_tokens
        due = self._router.first_token_due(p.record.request_id) if p.plain else None
        if due is not None:
            self._kernel.after(due, partial(self._guess_first_token, p.record.request_id))
        turn = p.session.turns[p.turn]
        req = EngineRequest(
            p.record.request_id,
            turn.tokens,
            turn.output_tokens,
            arrival_s=now,
            block_hashes=list(p.view.block_hashes),
        )
        overhead = self._live[rid].model.config.first_token_overhead_s
        if overhead > 0:  # on its way to the engine's queue (HTTP, tokenizing) meanwhile
            self._kernel.after(overhead, partial(self._submit, p, rid, req))
        else:
            self._submit(p, rid, req)

    def _guess_first_token(self, request_id: str) -> None:
        """A plain answer's first token is due (as predicted): the router moves on unseen, or
        says when to guess again (requests ahead of it are not through: core/plain_answers.py)."""
        again = self._router.guess_first_token(request_id, self._kernel.now)
        if again is not None:
            self._kernel.after(again, partial(self._guess_first_token, request_id))

    def _submit(self, p: _Pending, rid: ReplicaId, req: EngineRequest) -> None:
        """``req`` reaches ``rid``'s engine queue."""
        live, now = self._live[rid], self._kernel.now
        if not live.accepting:  # removed while the request was on its way
            self._reroute(p)
            return
        req.arrival_s = now
        try:
            live.model.submit(req)
        except RequestTooLarge:
            # Counted as a failed request (no first token); the run goes on.
            self._router.complete(p.record.request_id, now, output_tokens=0)
            del self._pending[p.record.request_id]
            return
        self._stats[rid].requests += 1
        live.stepper.kick()  # start stepping, or cut a long decode stretch short

    def _end(self, rid: ReplicaId, result: StepResult) -> None:
        """``rid`` applied a step (its stepper plans the next one after this returns)."""
        now = self._kernel.now
        live = self._live[rid]
        for req in result.first_tokens:
            pending = self._pending[req.request_id]
            pending.record.first_token_s = now
            pending.record.cached_tokens = req.cached_tokens
            if not pending.plain:  # a plain answer's first token goes unseen (its guess: _dispatch)
                self._router.first_token(req.request_id, now)
        for req in result.finished:
            if self._scrapes is not None:
                self._scrapes.finished(rid, req)
            p = self._pending.pop(req.request_id)
            p.record.finish_s = now
            # What a gateway hears at the end of a response: usage, then the end itself.
            self._router.observe_usage(req.request_id, req.prompt_tokens, req.cached_tokens)
            self._router.complete(req.request_id, now, req.output_tokens, whole=p.plain)
            if self.trace_speeds and self._router.has_replica(rid):
                self._sample_speed(rid, now)
            nxt = p.turn + 1
            if nxt < len(p.session.turns):
                think = p.session.turns[nxt].think_s
                known = tuple(p.view.block_hashes)
                self._kernel.after(think, partial(self._arrive, p.session, nxt, known))
            self._done += 1
            self._collections.done()
            if self.on_progress is not None:
                self.on_progress(self._done)
        if live.accepting:
            m = live.model
            self._router.observe_replica(
                rid, kv_usage=m.kv_usage, num_waiting=m.num_waiting, num_running=m.num_running
            )


@dataclass(slots=True)
class _Pending:
    record: RequestRecord
    view: RequestView
    session: Session
    turn: int
    plain: bool = False  # its answer is plain: the router sees no first token
