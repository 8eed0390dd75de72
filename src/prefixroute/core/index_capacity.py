"""How many blocks each replica really keeps, learned from the cached tokens it reports.

In approximate mode the router cannot see evictions. Its index forgets a replica's blocks at
the rate of a configured capacity (``index_capacity_blocks``; the simulator passes the KV size).
When the replica keeps less than that (a smaller KV cache than configured, decode tokens and
other traffic sharing it, an engine that keeps room for running requests), the index claims
prefixes the replica has already evicted, and each such claim comes back as a report of fewer
cached tokens than predicted (``usage.prompt_tokens_details.cached_tokens``). When the index
keeps less than the replica, reports show more cached tokens than predicted.

So every report on a request with a prediction is a vote:

* cached fewer than predicted, by more than ``tolerance`` tokens (the granularity of a
  prediction: one block), says the index is too large for that replica;
* cached more than predicted, by more than ``tolerance``, says it is too small;
* anything else is no vote.

Each vote moves the replica's capacity by a factor ``exp(gain)`` or ``exp(-gain)``. The
capacity therefore settles where the two errors are equally frequent (a stochastic-approximation
estimate of the size at which the index's picture matches the replica's; ``gain`` sets only how
fast it gets there and how much it wanders), and, being multiplicative, halves in the same
number of votes from a million blocks as from a thousand. The configured capacity bounds it
from above: it is a limit the operator states (a KV size), and reports of more cached tokens
than predicted also come from traffic this router did not see. ``min_fraction`` of it bounds it
from below.

Shrinking trims the index at once: the replica's least recently used entries go first (the
ones the index is least sure of), counted as corrections. A replica whose index is unbounded
(precise mode: its engine reports every eviction) learns nothing here.

**Off by default, measured.** It makes predictions right, and it costs cache hits.
``benchmarks/index_capacity.py`` (seeds 0 and 1, multi-turn with a 32,768-token KV cache per
replica) tells the simulator's router 4x each replica's real KV cache:

* Learning brings predicted / actual cached tokens from 1.28 to 1.10, and over-predicted
  requests from 31% to 12%. The learned capacity lands at 0.94x the true KV, and p99 TTFT drops
  from 320 to 270 ms.
* The hit rate still drops slightly (61.7% to 60.6%), since a smaller index forgets prefixes
  whose early blocks the replica still holds. Told the truth, learning costs hits too (61.1% to
  59.8%; prefill 2.01x to 2.08x the floor). Routing to an over-claimed replica costs little (the
  prompt is recomputed there, as it would be elsewhere); forgetting a held prefix costs its
  whole recomputation.

So the router keeps the configured capacity unless told to learn
(``Router(capacity=IndexCapacityConfig(learn=True))``, the simulator's ``index_capacity``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prefixroute.core.errors import ConfigError
from prefixroute.core.index import PrefixIndex
from prefixroute.core.types import ReplicaId


@dataclass(frozen=True, slots=True)
class IndexCapacityConfig:
    learn: bool = False  # True: learn each replica's capacity (off by default: docstring)
    gain: float = 0.02  # log-capacity step per vote (35 votes halve it)
    min_fraction: float = 1 / 64  # lowest capacity, as a fraction of the configured one

    def __post_init__(self) -> None:
        if not 0 < self.gain <= 1:
            raise ConfigError(f"index capacity gain must be in (0, 1], got {self.gain}")
        if not 0 < self.min_fraction <= 1:
            raise ConfigError(
                f"index capacity min_fraction must be in (0, 1], got {self.min_fraction}"
            )


@dataclass(slots=True)
class ReplicaCapacity:
    """One replica's learned index capacity and the votes that moved it."""

    configured: int  # blocks: the prior and the upper bound
    blocks: float  # blocks: the current estimate (the index is resized to its integer part)
    too_large: int = 0  # reports of fewer cached tokens than predicted
    too_small: int = 0  # reports of more cached tokens than predicted
    trimmed: int = 0  # index entries dropped by shrinking, blocks


@dataclass(slots=True)
class IndexCapacity:
    """The per-replica estimates; :meth:`vote` says what the index should be resized to."""

    config: IndexCapacityConfig = field(default_factory=IndexCapacityConfig)
    _replicas: dict[ReplicaId, ReplicaCapacity] = field(default_factory=dict)

    def track(self, replica: ReplicaId, configured_blocks: int | None) -> None:
        """Start (or restart) learning ``replica``'s capacity; None (unbounded): never."""
        if configured_blocks is None or not self.config.learn:
            self._replicas.pop(replica, None)
        else:
            self._replicas[replica] = ReplicaCapacity(configured_blocks, float(configured_blocks))

    def forget(self, replica: ReplicaId) -> None:
        self._replicas.pop(replica, None)

    def get(self, replica: ReplicaId) -> ReplicaCapacity | None:
        return self._replicas.get(replica)

    def vote(self, replica: ReplicaId, predicted: int, actual: int, tolerance: int) -> int | None:
        """A report: ``predicted`` and ``actual`` cached tokens of one request on ``replica``.
        Returns the capacity the index should now have, in blocks, when it changed."""
        cap = self._replicas.get(replica)
        if cap is None:
            return None
        if actual < predicted - tolerance:
            cap.too_large += 1
            step = -self.config.gain
        elif actual > predicted + tolerance:
            cap.too_small += 1
            step = self.config.gain
        else:
            return None
        low = max(1.0, cap.configured * self.config.min_fraction)
        before = int(cap.blocks)
        cap.blocks = min(float(cap.configured), max(low, cap.blocks * math.exp(step)))
        after = int(cap.blocks)
        return after if after != before else None

    def observe(
        self, index: PrefixIndex, replica: ReplicaId, predicted: int, actual: int, tolerance: int
    ) -> None:
        """:meth:`vote`, then resize ``replica`` in ``index`` if the capacity changed (the
        entries dropped count as ``trimmed``)."""
        resized = self.vote(replica, predicted, actual, tolerance)
        if resized is not None:  # only a tracked replica's capacity changes
            self._replicas[replica].trimmed += index.resize_replica(replica, resized)
