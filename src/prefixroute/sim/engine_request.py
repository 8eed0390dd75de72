"""What a replica model holds per request, and what one step of it returns (sim/replica.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prefixroute.core import BlockHash, TokenIds


def kv_blocks_needed(prompt_tokens: int, output_tokens: int, block_size: int) -> int:
    """KV blocks a request holds at its end: prompt and output, whole blocks."""
    return -(-(prompt_tokens + output_tokens) // block_size)


@dataclass(slots=True, eq=False)
class EngineRequest:
    """One request inside a replica."""

    request_id: str
    tokens: TokenIds  # prompt token ids
    output_tokens: int  # tokens to generate (>= 1)
    arrival_s: float  # when the replica received it, seconds
    block_hashes: list[BlockHash] = field(default_factory=list)  # engine's hashes of full blocks
    lora_name: str | None = None  # LoRA adapter it runs under (its blocks' hashes are keyed)
    cached_tokens: int = 0  # prompt tokens found cached at its first admission
    computed: int = 0  # tokens whose KV exists (cached + prefilled so far)
    generated: int = 0  # output tokens produced (kept current only with report_decodes)
    start_s: float | None = None  # first admission (prefill start), seconds
    preemptions: int = 0  # times the engine preempted it (``ReplicaConfig.preempt``)
    first_token_s: float | None = None
    finish_s: float | None = None
    _prompt: int = 0  # len(tokens), cached
    # Tokens its prefill computes: the prompt, and after a preemption the output so far too
    # (vLLM recomputes both).
    _target: int = 0
    _registered: int = 0  # leading full blocks already registered in the cache
    _cached: list[BlockHash] = field(default_factory=list)  # blocks it pins in the cache
    _anonymous: int = 0  # blocks it holds that carry no reusable hash
    _chunk: int = 0  # prefill tokens scheduled in the current step
    _first_step: int = 0  # step number that produced its first token
    _finish_step: int = 0  # step number that produces its last token

    def __post_init__(self) -> None:
        self._prompt = self._target = len(self.tokens)

    @property
    def prompt_tokens(self) -> int:
        return self._prompt

    @property
    def prefill_done(self) -> bool:
        return self.computed >= self._target


@dataclass(frozen=True, slots=True)
class StoredBlock:
    """A block that became reusable, as an engine's KV event reports it (``record_events``)."""

    block_hash: BlockHash  # the engine's hash of the block
    parent: BlockHash | None  # hash of the block before it in its prompt; None for the first
    tokens: list[int]  # its token ids, ``block_size`` of them
    lora_name: str | None = None  # the LoRA adapter whose key space it was hashed in


@dataclass(slots=True)
class StepResult:
    first_tokens: list[EngineRequest]  # prefill finished this step (first token emitted)
    decoded: list[EngineRequest]  # produced more output this step (only with report_decodes)
    finished: list[EngineRequest]  # done; their blocks are released
