"""What a workload is: sessions of turns, with the timing rules the simulator and bench share.

A *session* is a conversation (or a single request: a one-turn session). Its first turn arrives at
``start_s``; each later turn arrives ``think_s`` after the previous turn *completes* (closed loop
inside a session, open loop across sessions), which is how multi-turn chat behaves: the user
cannot send turn 3 before reading answer 2.

A workload's sessions are a list, or a :class:`SessionSource` that builds each session when it
is read, in start order. A million-request trace replay keeps its prompts that way: the simulator
reads sessions as their arrival comes due, and a session's tokens are garbage once it is done.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import overload

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


class SessionSource(Sequence[Session]):
    """Sessions built on demand by ``build(i)``, ``i`` in ``range(count)``, in start order.

    Nothing is cached: each read builds the session again (the same one: ``build`` must be a
    pure function of ``i``), so memory holds only the sessions a reader keeps.
    """

    def __init__(
        self, count: int, build: Callable[[int], Session], requests: int, chunk: int = 1024
    ) -> None:
        self._count = count
        self._build = build
        self.requests = requests  # turns over all sessions, known without building them
        self.chunk = chunk  # sessions built together when iterating

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, i: int) -> Session: ...
    @overload
    def __getitem__(self, i: slice) -> list[Session]: ...
    def __getitem__(self, i: int | slice) -> Session | list[Session]:
        if isinstance(i, slice):
            return [self._build(k) for k in range(*i.indices(self._count))]
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError(f"session {i} of {self._count}")
        return self._build(i)

    def __iter__(self) -> Iterator[Session]:
        # Built a chunk at a time: interleaving one build per arrival with the simulation made
        # both slower (each evicts the other's working set from the CPU caches).
        build, chunk = self._build, self.chunk
        for start in range(0, self._count, chunk):
            yield from [build(i) for i in range(start, min(start + chunk, self._count))]


@dataclass(slots=True)
class Workload:
    """A named workload: its sessions, generated up front or on demand (:class:`SessionSource`)."""

    name: str
    sessions: Sequence[Session]
    block_size: int = 16  # default KV block size for this workload, tokens
    description: str = ""
    cluster_events: list[ClusterEvent] = field(default_factory=list)

    @property
    def num_requests(self) -> int:
        if isinstance(self.sessions, SessionSource):
            return self.sessions.requests
        return sum(len(s.turns) for s in self.sessions)

    def by_start(self) -> Iterator[Session]:
        """Sessions in order of their first arrival (ties in list order); a SessionSource is
        streamed, since it builds its sessions in that order."""
        if isinstance(self.sessions, SessionSource):
            return iter(self.sessions)
        return iter(sorted(self.sessions, key=attrgetter("start_s")))

    def turns(self) -> Iterator[Turn]:
        for s in self.sessions:
            yield from s.turns
