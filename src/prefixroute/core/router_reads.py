"""The Router's reads, for metrics, dashboards and reports: nothing here changes what it believes.

Code outside ``core`` reads a router's index, load view, speculative entries, token counts and
learned capacities through these methods only (``tests/test_router_ownership.py``); every change
goes through :class:`~prefixroute.core.router.Router`'s own methods. They live apart from the
Router's so that its file holds the changes and nothing else.
"""

from __future__ import annotations

from prefixroute.core.index import PrefixIndex
from prefixroute.core.index_capacity import IndexCapacity, ReplicaCapacity
from prefixroute.core.load import LoadTracker
from prefixroute.core.replica_load import ReplicaLoad
from prefixroute.core.routed_blocks import RoutedBlocks
from prefixroute.core.speculative import SpeculativeEntries
from prefixroute.core.token_count import CharsPerToken, TokenCounts
from prefixroute.core.types import ReplicaId


class RouterReads:
    """What a :class:`~prefixroute.core.router.Router` lets others read of its state."""

    index: PrefixIndex
    loads: LoadTracker
    speculative: SpeculativeEntries | None
    capacity: IndexCapacity
    tokens: TokenCounts
    routed: RoutedBlocks

    def replica_load(self, replica: ReplicaId) -> ReplicaLoad:
        """``replica``'s load and learned speed as the router sees them (a replica never seen
        gets an empty entry). To read: every change goes through the methods above."""
        return self.loads.get(replica)

    def queued_prefill_s(self, replica: ReplicaId, now: float) -> float:
        """How long a request sent to ``replica`` at ``now`` waits before its own prefill
        starts, at the replica's learned speed, seconds."""
        return self.loads.get(replica).queued_prefill_s(now)

    def kv_block_size(self) -> int:
        """The engines' KV block, tokens: the smallest step in which a cached prefix is
        counted, by the router's predictions and by the engines alike."""
        return self.loads.block_size

    def indexed_blocks(self, replica: ReplicaId) -> int:
        """Blocks the index says ``replica`` holds."""
        return self.index.blocks_of(replica)

    def index_blocks(self) -> int:
        """Distinct blocks in the index (one held by three replicas counts once); O(entries)."""
        return len(self.index)

    def index_entries(self) -> int:
        """(replica, block) entries in the index."""
        return self.index.entries

    def index_evictions(self) -> int:
        """Index entries dropped by a replica's capacity since the router was made."""
        return self.index.evictions

    def index_withdrawals(self) -> int:
        """Index entries a decision added and took back, its replica having turned the request
        away (:meth:`~prefixroute.core.router.Router.withdraw`), since the router was made."""
        return self.routed.withdrawn

    def speculative_entries(self) -> int | None:
        """(replica, block) speculative entries not yet dropped; None without them."""
        return len(self.speculative) if self.speculative is not None else None

    def index_size(self, replica: ReplicaId) -> int | None:
        """``replica``'s index capacity in blocks now (None: unbounded, or not registered)."""
        return self.index.capacity_of(replica)

    def index_capacity(self, replica: ReplicaId) -> ReplicaCapacity | None:
        """How much ``replica`` keeps, as learned (None: not learning, or unbounded)."""
        return self.capacity.get(replica)

    def chars_per_token(self) -> dict[str | None, CharsPerToken]:
        """Each model's characters per token as learned from usage (None: no model named)."""
        return self.tokens.models()

    def chars_per_token_of(self, model: str | None) -> float:
        """``model``'s characters per token now: learned, or the prior for a model not seen."""
        return self.tokens.chars_per_token(model)

    def knows_chars_per_token(self, model: str | None) -> bool:
        """Whether anything has told ``model``'s characters per token yet (always, with
        learning off)."""
        return self.tokens.knows(model)
