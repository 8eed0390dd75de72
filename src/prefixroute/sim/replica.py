"""The replica model: a continuous-batching engine with a prefix cache, independent of any clock.

One model serves two clocks (SimPy's ``rt.py`` idea): the simulator jumps its kernel by each
step's duration, the emulated replica awaits it on the wall clock. The driver loop is::

    while model.has_work():
        duration = model.begin_step(now)    # plan one batch; how long it takes, seconds
        ... advance the clock by duration ...
        result = model.end_step(now)        # apply it: first tokens, decoded tokens, finished

Engine rules modelled (vLLM v1 scheduler, simplified):

* FIFO admission. A request is admitted when the batch has room (``max_running``) and its blocks
  (prompt + output) fit, evicting idle cached blocks if needed; a head that does not fit blocks
  the queue (no reordering), as vLLM's FCFS does.
* With ``preempt``, blocks are taken as vLLM v1 takes them instead: the prompt's at admission,
  then one more whenever a decoding request's tokens fill its last. When none is free (nor
  evictable), the newest running request is preempted: its blocks are released (its prompt's
  stay cached until evicted) and it goes back to the head of the queue, to recompute its prompt
  and the output so far when readmitted; that prefill emits its next token, not a first one.
  Requests are not admitted at the cost of a preemption, nor in a step that preempted, as vLLM
  admits none then.
* The cache is looked up at admission (prefill start), not at arrival, and the hit is capped at
  ``prompt - 1`` tokens: the last prompt token is always computed to produce logits.
* Each step has a token budget: one token per decoding request, the rest for prefill chunks in
  admission order (chunked prefill). A prompt's full blocks become cacheable once computed.
* Step time = prefill tokens / prefill rate, plus ``decode_step_s`` when any request decodes;
  with ``attention_tokens`` L > 0 a chunk of c tokens after k with KV counts c*(1 + (k+c/2)/L).
  The prefill step that finishes a prompt also emits its first token.
* With ``mixed_batches`` off, SGLang's default (no ``--enable-mixed-chunk``): a step that has
  prefill to do runs it alone, with the whole budget, and the decoding requests wait for it;
  they decode in the steps between. vLLM v1 always mixes them (chunked prefill).
* With ``fast_forward``, a stretch of decode-only steps is planned as one step that lasts until
  the next request finishes; :meth:`ReplicaModel.interrupt` cuts it at the next step boundary
  when a request arrives, so the result equals stepping one by one, at a fraction of the events.
  Decoding requests are kept in a heap by the step they finish at, so a step costs O(prefills +
  finishes), not O(running requests), unless ``report_decodes`` asks for every token.
* Only prompt blocks are cached: generated tokens come back re-tokenised inside a chat template
  in the next turn, so they rarely match the engine's blocks (and the article counts reuse of
  previous input only).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import deque
from dataclasses import dataclass

from prefixroute.core import BlockHash, BlockHasher, ConfigError, RequestTooLarge
from prefixroute.sim.engine_request import EngineRequest, StepResult, StoredBlock, kv_blocks_needed
from prefixroute.sim.kv_cache import make_kv_cache
from prefixroute.sim.preemption import Preemption

__all__ = [  # the request's types live beside it; importers find them here too
    "EngineRequest",
    "ReplicaConfig",
    "ReplicaModel",
    "StepResult",
    "StoredBlock",
    "kv_blocks_needed",
]


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    kv_capacity_blocks: int = 8192  # KV cache size, blocks
    block_size: int = 16  # tokens per KV block (vLLM's default)
    prefill_tokens_per_s: float = 10_000.0  # prefill rate, tokens/s (the article's figure)
    decode_step_s: float = 0.015  # added to a step that decodes, seconds (inter-token latency)
    step_tokens: int = 2048  # token budget per step, tokens (max_num_batched_tokens)
    max_running: int = 256  # requests in the running batch (max_num_seqs)
    # Fixed time before the engine queues a request (the HTTP exchange, tokenizing, templating),
    # seconds: the cluster and the emulator hold each request this long before submitting it.
    # A real server has it; 0 keeps the article's model (every recorded simulation).
    first_token_overhead_s: float = 0.0
    # Context length at which a prompt token's prefill costs twice what it costs with nothing
    # before it, tokens; 0: attention is free (the article's model, every recorded simulation).
    attention_tokens: float = 0.0
    # vLLM's on-demand block allocation with preemption (module docstring); False reserves
    # prompt and output at admission and never preempts (every recorded simulation).
    preempt: bool = False
    # Prefill chunks and decodes share each step (vLLM v1); False: a prefill batch runs alone
    # and decodes wait (SGLang without --enable-mixed-chunk; module docstring).
    mixed_batches: bool = True

    def __post_init__(self) -> None:
        if min(self.kv_capacity_blocks, self.block_size, self.step_tokens, self.max_running) < 1:
            raise ConfigError("replica sizes (capacity, block size, budget, batch) must be >= 1")
        if not 0 < self.prefill_tokens_per_s < math.inf or not 0 <= self.decode_step_s < math.inf:
            raise ConfigError(
                "prefill rate must be positive and decode step time non-negative, both finite: "
                f"got {self.prefill_tokens_per_s} and {self.decode_step_s}"
            )
        if not self.first_token_overhead_s >= 0:
            raise ConfigError("first-token overhead must be non-negative")
        if not 0 <= self.attention_tokens < math.inf:
            raise ConfigError("attention tokens must be >= 0 and finite (0: attention is free)")
        if self.preempt and not self.mixed_batches:
            # vLLM's preemption grows decoding requests each step: modelled with vLLM's steps.
            raise ConfigError("preemption is modelled for mixed batches (vLLM's) only")


class ReplicaModel(Preemption):
    """A continuous-batching engine with a finite prefix cache."""

    def __init__(
        self,
        config: ReplicaConfig | None = None,
        hash_seed: int = 0,
        record_events: bool = False,
        *,
        fast_forward: bool = False,
        report_decodes: bool = True,
    ) -> None:
        self.config = config or ReplicaConfig()
        self.hasher = BlockHasher(self.config.block_size, hash_seed)
        self.cache = make_kv_cache(self.config.kv_capacity_blocks, record_events)
        # With record_events: blocks made reusable since the last take_stored_blocks().
        self._stored_blocks: list[StoredBlock] | None = [] if record_events else None
        self.fast_forward = fast_forward  # plan decode-only stretches as one step
        self.report_decodes = report_decodes  # list every decoding request in each StepResult
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []  # admitted, in admission order
        self._prefilling: list[EngineRequest] = []  # admitted, prompt not done, in order
        self._decoding: dict[EngineRequest, None] = {}  # prompt done, generating
        self._finishing: list[tuple[int, int, EngineRequest]] = []  # (finish step, seq, req)
        self._seq = 0
        self._step_no = 0  # steps completed, steps
        self._planned: list[EngineRequest] = []  # prefill work of the planned step
        self._steps = 0  # decode steps the planned step stands for, steps
        self._step_start = 0.0  # when the planned step began, seconds
        self._step_s = 0.0  # its duration, seconds
        self._step_decode_s = 0.0  # decode step time the planned step was planned with, seconds
        # Totals, since creation.
        self.prefill_tokens = 0  # prompt tokens computed, tokens
        self.cached_tokens = 0  # prompt tokens reused from cache, tokens
        self.busy_s = 0.0  # time spent in steps, seconds
        self.completed = 0
        self.preemptions = 0  # requests preempted (vLLM's ``vllm:num_preemptions``)

    # --- queue ----------------------------------------------------------------------------
    def submit(self, req: EngineRequest) -> None:
        """Queue a request (FIFO). Raises RequestTooLarge if it can never fit the cache."""
        if req.output_tokens < 1 or req.prompt_tokens == 0:
            raise ConfigError("a request needs at least one prompt token and one output token")
        if self._blocks_needed(req) > self.config.kv_capacity_blocks:
            raise RequestTooLarge(
                f"request {req.request_id} needs {self._blocks_needed(req)} KV blocks; "
                f"the replica has {self.config.kv_capacity_blocks}"
            )
        if not req.block_hashes:
            req.block_hashes = self.hasher.hash_tokens(req.tokens)
        self.waiting.append(req)

    def abort(self, request_id: str) -> bool:
        """Drop a request wherever it is (client went away); its blocks are released.

        Call it between steps (after ``end_step``, before ``begin_step``), never inside one.
        """
        for req in self.waiting:
            if req.request_id == request_id:
                self.waiting.remove(req)
                return True
        for req in self.running:
            if req.request_id == request_id:
                self._retire(req)
                return True
        return False

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def kv_usage(self) -> float:
        """Fraction of blocks pinned by running requests (vLLM's kv_cache_usage_perc)."""
        return self.cache.used / self.cache.capacity

    # --- steps ----------------------------------------------------------------------------
    def begin_step(self, now: float) -> float:
        """Plan the next batch; returns its duration in seconds (0.0 when there is no work)."""
        cfg = self.config
        # vLLM admits nothing in a step that preempted: what it freed goes to the running.
        preempted = self._grow() if cfg.preempt and self._decoding else False
        decoding = len(self._decoding)
        # Unmixed, a step plans prefill alone with the whole budget (decodes wait for it).
        budget = cfg.step_tokens - decoding if cfg.mixed_batches else cfg.step_tokens
        prefill = 0
        attention, extra = cfg.attention_tokens, 0.0  # extra: sum of chunk * context, tokens^2
        planned: list[EngineRequest] = []
        for req in self._prefilling:
            if budget <= 0:
                break
            req._chunk = min(budget, req._target - req.computed)
            budget -= req._chunk
            prefill += req._chunk
            planned.append(req)
            if attention:
                extra += req._chunk * (req.computed + req._chunk / 2)
        while budget > 0 and self.waiting and len(self.running) < cfg.max_running and not preempted:
            if not self._admit(self.waiting[0], now):
                break
            req = self.waiting.popleft()
            self.running.append(req)
            self._prefilling.append(req)
            req._chunk = min(budget, req._target - req.computed)
            budget -= req._chunk
            prefill += req._chunk
            planned.append(req)
            if attention:
                extra += req._chunk * (req.computed + req._chunk / 2)
        steps = 1 if decoding and (cfg.mixed_batches or not planned) else 0
        if self.fast_forward and decoding and not planned:
            # Nothing but decodes until the next request finishes (or an arrival interrupts).
            steps = max(1, self._finishing[0][0] - self._step_no) if self._finishing else 1
            if cfg.preempt:  # no further than a request's next block
                steps = min(steps, self._steps_in_blocks())
        self._planned = planned
        self._steps = steps
        self._step_start = now
        self._step_decode_s = cfg.decode_step_s
        work = prefill + extra / attention if attention else prefill  # prefill work, tokens
        self._step_s = work / cfg.prefill_tokens_per_s + steps * cfg.decode_step_s
        return self._step_s

    def set_speed(
        self, prefill_tokens_per_s: float | None = None, decode_step_s: float | None = None
    ) -> None:
        """Run at new speeds from the next step on (the planned step keeps its duration): the
        GPU gained or lost a neighbour. None leaves a speed unchanged."""
        cfg = self.config  # every other setting (block size, attention, ...) stays
        rate = cfg.prefill_tokens_per_s if prefill_tokens_per_s is None else prefill_tokens_per_s
        step = cfg.decode_step_s if decode_step_s is None else decode_step_s
        self.config = dataclasses.replace(cfg, prefill_tokens_per_s=rate, decode_step_s=step)

    def interrupt(self, now: float) -> float | None:
        """A request arrived during a fast-forwarded decode stretch: end it at the next step
        boundary. Returns the planned step's new end time, or None if it is unchanged."""
        if self._steps <= 1 or self._planned:
            return None
        d = self._step_decode_s
        elapsed = max(1, math.ceil((now - self._step_start) / d - 1e-9))
        if elapsed >= self._steps:
            return None
        self._steps = elapsed
        end = max(self._step_start + elapsed * d, now)  # float rounding must not go back in time
        self._step_s = end - self._step_start
        return end

    def end_step(self, now: float) -> StepResult:
        """Apply the planned step at time ``now`` (its end)."""
        result = StepResult([], [], [])
        self.busy_s += self._step_s
        if self._steps:
            self._step_no += self._steps
            if self.report_decodes:
                for req in self._decoding:
                    req.generated = self._step_no - req._first_step + 1
                    result.decoded.append(req)
        elif self.config.mixed_batches:
            self._step_no += 1  # a prefill-only step still counts as a step
        # (Unmixed, it does not: the decoding requests waited, and a first token's request
        # decodes its second token in the next step counted.)
        step_no = self._step_no
        for req in self._planned:
            req.computed += req._chunk
            self.prefill_tokens += req._chunk
            req._chunk = 0
            self._register(req)
            if req.prefill_done and req.first_token_s is not None:
                self._resumed(req, step_no, result)
            elif req.prefill_done:
                req.first_token_s = now
                req.generated = 1
                req._first_step = step_no
                req._finish_step = step_no + req.output_tokens - 1
                self._prefilling.remove(req)
                result.first_tokens.append(req)
                if req.output_tokens == 1:
                    result.finished.append(req)
                else:
                    self._start_decoding(req)
        finishing = self._finishing
        while finishing and finishing[0][0] <= step_no:
            _, _, req = heapq.heappop(finishing)
            if req in self._decoding and req._finish_step <= step_no:  # not one preempted
                del self._decoding[req]  # (a stale entry of one resumed finds it gone)
                result.finished.append(req)
        for req in result.finished:
            req.generated = req.output_tokens
            req.finish_s = now
            self._retire(req)
            self.completed += 1
        self._planned = []
        self._steps = 0
        return result

    def _start_decoding(self, req: EngineRequest) -> None:
        """Decode from the next step on, until its ``_finish_step``."""
        self._decoding[req] = None
        self._seq += 1
        heapq.heappush(self._finishing, (req._finish_step, self._seq, req))

    def _retire(self, req: EngineRequest) -> None:
        """Take a request out of the running batch and release its blocks."""
        self.running.remove(req)
        self._decoding.pop(req, None)
        if req in self._prefilling:
            self._prefilling.remove(req)
        self._release(req)

    # --- cache ----------------------------------------------------------------------------
    def _blocks_needed(self, req: EngineRequest) -> int:
        return kv_blocks_needed(req.prompt_tokens, req.output_tokens, self.config.block_size)

    def _admit(self, req: EngineRequest, now: float) -> bool:
        """Look the prompt up and reserve its blocks (with ``preempt``, those of what it
        prefills: module docstring); False if they do not fit yet."""
        bs = self.config.block_size
        limit = max(0, req.prompt_tokens - 1) // bs
        needed = -(-req._target // bs) if self.config.preempt else self._blocks_needed(req)
        hit = self.cache.acquire(req.block_hashes, limit, needed)
        if hit < 0:
            return False
        req._cached = req.block_hashes[:hit]
        req._registered = hit
        req._anonymous = needed - hit
        req.computed = hit * bs
        self.cached_tokens += req.computed
        if req.start_s is None:  # vLLM counts a request's first scheduling, not a resumption
            req.cached_tokens = req.computed
            req.start_s = now
        return True

    def _register(self, req: EngineRequest) -> None:
        """Make the prompt's newly computed full blocks reusable (a block whose hash is already
        cached, computed by another request meanwhile, stays an anonymous duplicate)."""
        hashes = req.block_hashes
        start, full = req._registered, min(req.computed // self.config.block_size, len(hashes))
        duplicates = self.cache.register_chain(hashes, start, full)
        new: range | list[int] = range(start, full)
        if duplicates:
            skip = set(duplicates)
            new = [i for i in new if i not in skip]
            req._cached.extend([hashes[i] for i in new])
        else:
            req._cached.extend(hashes[start:full])
        req._anonymous -= len(new)
        if self._stored_blocks is not None:
            self._stored_blocks.extend([self._stored_block(req, i) for i in new])
        req._registered = full

    def _stored_block(self, req: EngineRequest, i: int) -> StoredBlock:
        bs = self.config.block_size
        parent = req.block_hashes[i - 1] if i else None
        chunk = req.tokens[i * bs : (i + 1) * bs]  # type: ignore[index]  # a list or an array
        return StoredBlock(req.block_hashes[i], parent, [int(t) for t in chunk], req.lora_name)

    def _release(self, req: EngineRequest) -> None:
        self.cache.release(req._cached, req._anonymous)
        req._cached = []
        req._anonymous = 0

    def take_stored_blocks(self) -> list[StoredBlock]:
        """Blocks stored since the last call, with parent and tokens (needs ``record_events``)."""
        if self._stored_blocks is None:
            raise ConfigError("the replica model records cache events only with record_events")
        stored, self._stored_blocks = self._stored_blocks, []
        return stored

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (vLLM's ``/reset_prefix_cache``); False while requests run,
        as vLLM refuses then. Pending event records are dropped with the blocks."""
        if self.running or not self.cache.reset():
            return False
        if self._stored_blocks is not None:
            self._stored_blocks = []
        return True

    def take_cache_events(self) -> tuple[list[BlockHash], list[BlockHash]]:
        """Blocks stored and removed since the last call (for engine-style KV events)."""
        stored, removed = self.cache.stored, self.cache.removed
        self.cache.stored, self.cache.removed = [], []
        return stored, removed
