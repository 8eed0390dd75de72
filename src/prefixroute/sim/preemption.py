"""vLLM's preemption, for the replica model (``ReplicaConfig.preempt``; sim/replica.py).

vLLM v1 takes a request's KV blocks as its tokens need them, not all at admission, so a batch
can outgrow the cache as it decodes. Then the scheduler preempts the newest running request
(``running[-1]`` under FCFS): its blocks are freed, its computed tokens reset to 0, and it goes
back to the head of the waiting queue, to recompute its prompt and the output so far when there
is room (``Scheduler._preempt_request``; counted in ``vllm:num_preemptions``). That work is
invisible from outside: no router dispatched it, and the request's stream just pauses.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from prefixroute.sim.engine_request import EngineRequest, StepResult
from prefixroute.sim.kv_cache import BlockPool

if TYPE_CHECKING:
    from prefixroute.sim.replica import ReplicaConfig


class Preemption:
    """The replica model's preemption steps; the model supplies the state they work on."""

    config: ReplicaConfig
    cache: BlockPool
    waiting: deque[EngineRequest]
    running: list[EngineRequest]
    _prefilling: list[EngineRequest]
    _decoding: dict[EngineRequest, None]
    _step_no: int
    preemptions: int
    report_decodes: bool

    def _release(self, req: EngineRequest) -> None:  # the model's: blocks back to the cache
        raise NotImplementedError

    def _start_decoding(self, req: EngineRequest) -> None:  # the model's
        raise NotImplementedError

    def _grow(self) -> bool:
        """Give each decoding request, in admission order, a block for this step's token where
        its last is full; where none is free, preempt the newest running request. Returns
        whether any was preempted."""
        bs, running, i = self.config.block_size, self.running, 0
        preempted = self.preemptions
        while i < len(running):
            req = running[i]
            i += 1
            if req not in self._decoding:
                continue
            # This step writes the KV of its latest token: prompt + tokens generated so far.
            needed = -(-(req._prompt + self._generated(req)) // bs)
            while self._held(req) < needed and req in self._decoding:
                if self.cache.available():
                    self.cache.take(1)
                    req._anonymous += 1
                else:
                    self._preempt(running[-1])
        return self.preemptions > preempted

    def _preempt(self, req: EngineRequest) -> None:
        """Back to the head of the queue, to recompute its prompt and output so far."""
        self.running.remove(req)
        if req in self._decoding:
            del self._decoding[req]
            req.generated = self._generated(req)
        else:
            self._prefilling.remove(req)
        self._release(req)
        req._target = req._prompt + (req.generated if req.first_token_s is not None else 0)
        req.computed = req._registered = 0
        req.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(req)

    def _resumed(self, req: EngineRequest, step_no: int, result: StepResult) -> None:
        """A preempted request recomputed what it had: this step produced its next token."""
        req.generated += 1
        req._first_step = step_no - req.generated + 1  # as if it had never stopped
        req._finish_step = req._first_step + req.output_tokens - 1
        self._prefilling.remove(req)
        if self.report_decodes:
            result.decoded.append(req)
        if req.generated >= req.output_tokens:
            result.finished.append(req)
        else:
            self._start_decoding(req)

    def _steps_in_blocks(self) -> int:
        """Decode steps every decoding request can take in the blocks it holds (>= 1 after
        :meth:`_grow`)."""
        bs = self.config.block_size
        return min(self._held(r) * bs - r._prompt - self._generated(r) + 1 for r in self._decoding)

    def _generated(self, req: EngineRequest) -> int:
        """Tokens a decoding request has produced by the end of the last step."""
        return self._step_no - req._first_step + 1

    @staticmethod
    def _held(req: EngineRequest) -> int:
        """KV blocks a request holds."""
        return len(req._cached) + req._anonymous
