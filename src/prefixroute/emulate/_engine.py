"""An emulated vLLM engine: the simulator's replica model and step loop, on a real-time kernel.

This is SimPy's ``rt.py`` idea: the model is the one the simulator drives, and so is the loop
that steps it (:class:`~prefixroute.sim.stepper.ReplicaStepper`: plan a batch with
``begin_step``, schedule its end ``duration`` later, apply it with ``end_step``, plan the next).
Only the kernel differs: a :class:`~prefixroute.sim.realtime.RealtimeKernel`, whose clock is the
wall clock divided by ``time_scale``, and which one asyncio task advances by sleeping until each
event is due. Sharing the loop means a fix or a rule in how a replica steps (when it goes idle,
how a kick starts it) holds for both clocks, and the emulator's steps are the simulator's events.

Model time is the kernel's: it starts at 0 when :meth:`EngineLoop.start` runs, and a step ends
exactly ``duration`` after it began even when the event loop wakes late (steps after a stall
then run back to back until they have caught up; the kernel is not ``strict``, since a loaded
machine must slow the emulator, not stop it). A request arrives at the wall clock's present
model time and kicks the stepper through an event at that time; speed changes are events at
their model times, as in the simulator.

What stays here is what only a serving engine does: counting prefix-cache queries at admission
(the stepper's ``on_plan``), holding aborts back while a step is planned, waking the handlers and
publishing KV events after each step (``on_step``), and applying a zero-second step rather than
idling (``empty_steps``: a replica with ``decode_step_s = 0`` must still stream its tokens; the
simulator idles there, as its recorded runs were made).

Each request gets a :class:`Generation` whose queue carries how many output tokens exist so far;
``FINISHED`` ends it and ``ABORTED`` means the engine stopped under it. A handler that goes away
(client disconnect, cancellation) calls :meth:`EngineLoop.release`, which aborts the request in
the model. An abort never touches the model in the middle of a step: the planned batch still
holds the request, so the abort waits until ``end_step`` has applied the batch.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

from prefixroute._tasks import cancel_and_wait
from prefixroute.core import ConfigError, PrefixrouteError
from prefixroute.sim.fleet import SpeedChange
from prefixroute.sim.kernel import URGENT
from prefixroute.sim.realtime import RealtimeKernel
from prefixroute.sim.replica import EngineRequest, ReplicaModel, StepResult
from prefixroute.sim.stepper import ReplicaStepper

log = logging.getLogger(__name__)

FINISHED = -1  # queue item: the request generated all its tokens
ABORTED = -2  # queue item: the engine stopped before the request finished


class EngineStopped(PrefixrouteError):
    """The emulated engine is not running (stopped, or its step loop failed)."""


@dataclass(slots=True, eq=False)
class Generation:
    """One request's progress, as its HTTP handler sees it."""

    request: EngineRequest
    # Output tokens generated so far (tokens), then FINISHED or ABORTED.
    queue: asyncio.Queue[int] = field(default_factory=asyncio.Queue)
    done: bool = False  # finished or aborted

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens found in the prefix cache at admission, tokens."""
        return self.request.cached_tokens


class EngineLoop:
    """Drives one :class:`ReplicaModel` in real time."""

    def __init__(
        self,
        model: ReplicaModel,
        time_scale: float = 1.0,
        after_step: Callable[[], None] | None = None,
        speed_changes: Sequence[SpeedChange] = (),
    ) -> None:
        if not 0 < time_scale < math.inf:
            raise ConfigError(f"time scale must be positive and finite, got {time_scale}")
        self.model = model
        self.time_scale = time_scale  # wall seconds per model second
        self.after_step = after_step  # called after each applied step (KV events go out here)
        self.speed_changes = tuple(speed_changes)  # applied at model times after start()
        self.prefix_queries = 0  # prompt tokens looked up at admission, tokens
        self.prefix_hits = 0  # of those, tokens found cached, tokens
        self.prompt_tokens = 0  # prompt tokens of admitted requests, tokens
        self.generation_tokens = 0  # output tokens produced, tokens
        # vLLM's per-request timings, summed over finished requests (its histograms' _sum and
        # _count): scheduled -> first token, and the uncached prompt tokens computed.
        self.finished_prefills = 0  # requests finished with a first token, requests
        self.prefill_seconds = 0.0  # their time from admission to first token, wall seconds
        self.prefill_computed_tokens = 0  # their prompt tokens less cached ones, tokens
        self._gens: dict[str, Generation] = {}
        self._ids = itertools.count()
        self._kernel: RealtimeKernel | None = None  # made by start(): model time 0 is then
        self._stepper: ReplicaStepper | None = None
        self._task: asyncio.Task[None] | None = None
        self._deferred_aborts: list[str] = []
        self._failed: BaseException | None = None

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is not None:
            return
        loop = asyncio.get_running_loop()
        kernel = self._kernel = RealtimeKernel(self.time_scale, clock=loop.time)
        self._stepper = ReplicaStepper(
            kernel, self.model, self._on_step, on_plan=self._count_admissions, empty_steps=True
        )
        # The model reads its speeds when it plans a step: a change applies from the next one.
        # URGENT, as in the simulator: a change due at a step's end applies to the next step.
        for ch in self.speed_changes:
            change = partial(self.model.set_speed, ch.prefill_tokens_per_s, ch.decode_step_s)
            kernel.at(ch.at_s, change, URGENT)
        self._task = loop.create_task(self._run(kernel), name="engine-loop")

    async def stop(self) -> None:
        """Stop stepping; every unfinished request is told ABORTED."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        self._kernel = self._stepper = None  # no step will end now: release() aborts at once
        self._apply_deferred_aborts()
        self._abort_all()

    @property
    def running(self) -> bool:
        return self._task is not None and self._failed is None

    # --- requests -------------------------------------------------------------------------
    def submit(
        self,
        tokens: Sequence[int],
        output_tokens: int,
        cache_salt: str | None = None,
        adapter: str | None = None,
    ) -> Generation:
        """Queue a prompt; raises RequestTooLarge / ConfigError from the model, EngineStopped.

        ``cache_salt`` salts the prompt's block hashes as vLLM does (the salt enters the first
        block's hash, and the chain carries it to every later block): prompts with different
        salts, or one salted and one not, never share a cached block. ``adapter`` (a LoRA
        adapter's name) keys every block the same way, as vLLM hashes ``lora_name`` into each:
        the base model and each adapter never share a cached block.
        """
        kernel, stepper = self._kernel, self._stepper
        if not self.running or kernel is None or stepper is None:
            raise EngineStopped("the engine is not running")
        req = EngineRequest(f"req-{next(self._ids)}", tokens, output_tokens, kernel.wall_now())
        if cache_salt is not None or adapter is not None:
            hasher = self.model.hasher
            if adapter is not None:
                hasher = hasher.for_adapter(adapter)
                req.lora_name = adapter
            if cache_salt is not None:
                hasher = hasher.salted(cache_salt)
            req.block_hashes = hasher.hash_tokens(tokens)
        self.model.submit(req)  # synchronous, so RequestTooLarge reaches the handler
        gen = Generation(req)
        self._gens[req.request_id] = gen
        kernel.call_now(stepper.kick)  # an event at the wall clock's time, not the last event's
        return gen

    def release(self, gen: Generation) -> None:
        """The handler is done with ``gen``; abort it in the model if it has not finished."""
        if gen.done:
            return
        gen.done = True
        rid = gen.request.request_id
        self._gens.pop(rid, None)
        if self._stepper is not None and self._stepper.in_step:
            self._deferred_aborts.append(rid)
        else:
            self.model.abort(rid)

    # --- the kernel's callbacks -----------------------------------------------------------
    async def _run(self, kernel: RealtimeKernel) -> None:
        try:
            await kernel.run_realtime()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a model bug must not leave handlers waiting forever
            log.exception("emulated engine step loop failed")
            self._failed = exc
            self._abort_all()

    def _count_admissions(self, admitted: int) -> None:
        if admitted <= 0:
            return
        for req in self.model.running[-admitted:]:
            self.prefix_queries += req.prompt_tokens
            self.prefix_hits += req.cached_tokens
            self.prompt_tokens += req.prompt_tokens

    def _on_step(self, result: StepResult) -> None:
        """A step was applied: aborts held back during it, then KV events, then handlers."""
        self._apply_deferred_aborts()
        if self.after_step is not None:
            self.after_step()  # before the handlers hear of it, as an engine publishes
        self._publish(result)

    def _apply_deferred_aborts(self) -> None:
        aborts, self._deferred_aborts = self._deferred_aborts, []
        for rid in aborts:
            self.model.abort(rid)

    def _publish(self, result: StepResult) -> None:
        gens = self._gens
        self.generation_tokens += len(result.first_tokens) + len(result.decoded)
        for req in result.first_tokens:
            gen = gens.get(req.request_id)
            if gen is not None:
                gen.queue.put_nowait(req.generated)
        for req in result.decoded:
            gen = gens.get(req.request_id)
            if gen is not None:
                gen.queue.put_nowait(req.generated)
        for req in result.finished:
            if req.start_s is not None and req.first_token_s is not None:
                self.finished_prefills += 1
                self.prefill_seconds += (req.first_token_s - req.start_s) * self.time_scale
                self.prefill_computed_tokens += req.prompt_tokens - req.cached_tokens
            gen = gens.pop(req.request_id, None)
            if gen is not None:
                gen.done = True
                gen.queue.put_nowait(FINISHED)

    def _abort_all(self) -> None:
        gens, self._gens = self._gens, {}
        for gen in gens.values():
            gen.done = True
            gen.queue.put_nowait(ABORTED)
