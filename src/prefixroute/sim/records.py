"""What a simulated (or measured) run leaves behind: each request's record, each replica's, the
learned-against-true speed trace, and the run's result (:class:`RunResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request (times in seconds from the start of the run)."""

    request_id: str
    session_id: str
    turn: int  # 0-based turn index in its session
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    replica: str = ""
    reason: str = ""
    predicted_cached_tokens: int | None = 0  # what the router expected (None: not told)
    cached_tokens: int = 0  # what the replica found
    cached_reported: bool = True  # False: the replica did not say (live runs), 0 above
    decision_ns: int = 0  # wall time of Router.route, nanoseconds
    first_token_s: float | None = None
    finish_s: float | None = None
    rerouted: int = 0  # times it was moved off a removed replica
    plain: bool = False  # its answer was plain: a live run sees no first token of it

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s


@dataclass(slots=True)
class ReplicaRecord:
    replica: str
    requests: int = 0
    busy_s: float = 0.0
    prefill_tokens: int = 0
    cached_tokens: int = 0
    evictions: int = 0
    preemptions: int = 0  # requests its engine preempted (``ReplicaConfig.preempt``)
    added_s: float = 0.0
    removed_s: float | None = None
    prefill_tokens_per_s: float = 0.0  # its true prefill rate at the end of the run, tokens/s
    decode_step_s: float = 0.0  # its true decode step at the end of the run, seconds
    learned_prefill_tokens_per_s: float = 0.0  # the router's estimate at the end, tokens/s
    learned_decode_step_s: float = 0.0  # the router's estimate at the end, seconds
    first_token_overhead_s: float = 0.0  # its true fixed time before its engine queue, seconds
    learned_first_token_overhead_s: float = 0.0  # the router's estimate at the end, seconds
    # Attention (core/context_cost.py): the context at which a prompt token costs double,
    # tokens; 0: its cost does not grow with the context (true, and as learned at the end).
    attention_tokens: float = 0.0
    learned_attention_tokens: float = 0.0
    kv_capacity_blocks: int = 0  # its true KV cache, blocks
    index_capacity_blocks: int | None = None  # the router's index capacity for it at the end


@dataclass(frozen=True, slots=True)
class SpeedSample:
    """A replica's learned and true speed right after one of its requests completed."""

    time_s: float  # simulated time, seconds
    replica: str
    requests: int  # requests of this replica that had completed, requests
    learned_prefill_tokens_per_s: float  # the router's estimate, tokens/s
    prefill_tokens_per_s: float  # the replica model's true rate at that time, tokens/s
    learned_decode_step_s: float  # the router's estimate, seconds
    decode_step_s: float  # the true decode step at that time, seconds


@dataclass(slots=True)
class RunResult:
    policy: str
    workload: str
    block_size: int
    duration_s: float  # simulated time until the last completion, seconds
    records: list[RequestRecord]
    replicas: list[ReplicaRecord]
    index_blocks: int | None  # distinct blocks in the router's index at the end (None: unseen)
    index_evictions: int | None
    events: int  # kernel events processed
    wall_s: float  # wall-clock time of the run, seconds
    live: bool = False  # measured from outside (bench): busy, evictions, decisions unknown
    speed_trace: list[SpeedSample] = field(default_factory=list)  # with trace_speeds only
