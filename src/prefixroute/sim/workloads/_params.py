"""Parameters that several workloads share: one help text each, every workload its own default.

A parameter that means the same thing in two workloads is described the same way in
``prefixroute simulate --list``, so its help text is stated once here and looked up by key.
"""

from __future__ import annotations

from typing import TypeVar

from prefixroute.sim.workloads._config import param

T = TypeVar("T")

_SHARED_HELP = {
    "one_turn_requests": "requests (one turn each)",
    "poisson_rate": "requests per second (Poisson)",
    "tokens_per_request": "tokens generated per request",
    "system_prompt": "system prompt, tokens",
    "think_pause_mean": "mean pause before the next turn, seconds (exponential)",
    "suggested_block_size": "KV block size suggested to the simulator, tokens",
}


def shared_param(key: str, default: T) -> T:
    """:func:`param` with the help text shared under ``key`` (KeyError at import for a typo)."""
    return param(default, _SHARED_HELP[key])
