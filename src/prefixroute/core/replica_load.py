"""One replica's load as the router sees it (:class:`ReplicaLoad`), kept by the one bookkeeping
path of :class:`~prefixroute.core.load.LoadTracker`: its requests in flight and queued prefill,
what it reported of itself, its learned speed and batch size, and recent rates."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from prefixroute.core.batch_slots import BatchSlots
from prefixroute.core.inflight import InFlight
from prefixroute.core.queue_fixes import PhaseFixes, QueueFixes
from prefixroute.core.speed import ReplicaSpeed
from prefixroute.core.speed_snapshot import snapshot

THROUGHPUT_WINDOW_S = 10.0  # seconds; time constant of the decaying throughput estimate


@dataclass(slots=True)
class ReplicaLoad:
    """One replica's load as the router sees it."""

    in_flight: int = 0  # requests dispatched and not completed
    prefilling: int = 0  # of those, requests without a first token yet
    queued_prefill_tokens: int = 0  # predicted uncached prompt tokens not yet prefilled, tokens
    queued_context: float = 0.0  # their context work, token-kilotokens (core/context_cost.py)
    active_blocks: int = 0  # KV blocks of in-flight requests (prompt + expected output), blocks
    completed: int = 0  # requests completed since registration
    # Scraped from the replica's metrics (None until a scrape or a simulator step reports them).
    kv_usage: float | None = None  # fraction of KV cache in use, 0..1
    num_waiting: int | None = None  # requests queued inside the engine
    num_running: int | None = None  # requests in the engine's running batch
    speed: ReplicaSpeed = field(default_factory=ReplicaSpeed)  # learned prefill rate, decode step
    slots: BatchSlots = field(default_factory=BatchSlots)  # batch size, wait for a free slot
    told: bool = False  # its own priors were given (SpeedPrior): known from the start
    busy_since: float = 0.0  # when it started on its current prefill queue, seconds
    # Its engine's preemptions (core/preemptions.py): counted by its scrapes, the end of the
    # last scrape interval they tainted (seconds), and whether they taint the next one.
    preemptions: int = 0
    preempted_s: float = -math.inf
    preempted_next: bool = False
    fixes: QueueFixes = field(default_factory=QueueFixes)  # dispatch count, queue corrections
    phase_fixes: PhaseFixes = field(default_factory=PhaseFixes)  # first tokens, their fixes
    prefilled_tokens: int = 0  # uncached tokens whose first token came back, since registration
    dispatched_tokens: int = 0  # predicted uncached tokens dispatched here, since registration
    prefilled_context: float = 0.0  # context work of ``prefilled_tokens``, token-kilotokens
    dispatched_context: float = 0.0  # context work of ``dispatched_tokens``, token-kilotokens
    # Its requests in dispatch order, from the oldest without a first token (prefilled ones
    # leave lazily: core/plain_answers.py, in_order): what a guessed first token waits behind.
    unprefilled: deque[InFlight] = field(default_factory=deque)
    _tokens_acc: float = 0.0  # decayed sum of tokens processed, tokens
    _tokens_at: float = 0.0  # time of the last decay, seconds
    _arrivals_acc: float = 0.0  # decayed count of requests dispatched here, requests
    _uncached_acc: float = 0.0  # decayed sum of their predicted uncached tokens, tokens
    _arrivals_at: float = 0.0  # time of the last decay, seconds

    @property
    def speed_known(self) -> bool:  # its own: learned (warmed up), or given by who knows it
        return self.told or self.speed.warmed_up

    def speed_report(self) -> dict[str, float | int | str | None]:  # given priors named so
        report = snapshot(self.speed, given=self.told)  # estimates, evidence: speed_snapshot.py
        report["batch_slots"] = self.slots.size  # told, said or learned (core/batch_slots.py)
        report["batch_slots_from"] = self.slots.source
        report["preemptions"] = self.preemptions  # its engine's, scraped (core/preemptions.py)
        return report

    @property
    def decoding(self) -> int:
        """In-flight requests past their prefill."""
        return self.in_flight - self.prefilling

    def queued_prefill_s(self, now: float) -> float:
        """The queued prefill work in seconds at this replica's own learned speed: how long a
        request dispatched now waits before its own prefill starts (decode overhead aside). The
        queue is what is left after the progress made on it since ``busy_since``
        (``ReplicaSpeed.queue_work``), its context work in proportion."""
        elapsed, decoding = now - self.busy_since, self.decoding > 0
        left, _, context = self.speed.queue_work(
            self.queued_prefill_tokens, elapsed, decoding, 0, self.queued_context
        )
        return self.speed.prefill_s(left, context)

    def throughput(self, now: float) -> float:
        """Recent tokens processed per second (prefill + output), exponentially decayed."""
        decay = math.exp(-(now - self._tokens_at) / THROUGHPUT_WINDOW_S)
        return self._tokens_acc * decay / THROUGHPUT_WINDOW_S

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
