"""Workload generators and the only name -> (builder, config) table.

Each workload lives in its own module with a frozen config dataclass (defaults sized so that 4
replicas of the default replica model run at roughly 70% of capacity) and a
``build(config, seed) -> Workload`` function. The CLI, simulator and benchmarks all go through
:func:`make_workload`, which turns string overrides into typed config fields; everything a
builder draws comes from generators seeded with ``seed``, so a (name, seed, overrides) triple
always gives the same workload.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from prefixroute.sim.workload import Workload
from prefixroute.sim.workloads import (
    dialogues,
    hot_prefix,
    mooncake,
    multi_turn,
    no_sharing,
    seed_conversation,
    seed_shared_prompt,
    shared_prefix,
)
from prefixroute.sim.workloads._config import build_config as _build_config
from prefixroute.sim.workloads._config import field_specs as _field_specs
from prefixroute.sim.workloads._errors import UnknownWorkload as UnknownWorkload

Builder = Callable[[Any, int], Workload]

# name -> (builder, config class). The only place a workload's name is looked up.
WORKLOADS: dict[str, tuple[Builder, type[Any]]] = {
    "seed-conversation": (seed_conversation.build, seed_conversation.SeedConversationConfig),
    "seed-shared-prompt": (seed_shared_prompt.build, seed_shared_prompt.SeedSharedPromptConfig),
    "multi-turn": (multi_turn.build, multi_turn.MultiTurnConfig),
    "shared-prefix": (shared_prefix.build, shared_prefix.SharedPrefixConfig),
    "hot-prefix": (hot_prefix.build, hot_prefix.HotPrefixConfig),
    "no-sharing": (no_sharing.build, no_sharing.NoSharingConfig),
    "mooncake": (mooncake.build, mooncake.MooncakeConfig),
    "dialogues": (dialogues.build, dialogues.DialoguesConfig),
}


def _lookup(name: str) -> tuple[Builder, type[Any]]:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise UnknownWorkload(f"unknown workload {name!r}; valid: {', '.join(WORKLOADS)}") from None


def check_workload(name: str) -> None:
    """UnknownWorkload (listing the valid names) unless ``name`` is a workload: a name checked
    before any work, where the workload itself is built later."""
    _lookup(name)


def workload_names() -> list[str]:
    return list(WORKLOADS)


def workload_params(name: str) -> dict[str, tuple[type[Any], object, str]]:
    """name -> (type, default, help) of each of the workload's parameters, in declared order."""
    return _field_specs(_lookup(name)[1])


def make_workload(name: str, seed: int = 0, overrides: Mapping[str, str] | None = None) -> Workload:
    """Generate the named workload with its defaults, overridden by ``overrides`` (strings).

    Raises UnknownWorkload for a name not in :data:`WORKLOADS`, ConfigError for an unknown
    parameter or a bad value (both messages list the valid choices).
    """
    builder, config_cls = _lookup(name)
    return builder(_build_config(name, config_cls, overrides or {}), seed)


__all__ = [
    "WORKLOADS",
    "Builder",
    "UnknownWorkload",
    "check_workload",
    "make_workload",
    "workload_names",
    "workload_params",
]
