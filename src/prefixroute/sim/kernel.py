"""A discrete-event kernel small enough to read in one sitting (after SimPy's ``core.py``).

The kernel owns only the clock and a heap of ``(time, priority, sequence, callback)``. The
sequence number only goes up, so events at the same time and priority run first-in first-out and
runs are deterministic; callbacks are never compared with each other. A callback that raises
stops the run with its exception: errors are never swallowed. ``sim/realtime.py`` runs this
same kernel on the wall clock, for the emulator (SimPy's ``rt.py``).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

Callback = Callable[[], None]

URGENT = 0  # runs before ARRIVAL and NORMAL events scheduled for the same instant
ARRIVAL = 1  # runs before NORMAL events of the same instant, as if scheduled first
NORMAL = 2


class Kernel:
    """The simulated clock (seconds) and its event heap."""

    def __init__(self) -> None:
        self.now = 0.0  # seconds since the start of the run
        self._heap: list[tuple[float, int, int, Callback]] = []
        self._seq = itertools.count()
        self.processed = 0  # events run so far

    def at(self, when: float, callback: Callback, priority: int = NORMAL) -> None:
        """Run ``callback`` at absolute time ``when`` (never in the past)."""
        if when < self.now:
            raise ValueError(f"cannot schedule at {when} before now ({self.now})")
        heapq.heappush(self._heap, (when, priority, next(self._seq), callback))

    def after(self, delay: float, callback: Callback, priority: int = NORMAL) -> None:
        """Run ``callback`` ``delay`` seconds from now."""
        self.at(self.now + delay, callback, priority)

    def peek(self) -> float:
        """Time of the next event, or infinity when none is scheduled."""
        return self._heap[0][0] if self._heap else float("inf")

    def step(self) -> None:
        """Process the next event. Raises IndexError when there is none."""
        when, _, _, callback = heapq.heappop(self._heap)
        self.now = when
        self.processed += 1
        callback()

    def run(self, until: float | None = None) -> None:
        """Process events until none is left, or until the clock would pass ``until``."""
        while self._heap and (until is None or self._heap[0][0] <= until):
            self.step()
        if until is not None and until > self.now:
            self.now = until
