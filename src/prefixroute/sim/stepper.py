"""One replica's step loop on a kernel: the loop the simulator and the emulator share.

A :class:`~prefixroute.sim.replica.ReplicaModel` plans a step (``begin_step``, which says how
long it lasts) and applies it at its end (``end_step``). :class:`ReplicaStepper` turns that into
kernel events, the same on both clocks: new work kicks an idle replica into stepping at once,
each step's end is an event ``duration`` later, and a replica that still has work plans its next
step in that same event, so there is never a gap between steps. When new work arrives during a
fast-forwarded decode stretch, :meth:`ReplicaModel.interrupt` moves the step's end earlier; the
end event already on the heap cannot be taken back, so each planned end carries a generation
number and an end whose generation is no longer current is ignored.

On :class:`~prefixroute.sim.cluster.ClusterSim`'s kernel this is simulated time; on a
:class:`~prefixroute.sim.realtime.RealtimeKernel` the same events wait for the wall clock,
which is how ``prefixroute.emulate`` serves the model (SimPy's ``rt.py`` idea: one model, one
loop, two clocks).

What each driver does with a step stays with the driver, through three hooks:

* ``on_step`` gets every applied step's result: the simulator books it in its Router and
  records, the emulator wakes the requests' handlers and publishes KV events.
* ``on_plan`` (the emulator only) hears how many requests a planned step admitted, for vLLM's
  prefix-cache counters; the simulator computes its metrics from the records instead.
* ``empty_steps``: a plan of zero seconds (nothing to prefill, and no decode time) leaves the
  simulator's replica idle until its next kick, as its recorded runs were made; the emulator
  applies such a step anyway, so a replica configured with ``decode_step_s = 0`` still streams
  its tokens (one step per token, the loop yielding between them).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from prefixroute.sim.kernel import Kernel
from prefixroute.sim.replica import ReplicaModel, StepResult


class ReplicaStepper:
    """Steps one replica model on a kernel, from a kick until it runs out of work."""

    __slots__ = (
        "empty_steps",
        "generation",
        "in_step",
        "kernel",
        "model",
        "on_plan",
        "on_step",
        "stepping",
    )

    def __init__(
        self,
        kernel: Kernel,
        model: ReplicaModel,
        on_step: Callable[[StepResult], None],
        *,
        on_plan: Callable[[int], None] | None = None,
        empty_steps: bool = False,
    ) -> None:
        self.kernel = kernel
        self.model = model
        self.on_step = on_step  # each applied step's result, at the step's end time
        self.on_plan = on_plan  # requests each planned step admitted, requests
        self.empty_steps = empty_steps  # apply a zero-second plan instead of going idle
        self.stepping = False  # a step is planned, or about to be
        # Between begin_step and end_step: the model must not be changed (abort) until it ends.
        self.in_step = False
        self.generation = 0  # bumped when the planned step's end moves; stale ends are ignored

    def kick(self) -> None:
        """New work for the model: start stepping, or cut a long decode stretch short."""
        if not self.stepping:
            self.stepping = True
            self.kernel.after(0.0, self._begin)
            return
        new_end = self.model.interrupt(self.kernel.now)
        if new_end is not None:
            self.generation += 1
            self.kernel.at(new_end, partial(self._end, self.generation))

    def _begin(self) -> None:
        model = self.model
        if not model.has_work():  # everything it had was aborted or moved since the kick
            self.stepping = False
            return
        if self.on_plan is None:
            duration = model.begin_step(self.kernel.now)
        else:
            waiting = model.num_waiting
            duration = model.begin_step(self.kernel.now)
            self.on_plan(waiting - model.num_waiting)
        if duration <= 0.0 and not self.empty_steps:
            self.stepping = False
            return
        self.in_step = True
        self.kernel.after(duration, partial(self._end, self.generation))

    def _end(self, generation: int) -> None:
        if generation != self.generation:
            return  # this step was cut short; its new end is scheduled
        self.in_step = False
        self.on_step(self.model.end_step(self.kernel.now))
        if self.model.has_work():
            self._begin()
        else:
            self.stepping = False
