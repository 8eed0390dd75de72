"""consistent_hash: session affinity on a hash ring with virtual nodes.

The key is the session id when the request has one, else the first block of the prompt (so a
conversation without ids still sticks while its first block is stable). Adding or removing a
replica moves only the keys of its own arcs, as in Envoy's ring-hash and DualMap's rings.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import ClassVar

import xxhash

from prefixroute.core.errors import ConfigError
from prefixroute.core.policies._base import RoutingContext
from prefixroute.core.types import Decision, DecisionReason, ReplicaId


def _h(key: str) -> int:
    return xxhash.xxh3_64_intdigest(key.encode())


@dataclass(frozen=True, slots=True)
class ConsistentHashConfig:
    virtual_nodes: int = 100  # ring points per replica (Envoy's ring-hash default minimum is 1024)

    def __post_init__(self) -> None:
        if self.virtual_nodes < 1:
            raise ConfigError("virtual_nodes must be at least 1")


@dataclass(slots=True)
class ConsistentHash:
    name: ClassVar[str] = "consistent_hash"
    config: ConsistentHashConfig = field(default_factory=ConsistentHashConfig)
    _ring_for: tuple[ReplicaId, ...] = ()
    _points: list[int] = field(default_factory=list)
    _owners: list[ReplicaId] = field(default_factory=list)

    def _ring(self, candidates: tuple[ReplicaId, ...]) -> None:
        points = sorted(
            (_h(f"{r}#{v}"), r)
            for r in candidates
            for v in range(self.config.virtual_nodes)
        )
        self._points = [p for p, _ in points]
        self._owners = [r for _, r in points]
        self._ring_for = candidates

    def decide(self, ctx: RoutingContext) -> Decision:
        candidates = tuple(ctx.candidates)
        if candidates != self._ring_for:
            self._ring(candidates)
        req = ctx.request
        if req.session_id is not None:
            key = _h(req.session_id)
        elif req.block_hashes:
            key = int(req.block_hashes[0])
        else:
            key = _h(req.request_id)
        i = bisect.bisect_left(self._points, key) % len(self._points)
        return ctx.decide(self._owners[i], DecisionReason.SESSION_HASH)
