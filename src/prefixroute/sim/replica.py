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
* The cache is looked up at admission (prefill start), not at arrival, and the hit is capped at
  ``prompt - 1`` tokens: the last prompt token is always computed to produce logits.
* Each step has a token budget: one token per decoding request, the rest for prefill chunks in
  admission order (chunked prefill). A prompt's full blocks become cacheable once computed.
* Step time = prefill tokens / prefill rate, plus ``decode_step_s`` when any request decodes.
  The prefill step that finishes a prompt also emits its first token.
* Only prompt blocks are cached: generated tokens come back re-tokenised inside a chat template
  in the next turn, so they rarely match the engine's blocks (and the article counts reuse of
  previous input only).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from prefixroute.core import BlockHash, BlockHasher, ConfigError, RequestTooLarge, TokenIds
from prefixroute.sim.kv_cache import KVCache


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    kv_capacity_blocks: int = 8192  # KV cache size, blocks
    block_size: int = 16  # tokens per KV block (vLLM's default)
    prefill_tokens_per_s: float = 10_000.0  # prefill rate, tokens/s (the article's figure)
    decode_step_s: float = 0.015  # added to a step that decodes, seconds (inter-token latency)
    step_tokens: int = 2048  # token budget per step, tokens (max_num_batched_tokens)
    max_running: int = 256  # requests in the running batch (max_num_seqs)

    def __post_init__(self) -> None:
        if min(self.kv_capacity_blocks, self.block_size, self.step_tokens, self.max_running) < 1:
            raise ConfigError("replica sizes (capacity, block size, budget, batch) must be >= 1")
        if self.prefill_tokens_per_s <= 0 or self.decode_step_s < 0:
            raise ConfigError("prefill rate must be positive and decode step time non-negative")


@dataclass(slots=True, eq=False)
class EngineRequest:
    """One request inside a replica."""

    request_id: str
    tokens: TokenIds  # prompt token ids
    output_tokens: int  # tokens to generate (>= 1)
    arrival_s: float  # when the replica received it, seconds
    block_hashes: list[BlockHash] = field(default_factory=list)  # engine's hashes of full blocks
    cached_tokens: int = 0  # prompt tokens found cached at admission
    computed: int = 0  # prompt tokens whose KV exists (cached + prefilled so far)
    generated: int = 0  # output tokens produced
    start_s: float | None = None  # admission (prefill start), seconds
    first_token_s: float | None = None
    finish_s: float | None = None
    _registered: int = 0  # leading full blocks already registered in the cache
    _cached: list[BlockHash] = field(default_factory=list)  # blocks it pins in the cache
    _anonymous: int = 0  # blocks it holds that carry no reusable hash
    _chunk: int = 0  # prompt tokens scheduled in the current step

    @property
    def prompt_tokens(self) -> int:
        return len(self.tokens)

    @property
    def prefill_done(self) -> bool:
        return self.computed >= self.prompt_tokens


@dataclass(slots=True)
class StepResult:
    first_tokens: list[EngineRequest]  # prefill finished this step (first token emitted)
    decoded: list[EngineRequest]  # produced one more output token this step
    finished: list[EngineRequest]  # done; their blocks are released


class ReplicaModel:
    """A continuous-batching engine with a finite prefix cache."""

    def __init__(
        self, config: ReplicaConfig | None = None, hash_seed: int = 0, record_events: bool = False
    ) -> None:
        self.config = config or ReplicaConfig()
        self.hasher = BlockHasher(self.config.block_size, hash_seed)
        self.cache = KVCache(self.config.kv_capacity_blocks, record_events=record_events)
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self._step: list[EngineRequest] = []  # requests with work in the planned step
        self._step_s = 0.0
        # Totals, since creation.
        self.prefill_tokens = 0  # prompt tokens computed, tokens
        self.cached_tokens = 0  # prompt tokens reused from cache, tokens
        self.busy_s = 0.0  # time spent in steps, seconds
        self.completed = 0

    # --- queue ----------------------------------------------------------------------------
    def submit(self, req: EngineRequest) -> None:
        """Queue a request (FIFO). Raises RequestTooLarge if it can never fit the cache."""
        if req.output_tokens < 1 or len(req.tokens) == 0:
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
        """Drop a request wherever it is (client went away); its blocks are released."""
        for req in self.waiting:
            if req.request_id == request_id:
                self.waiting.remove(req)
                return True
        for req in self.running:
            if req.request_id == request_id:
                self.running.remove(req)
                self._release(req)
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
        budget = cfg.step_tokens
        decoding = 0
        step: list[EngineRequest] = []
        for req in self.running:
            if req.prefill_done:
                decoding += 1
                budget -= 1
                step.append(req)
        prefill = 0
        for req in self.running:
            if not req.prefill_done and budget > 0:
                req._chunk = min(budget, req.prompt_tokens - req.computed)
                budget -= req._chunk
                prefill += req._chunk
                step.append(req)
        while budget > 0 and self.waiting and len(self.running) < cfg.max_running:
            if not self._admit(self.waiting[0], now):
                break
            req = self.waiting.popleft()
            self.running.append(req)
            req._chunk = min(budget, req.prompt_tokens - req.computed)
            budget -= req._chunk
            prefill += req._chunk
            step.append(req)
        self._step = step
        self._step_s = prefill / cfg.prefill_tokens_per_s + (cfg.decode_step_s if decoding else 0)
        return self._step_s

    def end_step(self, now: float) -> StepResult:
        """Apply the planned step at time ``now`` (its end)."""
        result = StepResult([], [], [])
        self.busy_s += self._step_s
        for req in self._step:
            if req.prefill_done:
                req.generated += 1
                result.decoded.append(req)
            else:
                req.computed += req._chunk
                self.prefill_tokens += req._chunk
                req._chunk = 0
                self._register(req)
                if req.prefill_done:
                    req.first_token_s = now
                    req.generated = 1
                    result.first_tokens.append(req)
            if req.generated >= req.output_tokens:
                req.finish_s = now
                result.finished.append(req)
        for req in result.finished:
            self.running.remove(req)
            self._release(req)
            self.completed += 1
        self._step = []
        return result

    # --- cache ----------------------------------------------------------------------------
    def _blocks_needed(self, req: EngineRequest) -> int:
        return -(-(req.prompt_tokens + req.output_tokens) // self.config.block_size)

    def _admit(self, req: EngineRequest, now: float) -> bool:
        """Look the prompt up and reserve its blocks; False if they do not fit yet."""
        bs = self.config.block_size
        limit = max(0, req.prompt_tokens - 1) // bs
        hit = self.cache.lookup(req.block_hashes, limit)
        need = self._blocks_needed(req) - hit
        # Pinning the hit blocks removes them from the evictable pool, so count them out.
        hits = req.block_hashes[:hit]
        if need > self.cache.available() - self.cache.idle_among(hits):
            return False
        self.cache.pin(hits)
        self.cache.take(need)
        req._cached = list(hits)
        req._registered = hit
        req._anonymous = need
        req.cached_tokens = req.computed = hit * bs
        self.cached_tokens += req.cached_tokens
        req.start_s = now
        return True

    def _register(self, req: EngineRequest) -> None:
        """Make the prompt's newly computed full blocks reusable."""
        full = min(req.computed // self.config.block_size, len(req.block_hashes))
        for h in req.block_hashes[req._registered : full]:
            if self.cache.register(h):
                req._cached.append(h)
                req._anonymous -= 1
        req._registered = full

    def _release(self, req: EngineRequest) -> None:
        self.cache.release(req._cached, req._anonymous)
        req._cached = []
        req._anonymous = 0

    def take_cache_events(self) -> tuple[list[BlockHash], list[BlockHash]]:
        """Blocks stored and removed since the last call (for engine-style KV events)."""
        stored, removed = self.cache.stored, self.cache.removed
        self.cache.stored, self.cache.removed = [], []
        return stored, removed
