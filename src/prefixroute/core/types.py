"""The routing core's data model: replica ids, request views, decisions and their reasons."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NewType

from prefixroute.core.hashing import BlockHash

ReplicaId = NewType("ReplicaId", str)
"""A replica's stable name (a URL in the gateway, ``r0``.. in the simulator)."""


@dataclass(frozen=True, slots=True)
class RequestView:
    """What a policy may look at in a request. Built once per request, shared by every policy."""

    request_id: str  # unique per request
    block_hashes: Sequence[BlockHash]  # chained hashes of the prompt's full blocks, in order
    block_size: int  # tokens (or characters) per block of ``block_hashes``
    prompt_tokens: int  # estimated prompt length, tokens
    prompt_units: int  # prompt length in hashing units (tokens, or characters in char mode)
    output_tokens: int = 0  # expected output length, tokens (0 when unknown)
    session_id: str | None = None  # conversation id for session affinity
    tenant: str | None = None  # tenant that sent it
    model: str | None = None  # requested model name
    char_units: bool = False  # prompt_units are characters (keyed on text), not token ids
    # What the replica's usage will count besides this view's prompt and one sequence: the
    # output sequences it asks for (``n`` per prompt, times a batch's prompts), and whether it
    # is a batch (several prompts; the view is its first). Such usage teaches less (Router).
    sequences: int = 1
    batch: bool = False
    # The replica puts what it stored before this prompt (a Responses API continuation, whose
    # conversation so far is not in the request): its usage counts more than this prompt, so
    # it teaches no characters per token (Router.route). Its uncached count is still its own.
    extended: bool = False

    @property
    def tokens_per_unit(self) -> float:
        """Tokens per hashing unit: 1.0 for token ids; for characters, the inverse of the
        model's characters per token as the router has learned it."""
        return self.prompt_tokens / self.prompt_units if self.prompt_units else 1.0


class DecisionReason(StrEnum):
    """Which branch chose the replica. Values are stable: they are Prometheus labels and headers."""

    ROUND_ROBIN = "round_robin"
    RANDOM = "random"
    LEAST_LOADED = "least_loaded"
    POWER_OF_TWO = "power_of_two"
    SESSION_HASH = "session_hash"
    PREFIX_MATCH = "prefix_match"  # the longest cached match won
    WEAK_MATCH = "weak_match"  # match below threshold: fell back to load / free cache
    LOAD_IMBALANCE = "load_imbalance"  # cluster imbalanced: affinity overridden by load
    BEST_SCORE = "best_score"  # weighted scorer's maximum
    LOWEST_COST = "lowest_cost"  # kv_cost's minimum
    HOT_SPOT_YIELD = "hot_spot_yield"  # the best-cached replica was skipped to avoid a hot spot
    ONLY_CANDIDATE = "only_candidate"  # a single replica could take it


@dataclass(frozen=True, slots=True)
class CandidateScore:
    """What the policy saw of one candidate, for explaining a decision (tracing, /admin/explain).

    ``predicted_ttft_s`` and ``score`` are filled by policies that compute them (the default
    policy: its predicted time to first token, and that plus the delay to others it minimised);
    ``None`` for policies that decide by other rules (the reason says which).
    """

    replica: ReplicaId
    matched_blocks: int  # blocks of the prompt the index (or recent decisions) says it holds
    cached_tokens: int  # the prompt tokens that match stands for
    in_flight: int  # requests routed there and not finished
    queued_prefill_tokens: int  # prompt tokens routed there and not yet prefilled
    predicted_ttft_s: float | None = None
    score: float | None = None  # the policy's objective (lower wins), when it has one


@dataclass(frozen=True, slots=True)
class Decision:
    """A routing decision: where, why, and how many prompt tokens the router expects cached.

    ``candidates`` is filled only when the decision was asked to be explained (it costs a little
    per candidate): every candidate the policy scored, in its order.
    """

    replica: ReplicaId
    reason: DecisionReason
    predicted_cached_tokens: int  # tokens the router believes the replica has cached
    candidates: tuple[CandidateScore, ...] = ()
