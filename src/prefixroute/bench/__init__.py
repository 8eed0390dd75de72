"""Load generator for live deployments: replays simulator workloads over real HTTP streams."""

from prefixroute.bench._client import Outcome, stream_completion
from prefixroute.bench._replay import (
    APIS,
    ReplayConfig,
    ReplayResult,
    itl_percentiles,
    prompt_text,
    replay,
)

__all__ = [
    "APIS",
    "Outcome",
    "ReplayConfig",
    "ReplayResult",
    "itl_percentiles",
    "prompt_text",
    "replay",
    "stream_completion",
]
