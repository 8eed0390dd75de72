"""What a workload is: sessions of turns, with the timing rules the simulator and bench share.

A *session* is a conversation (or a single request: a one-turn session). Its first turn arrives at
``start_s``; each later turn arrives ``think_s`` after the previous turn *completes* (closed loop
inside a session, open loop across sessions), which is how multi-turn chat behaves: the user
cannot send turn 3 before reading answer 2.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

TokenArray = npt.NDArray[np.uint32]


@dataclass(frozen=True, slots=True)
class Turn:
    tokens: TokenArray  # the whole prompt of this turn (history included), token ids
    output_tokens: int  # tokens the replica generates, tokens
    think_s: float = 0.0  # delay after the previous turn completes, seconds (first turn: unused)
    text: str | None = None  # the prompt as text, when the workload has real text


@dataclass(frozen=True, slots=True)
class Session:
    session_id: str
    start_s: float  # arrival of the first turn, seconds from the start of the run
    turns: list[Turn]
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class ClusterEvent:
    """A replica joining (cold, empty cache) or leaving at a point in time."""

    at_s: float  # seconds from the start of the run
    action: str  # "add" or "remove"
    replica: str  # the replica's id, e.g. "r4"


@dataclass(slots=True)
class Workload:
    """A named, fully generated workload."""

    name: str
    sessions: list[Session]
    block_size: int = 16  # default KV block size for this workload, tokens
    description: str = ""
    cluster_events: list[ClusterEvent] = field(default_factory=list)

    @property
    def num_requests(self) -> int:
        return sum(len(s.turns) for s in self.sessions)

    def turns(self) -> Iterator[Turn]:
        for s in self.sessions:
            yield from s.turns
