"""Routing policies and the only name -> class table.

Each policy lives in its own module as a small class with a frozen config whose defaults are the
source system's. The CLI, simulator and gateway all build policies through :func:`make_policy`.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from prefixroute.core.errors import ConfigError, UnknownPolicy
from prefixroute.core.policies._base import Policy, RoutingContext
from prefixroute.core.policies._params import out_of_range
from prefixroute.core.policies.cache_aware import CacheAware, CacheAwareConfig
from prefixroute.core.policies.consistent_hash import ConsistentHash, ConsistentHashConfig
from prefixroute.core.policies.kv_cost import KVCost, KVCostConfig
from prefixroute.core.policies.least_loaded import LeastLoaded, LeastLoadedConfig
from prefixroute.core.policies.power_of_two import PowerOfTwo, PowerOfTwoConfig
from prefixroute.core.policies.predicted_ttft import PredictedTTFT, PredictedTTFTConfig
from prefixroute.core.policies.prefix_affinity import PrefixAffinity, PrefixAffinityConfig
from prefixroute.core.policies.random_pick import RandomConfig, RandomPick
from prefixroute.core.policies.round_robin import RoundRobin, RoundRobinConfig
from prefixroute.core.policies.weighted_scorer import WeightedScorer, WeightedScorerConfig

DEFAULT_POLICY = "predicted_ttft"

# name -> (policy class, config class). The only place a policy's name is looked up.
POLICIES: dict[str, tuple[type[Any], type[Any]]] = {
    "round_robin": (RoundRobin, RoundRobinConfig),
    "random": (RandomPick, RandomConfig),
    "least_loaded": (LeastLoaded, LeastLoadedConfig),
    "power_of_two": (PowerOfTwo, PowerOfTwoConfig),
    "consistent_hash": (ConsistentHash, ConsistentHashConfig),
    "prefix_affinity": (PrefixAffinity, PrefixAffinityConfig),
    "cache_aware": (CacheAware, CacheAwareConfig),
    "weighted_scorer": (WeightedScorer, WeightedScorerConfig),
    "kv_cost": (KVCost, KVCostConfig),
    "predicted_ttft": (PredictedTTFT, PredictedTTFTConfig),
}


def policy_names() -> list[str]:
    return list(POLICIES)


def make_policy(name: str, **params: Any) -> Policy:
    """A fresh policy by registry name, with config fields overridden by ``params``."""
    try:
        cls, config_cls = POLICIES[name]
    except KeyError:
        raise UnknownPolicy(f"unknown policy {name!r}; valid: {', '.join(POLICIES)}") from None
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    unknown = set(params) - set(fields)
    if unknown:
        raise ConfigError(
            f"policy {name!r} has no parameter {', '.join(sorted(unknown))}; "
            f"valid: {', '.join(sorted(fields)) or 'none'}"
        )
    hints = typing.get_type_hints(config_cls)
    for key, value in params.items():
        _check_param(name, key, value, hints[key])
        why = None if isinstance(value, bool) else out_of_range(fields[key], value)
        if why is not None:
            raise ConfigError(f"policy {name!r}: parameter {key} {why}")
    policy: Policy = cls(config=config_cls(**params))
    return policy


_KIND_NAMES = {bool: "true or false", int: "an integer", float: "a number"}


def _check_param(policy: str, key: str, value: object, kind: object) -> None:
    """A policy parameter of the wrong type is a ConfigError naming it: the config dataclasses
    do not check, so ``"fast"`` for a rate used to fail later as a bare TypeError ("'<=' not
    supported between ...") or, worse, run. Only int, float and bool fields are checked; an
    int is a float's value too, and 0 or 1 a bool's (``--policy-param`` values are numbers)."""
    if kind not in _KIND_NAMES:
        return
    if kind is bool:
        ok = isinstance(value, bool) or (type(value) is int and value in (0, 1))
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok:
        raise ConfigError(
            f"policy {policy!r}: parameter {key} must be {_KIND_NAMES[kind]}, got {value!r}"
        )


def parse_policy_list(spec: str) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]``, each checked against the registry.

    A comma at either end is forgiven (a list built in a loop), but an empty name between two
    (``a,,b``) is refused: it is most likely a name left out (``a,$UNSET,b``), and dropping it
    would compare fewer policies than asked for without a word."""
    names = [n.strip() for n in spec.strip().strip(",").split(",")]
    if names == [""]:
        raise ConfigError("no policy given")
    if "" in names:
        raise ConfigError(f"an empty policy name in {spec!r}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # run twice, reported twice under one name (and twice in the JSON)
        raise ConfigError(f"a policy named twice in {spec!r}: {', '.join(twice)}")
    for n in names:
        if n not in POLICIES:
            raise UnknownPolicy(f"unknown policy {n!r}; valid: {', '.join(POLICIES)}")
    return names


__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "CacheAware",
    "CacheAwareConfig",
    "ConsistentHash",
    "ConsistentHashConfig",
    "KVCost",
    "KVCostConfig",
    "LeastLoaded",
    "LeastLoadedConfig",
    "Policy",
    "PowerOfTwo",
    "PowerOfTwoConfig",
    "PredictedTTFT",
    "PredictedTTFTConfig",
    "PrefixAffinity",
    "PrefixAffinityConfig",
    "RandomConfig",
    "RandomPick",
    "RoundRobin",
    "RoundRobinConfig",
    "RoutingContext",
    "WeightedScorer",
    "WeightedScorerConfig",
    "make_policy",
    "parse_policy_list",
    "policy_names",
]
