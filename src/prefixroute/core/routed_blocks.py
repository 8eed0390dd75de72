"""The blocks each routed request added to the index, until the request ends.

In approximate mode a decision inserts the request's chain for the chosen replica at once,
before the replica has seen the request. A replica that then turns it away (its queue is full:
a 429; a 4xx; a refused connection) never computes those blocks, yet the index would go on
saying it holds them until some later request's usage proved otherwise, sending the prefix's
next requests to a replica that must compute it all. So the router keeps, per request in
flight, which blocks its insert added (those the replica did not already hold) and a mark of
the replica's entries just after, and :meth:`RoutedBlocks.withdraw` takes them back out when
the gateway says the replica did not take the request. A request that ends any other way is
forgotten (:meth:`RoutedBlocks.forget`): its blocks were computed, or may have been.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefixroute.core._lru import LRU
from prefixroute.core.hashing import BlockHash
from prefixroute.core.index import PrefixIndex
from prefixroute.core.types import ReplicaId

Added = tuple[ReplicaId, Sequence[BlockHash], tuple[LRU, int]]  # replica, blocks added, mark


class RoutedBlocks:
    """Request id -> the blocks its decision added to the index, while it is in flight."""

    def __init__(self) -> None:
        self._added: dict[str, Added] = {}
        self.withdrawn = 0  # blocks taken back out, since creation

    def insert(
        self, index: PrefixIndex, request_id: str, replica: ReplicaId, chain: Sequence[BlockHash]
    ) -> None:
        """Insert ``chain`` (a prompt's, from its first block) for ``replica`` and remember
        what that added (those not held before: nothing, when all were)."""
        held = index.match(chain, (replica,)).get(replica, 0)
        index.insert(replica, chain)
        self._added[request_id] = (replica, chain[held:], index.mark(replica))

    def withdraw(self, index: PrefixIndex, request_id: str) -> None:
        """The replica did not take ``request_id``: take its added blocks back out of the index
        (see :meth:`PrefixIndex.withdraw` for when nothing is taken)."""
        added = self._added.pop(request_id, None)
        if added is not None:
            self.withdrawn += index.withdraw(*added)

    def forget(self, request_id: str) -> None:
        """``request_id`` ended: its blocks stay."""
        self._added.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._added)
