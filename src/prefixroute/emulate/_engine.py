"""The simulator's replica model on the wall clock: one asyncio task runs its step loop.

This is SimPy's ``rt.py`` idea: the model is the same one the simulator drives; only the way time
advances changes. The loop plans a batch (``begin_step``), sleeps for its duration (times
``time_scale``), applies it (``end_step``) and wakes the handlers of the requests it touched.

Each request gets a :class:`Generation` whose queue carries how many output tokens exist so far;
``FINISHED`` ends it and ``ABORTED`` means the engine stopped under it. A handler that goes away
(client disconnect, cancellation) calls :meth:`EngineLoop.release`, which aborts the request in
the model. An abort never touches the model in the middle of a step: the planned batch still
holds the request, so the abort waits until ``end_step`` has applied the batch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import xxhash

from prefixroute._tasks import cancel_and_wait
from prefixroute.core import ConfigError, PrefixrouteError
from prefixroute.sim.fleet import SpeedChange
from prefixroute.sim.replica import EngineRequest, ReplicaModel, StepResult

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
        if time_scale <= 0:
            raise ConfigError(f"time scale must be positive, got {time_scale}")
        self.model = model
        self.time_scale = time_scale  # wall seconds per model second
        self.after_step = after_step  # called after each applied step (KV events go out here)
        self.speed_changes = tuple(speed_changes)  # applied at model times after start()
        self._timers: list[asyncio.TimerHandle] = []
        self.prefix_queries = 0  # prompt tokens looked up at admission, tokens
        self.prefix_hits = 0  # of those, tokens found cached, tokens
        self.prompt_tokens = 0  # prompt tokens of admitted requests, tokens
        self.generation_tokens = 0  # output tokens produced, tokens
        self._gens: dict[str, Generation] = {}
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._in_step = False
        self._deferred_aborts: list[str] = []
        self._failed: BaseException | None = None

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._run(), name="engine-loop")
            # The model reads its speeds when it plans a step: a change applies from the next.
            self._timers = [
                loop.call_later(
                    ch.at_s * self.time_scale,
                    self.model.set_speed,
                    ch.prefill_tokens_per_s,
                    ch.decode_step_s,
                )
                for ch in self.speed_changes
            ]

    async def stop(self) -> None:
        """Stop stepping; every unfinished request is told ABORTED."""
        for timer in self._timers:
            timer.cancel()
        self._timers = []
        task, self._task = self._task, None
        await cancel_and_wait(task)
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
        if not self.running:
            raise EngineStopped("the engine is not running")
        loop = asyncio.get_running_loop()
        req = EngineRequest(f"req-{next(self._ids)}", tokens, output_tokens, self._now(loop))
        if cache_salt is not None or adapter is not None:
            hasher = self.model.hasher
            if adapter is not None:
                hasher = hasher.for_adapter(adapter)
                req.lora_name = adapter
            if cache_salt is not None:
                salt = cache_salt.encode("utf-8", "surrogatepass")
                seed = xxhash.xxh3_64_intdigest(salt, hasher.seed)
                hasher = dataclasses.replace(hasher, seed=seed)
            req.block_hashes = hasher.hash_tokens(tokens)
        self.model.submit(req)
        gen = Generation(req)
        self._gens[req.request_id] = gen
        self._wake.set()
        return gen

    def release(self, gen: Generation) -> None:
        """The handler is done with ``gen``; abort it in the model if it has not finished."""
        if gen.done:
            return
        gen.done = True
        rid = gen.request.request_id
        self._gens.pop(rid, None)
        if self._in_step:
            self._deferred_aborts.append(rid)
        else:
            self.model.abort(rid)

    # --- the step loop --------------------------------------------------------------------
    def _now(self, loop: asyncio.AbstractEventLoop) -> float:
        """Model time, seconds: wall time divided by the time scale."""
        return loop.time() / self.time_scale

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        model = self.model
        try:
            while True:
                if not model.has_work():
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                waiting_before = model.num_waiting
                self._in_step = True
                try:
                    duration = model.begin_step(self._now(loop))
                    self._count_admissions(waiting_before - model.num_waiting)
                    # A zero-length step (nothing to prefill, zero decode time) still yields, so
                    # handlers and new arrivals run between steps.
                    await asyncio.sleep(duration * self.time_scale)
                    result = model.end_step(self._now(loop))
                finally:
                    self._in_step = False
                    self._apply_deferred_aborts()
                if self.after_step is not None:
                    self.after_step()  # before the handlers hear of it, as an engine publishes
                self._publish(result)
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
            gen = gens.pop(req.request_id, None)
            if gen is not None:
                gen.done = True
                gen.queue.put_nowait(FINISHED)

    def _abort_all(self) -> None:
        gens, self._gens = self._gens, {}
        for gen in gens.values():
            gen.done = True
            gen.queue.put_nowait(ABORTED)
