"""What the requests ahead really computed, for the queue a first token waited behind.

A first token's observation (:mod:`prefixroute.core.speed`) counts the prefill work queued ahead
of its request at dispatch: the *predicted* uncached tokens of the requests still prefilling
then. When a replica holds less than the index says (it evicted what approximate mode cannot
see, its cache is smaller than configured, its tokenizer cuts the prompt otherwise), those
requests computed more than predicted, and every first token behind them looked slow for the
work counted: the rate came out low. On a replica written by others, under SGLang's
cache_aware policy piling 239 requests onto one replica, actual uncached tokens were 24% above
the predictions, and that replica was learned at 2,023-2,110 tokens/s where it did 2,500.

Each replica numbers its dispatches. A request ``Y`` was ahead of request ``X`` exactly when
``Y`` was dispatched before ``X`` and got its first token after ``X``'s dispatch, that is when
``Y.seq < X.seq <= Y.through`` (``through``: the replica's dispatch count at ``Y``'s first token).
When ``Y``'s usage says it computed ``delta`` tokens more (or fewer) than predicted, that
correction is kept here (:meth:`QueueFixes.add`) for the observations not taken yet
(:meth:`QueueFixes.ahead_of`), and the speed model applies it to those already in its window
(:meth:`ReplicaSpeed.correct_queue`). Only the last ``KEEP`` corrections are kept: an
observation is taken when its request ends, seconds after those ahead of it reported.

**Decode phases** count the same predictions: the prefill that shared a request's decode steps
is the uncached tokens of the requests whose first tokens came back meanwhile. Counted as
predicted, a replica that evicted what the index still claims did more prefill than counted in
every phase, its decode steps looked slow for the work, and the joint fit took the rate up to
explain them (in the simulator, on the synthetic Mooncake trace at its capacity, a 10,000
tokens/s replica was learned at 49,986). So each replica also numbers its first tokens: a
request ``Y`` was prefilled during ``X``'s decode phase exactly when ``X.mark < Y.no <=`` the
count at ``X``'s end, and ``Y``'s correction is kept (:class:`PhaseFixes`) for the phases not
taken yet and applied to those in the window (:meth:`ReplicaSpeed.correct_decode`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

KEEP = 64  # corrections kept per replica for observations still to come


@dataclass(slots=True)
class QueueFixes:
    """One replica's dispatch count and its recent queue corrections (module docstring)."""

    dispatches: int = 0  # requests dispatched here since registration
    _fixes: deque[tuple[int, int, float]] = field(default_factory=lambda: deque(maxlen=KEEP))

    def dispatched(self) -> int:
        """Count a dispatch; returns its number (from 1)."""
        self.dispatches += 1
        return self.dispatches

    def add(self, seq: int, through: int, tokens: float) -> None:
        """The request dispatched ``seq``-th, which got its first token when ``through``
        requests had been dispatched, computed ``tokens`` more than predicted (negative:
        fewer): so did the queue of every request dispatched meanwhile."""
        self._fixes.append((seq, through, tokens))

    def ahead_of(self, seq: int) -> float:
        """The corrections known for the queue of the request dispatched ``seq``-th, tokens."""
        return sum(t for lo, hi, t in self._fixes if lo < seq <= hi)


@dataclass(slots=True)
class PhaseFixes:
    """One replica's first-token count and its recent corrections of what requests prefilled
    (module docstring: decode phases)."""

    prefills: int = 0  # first tokens (seen or guessed) since registration
    _fixes: deque[tuple[int, float, float]] = field(default_factory=lambda: deque(maxlen=KEEP))

    def prefilled(self) -> int:
        """Count a first token; returns its number (from 1)."""
        self.prefills += 1
        return self.prefills

    def add(self, no: int, tokens: float, context: float) -> None:
        """The request whose first token was the ``no``-th computed ``tokens`` more than
        predicted (negative: fewer), with ``context`` more context work."""
        self._fixes.append((no, tokens, context))

    def within(self, mark: int) -> tuple[float, float]:
        """The corrections known for the first tokens after the ``mark``-th, to now: (tokens,
        context work)."""
        tokens = context = 0.0
        for no, t, c in self._fixes:
            if no > mark:
                tokens += t
                context += c
        return tokens, context
