"""Speculative entries: where the router just sent a prefix, until the engine says so itself.

In precise mode the prefix index holds only what the engines reported in their KV events, and a
request's events come after the engine has scheduled its prefill: milliseconds to seconds after
the routing decision. A burst of requests sharing a new prefix would find it nowhere and scatter
by load, each replica computing the same prefix. A speculative entry stands in for those events:
the decision's blocks count as held by the chosen replica for ``ttl_s`` seconds, and by then the
engine's own events (or their absence, after an eviction or a failure) have taken over.

Entries are never confirmed or cancelled one by one; they expire. The clock is the caller's
``now`` (seconds), passed to every call, so the structure stays deterministic and testable.

Every decision records a whole chain from the prompt's first block, and a chain's blocks all
get the same expiry, so a block's parent expires no earlier than the block: each replica's set
stays closed under prefixes and the longest match is found by binary search, as in the index.
Expired entries are dropped lazily from a queue in expiry order (expiries only grow when ``now``
does), each dropped only if no later decision refreshed it. An entry's stamp is its expiry and
the number of the decision that set it: two decisions at the same clock reading (a simulator's
time, a cached ``now``) have the same expiry, and a later one's refresh must still be told from
the earlier one's entry (expiry alone let a withdrawal drop a block that the later decision
needed, and leave its child behind, no longer closed under prefixes).

A decision made with its request's id can be withdrawn while the request is in flight
(:meth:`SpeculativeEntries.withdraw`): the replica turned the request away (a 429 from a full
queue), so it will never compute those blocks, and for the rest of the TTL the prefix's next
requests would be sent back to it, predicted cached, to be turned away again. What goes is what
that decision added and nobody refreshed since: the blocks the replica did not hold before it,
a suffix of the chain (the held blocks are closed under prefixes), so the rest stays closed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from prefixroute.core.errors import ConfigError
from prefixroute.core.hashing import BlockHash
from prefixroute.core.index import held_prefix
from prefixroute.core.types import ReplicaId

DEFAULT_TTL_S = 2.0  # seconds: longer than a prefill's wait for its first events, on purpose
Stamp = tuple[float, int]  # an entry's (expiry in seconds, number of the decision that set it)


@dataclass(slots=True)
class SpeculativeEntries:
    """Block hash -> replica entries that expire ``ttl_s`` seconds after the decision."""

    ttl_s: float = DEFAULT_TTL_S  # seconds an entry lives
    # replica -> block -> its stamp: (expiry in seconds, the number of the decision that set it)
    _until: dict[ReplicaId, dict[BlockHash, Stamp]] = field(default_factory=dict)
    _queue: deque[tuple[Stamp, ReplicaId, Sequence[BlockHash]]] = field(default_factory=deque)
    # request id -> (replica, the blocks its decision added, their stamp), while in flight
    _added: dict[str, tuple[ReplicaId, list[BlockHash], Stamp]] = field(default_factory=dict)
    _decisions: int = 0  # decisions recorded (a stamp's second part)

    def __post_init__(self) -> None:
        if not self.ttl_s > 0:
            raise ConfigError(f"the speculative entry TTL must be positive, got {self.ttl_s}")

    def add(
        self,
        replica: ReplicaId,
        block_hashes: Sequence[BlockHash],
        now: float,
        request_id: str | None = None,
    ) -> None:
        """``replica`` was just sent a prompt with these blocks; with ``request_id``, what this
        added is kept for :meth:`withdraw` until :meth:`forget`."""
        self.expire(now)
        if not block_hashes:
            return
        self._decisions += 1
        stamp = (now + self.ttl_s, self._decisions)
        held = self._until.setdefault(replica, {})
        if request_id is not None:
            self._added[request_id] = (replica, [h for h in block_hashes if h not in held], stamp)
        held.update(dict.fromkeys(block_hashes, stamp))
        self._queue.append((stamp, replica, block_hashes))

    def withdraw(self, request_id: str) -> None:
        """``request_id``'s replica turned it away: drop the entries its decision added that no
        later decision refreshed (module docstring)."""
        entry = self._added.pop(request_id, None)
        if entry is None:
            return
        replica, added, stamp = entry
        held = self._until.get(replica)
        if held is None:  # the replica left meanwhile, its entries with it
            return
        for h in added:
            if held.get(h) == stamp:
                del held[h]
        if not held:
            del self._until[replica]

    def forget(self, request_id: str) -> None:
        """``request_id`` ended: its entries live out their TTL."""
        self._added.pop(request_id, None)

    def expire(self, now: float) -> None:
        """Drop every entry whose time is up at ``now``."""
        queue, entries = self._queue, self._until
        while queue and queue[0][0][0] <= now:
            stamp, replica, hashes = queue.popleft()
            held = entries.get(replica)
            if held is None:
                continue
            for h in hashes:
                if held.get(h) == stamp:  # not refreshed by a later decision
                    del held[h]
            if not held:
                del entries[replica]

    def match(
        self, block_hashes: Sequence[BlockHash], replicas: Iterable[ReplicaId], now: float
    ) -> dict[ReplicaId, int]:
        """Longest live speculative prefix per replica, in blocks; no match means absent."""
        self.expire(now)
        result: dict[ReplicaId, int] = {}
        n = len(block_hashes)
        if not n or not self._until:
            return result
        first = block_hashes[0]
        for replica in replicas:
            held = self._until.get(replica)
            if held is not None and first in held:
                result[replica] = held_prefix(block_hashes, held)
        return result

    def remove_replica(self, replica: ReplicaId) -> None:
        """Forget ``replica``'s entries (it left, or its cache was reset)."""
        self._until.pop(replica, None)

    def blocks_of(self, replica: ReplicaId) -> int:
        """Live-or-not-yet-dropped entries of ``replica``, blocks."""
        return len(self._until.get(replica, ()))

    def __len__(self) -> int:
        """(replica, block) entries not yet dropped."""
        return sum(len(held) for held in self._until.values())
