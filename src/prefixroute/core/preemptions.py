"""A replica that preempts: what its speed model must not learn from.

An engine whose KV cache runs out while its batch decodes preempts requests (vLLM v1 frees the
newest running request's blocks and recomputes its prompt and output so far when there is room
again; SGLang retracts). That recomputation is work no router dispatched: answers then take
longer than the work the router counted, and the fit reads them as a slower prefill and decode
step. In the simulator, on a multi-turn load far past its capacity (``rate=8``,
``answer_max=1500``), replicas with 16k-token caches that preempted 290-910 times each were
learned at 0.10-0.98x their prefill rate and 0.15-0.69x their decode step, three of four
rates under a third (``simulate --fleet 2:kv_tokens=16384,preempt=1+2:...,prefill=2500``);
``benchmarks/preemptions.py`` measures lighter loads (docs/results.md, *Preemptions*).

The engine counts its preemptions (vLLM's ``vllm:num_preemptions_total``), and the gateway and
the simulator read the counter at each scrape (:class:`PreemptionCounts`), so they know *in
which scrape intervals* a replica preempted, not which requests it slowed. So, per replica
(:func:`observe`, called at each scrape with the preemptions since the last one):

* an interval with a preemption taints itself and the next (the preempted requests are
  recomputed after they were preempted, while others wait behind them);
* at the end of a tainted interval, what the speed model learned during it is taken back
  (:meth:`ReplicaSpeed.discard_fresh`); the model learns from the interval's start again;
* a request that was in flight when a tainted interval ended teaches nothing when it ends
  (:func:`clean`): its time may hold recomputation, even if it ends in a clean interval.

A replica that never preempts, or whose engine exports no counter, learns as before. One that
preempts all the time learns nothing while it does, and keeps the estimates it had: a speed
learned from answers it slowed would be wrong for every prediction after.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the load view imports this module; types only
    from prefixroute.core.inflight import InFlight
    from prefixroute.core.load import LoadTracker
    from prefixroute.core.replica_load import ReplicaLoad
    from prefixroute.core.types import ReplicaId


class PreemptionCalls:
    """The :class:`~prefixroute.core.router.Router`'s call for an engine's preemptions."""

    loads: LoadTracker
    _registered: set[ReplicaId]

    def observe_preemptions(self, replica: ReplicaId, preemptions: int, now: float) -> int:
        """``replica``'s engine preempted ``preemptions`` requests between two scrapes, the
        second at ``now`` (0: none; call it after that scrape's ``observe_engine_prefill``):
        its speed model takes back what it learned meanwhile (module docstring). Returns how
        many observations; 0 for a replica not registered."""
        if replica not in self._registered:
            return 0
        return self.loads.observe_preemptions(replica, preemptions, now)


def observe(load: ReplicaLoad, preemptions: int, now: float) -> int:
    """One scrape of ``load``'s replica at ``now`` counted ``preemptions`` since the last one
    (module docstring). Returns the observations taken back."""
    tainted = preemptions > 0 or load.preempted_next
    load.preempted_next = preemptions > 0
    load.preemptions += max(0, preemptions)
    if not tainted:
        load.speed.mark()
        return 0
    load.preempted_s = now
    return load.speed.discard_fresh()


class PreemptionCounts:
    """Each replica's preemption count at its last scrape, and the increase since (None at the
    first scrape: the count covers the engine's whole life). A count that went down means the
    engine restarted: the new count is the interval's."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def forget(self, replica: str) -> None:
        self._last.pop(replica, None)

    def update(self, replica: str, total: int) -> int | None:
        last = self._last.get(replica)
        self._last[replica] = total
        if last is None:
            return None
        return total if total < last else total - last


def clean(req: InFlight) -> bool:
    """Whether ``req`` may teach its replica's speed: no tainted interval ended while it was
    in flight (dispatched after the last one's end)."""
    return req.dispatched_s >= req.load.preempted_s
