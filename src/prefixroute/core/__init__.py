"""The routing core: pure, synchronous and clock-free; used unchanged by simulator and gateway."""

from prefixroute.core.errors import (
    ConfigError,
    NoReplicaAvailable,
    PrefixrouteError,
    RequestTooLarge,
    UnknownPolicy,
    UnknownWorkload,
)
from prefixroute.core.hashing import BlockHash, BlockHasher, TokenIds
from prefixroute.core.index import PrefixIndex
from prefixroute.core.load import LoadTracker, ReplicaLoad
from prefixroute.core.policies import (
    DEFAULT_POLICY,
    POLICIES,
    Policy,
    RoutingContext,
    make_policy,
    parse_policy_list,
    policy_names,
)
from prefixroute.core.router import Router
from prefixroute.core.speculative import SpeculativeEntries
from prefixroute.core.speed import ReplicaSpeed, SpeedConfig
from prefixroute.core.token_count import CharsPerToken, TokenCountConfig, TokenCounts
from prefixroute.core.types import Decision, DecisionReason, ReplicaId, RequestView

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "BlockHash",
    "BlockHasher",
    "CharsPerToken",
    "ConfigError",
    "Decision",
    "DecisionReason",
    "LoadTracker",
    "NoReplicaAvailable",
    "Policy",
    "PrefixIndex",
    "PrefixrouteError",
    "ReplicaId",
    "ReplicaLoad",
    "ReplicaSpeed",
    "RequestTooLarge",
    "RequestView",
    "Router",
    "RoutingContext",
    "SpeculativeEntries",
    "SpeedConfig",
    "TokenCountConfig",
    "TokenCounts",
    "TokenIds",
    "UnknownPolicy",
    "UnknownWorkload",
    "make_policy",
    "parse_policy_list",
    "policy_names",
]
