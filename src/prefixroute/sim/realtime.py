"""A kernel whose clock is the wall clock (after SimPy's ``rt.py``), advanced by an asyncio task.

SimPy's ``RealtimeEnvironment`` changes only ``step()``: before it processes the next event it
sleeps until the wall clock reaches that event's time (``factor`` wall seconds per unit of
simulated time), and with ``strict`` it raises when the wall clock is already more than one
unit past it. Everything else, and every model run on it, is the simulated kernel's. So here:
:class:`RealtimeKernel` is a :class:`~prefixroute.sim.kernel.Kernel` (same heap, same ordering,
same ``at``/``after``) plus :meth:`RealtimeKernel.run_realtime`, the loop an asyncio task runs.

Why an ``await`` and not SimPy's blocking sleep: the emulated engine shares its event loop with
its HTTP handlers, which must run while a step is under way.

Two things differ from simulated time, both because the outside world is not an event:

* ``now`` is the time of the event being processed, never the wall clock's. An event that runs
  late (the loop was busy) still sees its own time, so a model's timeline stays exact and the
  events after a stall run back to back until they have caught up with the wall clock (SimPy's
  non-strict behaviour); ``strict`` raises :class:`FellBehind` instead.
* Code outside the kernel (an HTTP handler) has no event time: :meth:`RealtimeKernel.wall_now`
  is the kernel time the wall clock shows, and :meth:`RealtimeKernel.call_now` schedules a
  callback at it. ``after(0, ...)`` from outside would use the last event's time, which lags.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from prefixroute.sim.kernel import NORMAL, Callback, Kernel


class FellBehind(RuntimeError):
    """A strict real-time kernel reached an event more than one time unit late (SimPy's
    "Simulation too slow for real time")."""


class RealtimeKernel(Kernel):
    """A kernel whose time runs with the wall clock, ``factor`` wall seconds per kernel second."""

    def __init__(
        self,
        factor: float = 1.0,
        strict: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if factor <= 0:
            raise ValueError(f"the real-time factor must be positive, got {factor}")
        super().__init__()
        self.factor = factor  # wall seconds per kernel second
        self.strict = strict  # raise FellBehind when an event runs over one kernel second late
        self._clock = clock  # wall clock, seconds (the event loop's own, for the emulator)
        self._origin = clock()  # wall time of kernel time 0, seconds
        self._wake = asyncio.Event()  # set when an event is scheduled: the runner re-plans

    def wall_now(self) -> float:
        """The kernel time the wall clock shows, seconds (never before ``now``)."""
        return max(self.now, (self._clock() - self._origin) / self.factor)

    def call_now(self, callback: Callback, priority: int = NORMAL) -> None:
        """Run ``callback`` at the wall clock's present time: how code outside events enters."""
        self.at(self.wall_now(), callback, priority)

    def at(self, when: float, callback: Callback, priority: int = NORMAL) -> None:
        super().at(when, callback, priority)
        self._wake.set()  # the runner may be asleep until a later event, or until any event

    async def run_realtime(self, until: float | None = None) -> None:
        """Process each event once the wall clock reaches its time: forever (until cancelled),
        or until the clock reaches ``until``. A callback that raises ends the run with its
        exception, as :meth:`Kernel.run` does."""
        end = math.inf if until is None else until
        while True:
            when = min(self.peek(), end)
            late = self._clock() - (self._origin + when * self.factor)  # wall seconds
            if late < 0:  # -inf when there is no event and no end
                await self._nap(-late)  # until it is due, or until a new event comes in
                continue
            if self.peek() > end:
                self.now = max(self.now, end)
                return
            if self.strict and late > self.factor:
                raise FellBehind(f"the event at {when:.6f} s ran {late:.6f} wall s late")
            self.step()
            # Let the loop's other tasks (handlers, new arrivals) run between events, even when
            # the next one is already due.
            await asyncio.sleep(0)

    async def _nap(self, seconds: float) -> None:
        """Sleep ``seconds`` of wall time (forever when infinite), or until an event is added."""
        self._wake.clear()
        timer = None
        if seconds != math.inf:
            timer = asyncio.get_running_loop().call_later(seconds, self._wake.set)
        try:
            await self._wake.wait()
        finally:
            if timer is not None:
                timer.cancel()
