"""The routing core: pure, synchronous and clock-free; used unchanged by simulator and gateway."""

# The simulator's KV block pool in C (core/_native/kvcache.c), or None when it is not built or
# PREFIXROUTE_PURE_PYTHON is set: sim/kv_cache.py holds its reference and chooses.
from prefixroute.core._native import KVCache as CompiledKVCache
from prefixroute.core.cache_prediction import Judgement, judge_prediction
from prefixroute.core.engine_kv import index_blocks_for
from prefixroute.core.errors import (
    ConfigError,
    ErrorSpec,
    InvalidPrompt,
    ModelNotFound,
    NoReplicaAvailable,
    PrefixrouteError,
    RequestTooLarge,
    UnknownPolicy,
    spec_along_mro,
)
from prefixroute.core.hashing import BlockHash, BlockHasher, TokenIds
from prefixroute.core.index import PrefixIndex
from prefixroute.core.index_capacity import IndexCapacityConfig, ReplicaCapacity
from prefixroute.core.load import LoadTracker
from prefixroute.core.policies import (
    DEFAULT_POLICY,
    POLICIES,
    Policy,
    RoutingContext,
    make_policy,
    parse_policy_list,
    policy_names,
)
from prefixroute.core.preemptions import PreemptionCounts
from prefixroute.core.replica_load import ReplicaLoad
from prefixroute.core.request_key import EMPTY_KEY, Endpoint, RouteKey, key_of
from prefixroute.core.router import Router
from prefixroute.core.speculative import SpeculativeEntries
from prefixroute.core.speed import ReplicaSpeed
from prefixroute.core.speed_config import (
    SPEED_PRIOR_KEYS,
    SpeedConfig,
    SpeedPrior,
    speed_priors_of,
)
from prefixroute.core.token_count import CharsPerToken, TokenCountConfig, TokenCounts
from prefixroute.core.types import (
    CandidateScore,
    Decision,
    DecisionReason,
    ReplicaId,
    RequestView,
)

__all__ = [
    "DEFAULT_POLICY",
    "EMPTY_KEY",
    "POLICIES",
    "SPEED_PRIOR_KEYS",
    "BlockHash",
    "BlockHasher",
    "CharsPerToken",
    "ConfigError",
    "CandidateScore",
    "CompiledKVCache",
    "Decision",
    "DecisionReason",
    "Endpoint",
    "ErrorSpec",
    "IndexCapacityConfig",
    "InvalidPrompt",
    "Judgement",
    "LoadTracker",
    "ModelNotFound",
    "NoReplicaAvailable",
    "Policy",
    "PreemptionCounts",
    "PrefixIndex",
    "PrefixrouteError",
    "ReplicaId",
    "ReplicaCapacity",
    "ReplicaLoad",
    "ReplicaSpeed",
    "RequestTooLarge",
    "RequestView",
    "Router",
    "RouteKey",
    "RoutingContext",
    "SpeculativeEntries",
    "SpeedConfig",
    "SpeedPrior",
    "TokenCountConfig",
    "TokenCounts",
    "TokenIds",
    "UnknownPolicy",
    "index_blocks_for",
    "judge_prediction",
    "key_of",
    "make_policy",
    "parse_policy_list",
    "policy_names",
    "spec_along_mro",
    "speed_priors_of",
]
