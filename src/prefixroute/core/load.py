"""The router's view of each replica's load, kept by one bookkeeping path.

The simulator and the gateway both call :meth:`LoadTracker.dispatch` when a request is sent,
:meth:`first_token` when its first output token comes back (prefill is over), and
:meth:`complete` when it ends (success, failure or cancellation alike). Numbers scraped from a
replica's metrics endpoint arrive through :meth:`observe` and are kept beside, never mixed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prefixroute.core.types import Decision, ReplicaId, RequestView

THROUGHPUT_WINDOW_S = 10.0  # seconds; time constant of the decaying throughput estimate


@dataclass(slots=True)
class ReplicaLoad:
    """One replica's load as the router sees it."""

    in_flight: int = 0  # requests dispatched and not completed
    prefilling: int = 0  # of those, requests without a first token yet
    queued_prefill_tokens: int = 0  # predicted uncached prompt tokens not yet prefilled, tokens
    active_blocks: int = 0  # KV blocks of in-flight requests (prompt + expected output), blocks
    completed: int = 0  # requests completed since registration
    # Scraped from the replica's metrics (None until a scrape or a simulator step reports them).
    kv_usage: float | None = None  # fraction of KV cache in use, 0..1
    num_waiting: int | None = None  # requests queued inside the engine
    num_running: int | None = None  # requests in the engine's running batch
    _tokens_acc: float = 0.0  # decayed sum of tokens processed, tokens
    _tokens_at: float = 0.0  # time of the last decay, seconds
    _arrivals_acc: float = 0.0  # decayed count of requests dispatched here, requests
    _uncached_acc: float = 0.0  # decayed sum of their predicted uncached tokens, tokens
    _arrivals_at: float = 0.0  # time of the last decay, seconds

    @property
    def decoding(self) -> int:
        """In-flight requests past their prefill."""
        return self.in_flight - self.prefilling

    def throughput(self, now: float) -> float:
        """Recent tokens processed per second (prefill + output), exponentially decayed."""
        return self._tokens_acc * math.exp(-(now - self._tokens_at) / THROUGHPUT_WINDOW_S) / (
            THROUGHPUT_WINDOW_S
        )

    def arrival_rate(self, now: float) -> float:
        """Recent requests dispatched here per second, exponentially decayed."""
        decay = math.exp(-(now - self._arrivals_at) / THROUGHPUT_WINDOW_S)
        return self._arrivals_acc * decay / THROUGHPUT_WINDOW_S

    def mean_uncached(self) -> float:
        """Mean predicted uncached tokens of recent requests dispatched here, tokens."""
        return self._uncached_acc / self._arrivals_acc if self._arrivals_acc else 0.0

    def _add_arrival(self, uncached: int, now: float) -> None:
        decay = math.exp(-(now - self._arrivals_at) / THROUGHPUT_WINDOW_S)
        self._arrivals_acc = self._arrivals_acc * decay + 1.0
        self._uncached_acc = self._uncached_acc * decay + uncached
        self._arrivals_at = now

    def _add_tokens(self, tokens: int, now: float) -> None:
        decay = math.exp(-(now - self._tokens_at) / THROUGHPUT_WINDOW_S)
        self._tokens_acc = self._tokens_acc * decay + tokens
        self._tokens_at = now


@dataclass(slots=True)
class _InFlight:
    replica: ReplicaId
    load: ReplicaLoad  # the load it was counted in (survives the replica's removal and re-adding)
    uncached_tokens: int  # predicted prefill work, tokens
    output_tokens: int  # expected output, tokens
    blocks: int  # KV blocks reserved in the view, blocks
    prefilled: bool = False


@dataclass(slots=True)
class LoadTracker:
    """Per-replica load, updated by dispatch / first token / completion."""

    block_size: int = 16  # tokens per KV block, for ``active_blocks``
    _loads: dict[ReplicaId, ReplicaLoad] = field(default_factory=dict)
    _requests: dict[str, _InFlight] = field(default_factory=dict)

    def add_replica(self, replica: ReplicaId) -> None:
        self._loads.setdefault(replica, ReplicaLoad())

    def remove_replica(self, replica: ReplicaId) -> None:
        """Forget ``replica``; its in-flight requests stay tracked until they complete."""
        self._loads.pop(replica, None)

    def __getitem__(self, replica: ReplicaId) -> ReplicaLoad:
        return self._loads[replica]

    def get(self, replica: ReplicaId) -> ReplicaLoad:
        """The load of ``replica``, registering it on first sight."""
        load = self._loads.get(replica)
        if load is None:
            load = self._loads[replica] = ReplicaLoad()
        return load

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
    ) -> None:
        """A request was sent to ``replica``, known by its numbers only: :meth:`dispatch`'s
        bookkeeping, for a request another router instance routed (it shares them)."""
        if request_id in self._requests:
            # A reused id: the earlier request is over as far as the load view can tell.
            self.complete(request_id, now)
        uncached = max(0, prompt_tokens - predicted_cached_tokens)
        blocks = -(-(prompt_tokens + output_tokens) // self.block_size)
        load = self.get(replica)
        self._requests[request_id] = _InFlight(replica, load, uncached, output_tokens, blocks)
        load.in_flight += 1
        load.prefilling += 1
        load.queued_prefill_tokens += uncached
        load._add_arrival(uncached, now)
        load.active_blocks += blocks

    def first_token(self, request_id: str, now: float) -> None:
        """The request's prefill is over (its first token arrived)."""
        req = self._requests.get(request_id)
        if req is None or req.prefilled:
            return
        req.prefilled = True
        load = req.load
        load.prefilling -= 1
        load.queued_prefill_tokens -= req.uncached_tokens
        load._add_tokens(req.uncached_tokens, now)

    def complete(self, request_id: str, now: float, output_tokens: int | None = None) -> None:
        """The request ended, however it ended. Safe to call twice."""
        self.first_token(request_id, now)
        req = self._requests.pop(request_id, None)
        if req is None:
            return
        load = req.load
        load.in_flight -= 1
        load.active_blocks -= req.blocks
        load.completed += 1
        out = req.output_tokens if output_tokens is None else output_tokens
        load._add_tokens(out, now)

    def observe(
        self,
        replica: ReplicaId,
        *,
        kv_usage: float | None = None,
        num_waiting: int | None = None,
        num_running: int | None = None,
    ) -> None:
        """Record numbers reported by the replica itself (metrics scrape or simulator step)."""
        load = self.get(replica)
        if kv_usage is not None:
            load.kv_usage = kv_usage
        if num_waiting is not None:
            load.num_waiting = num_waiting
        if num_running is not None:
            load.num_running = num_running
