"""A gateway's own metrics, read in-process by the real-vLLM tests."""

from __future__ import annotations

from prefixroute.gateway import Gateway
from prefixroute.gateway._state import STATE


def total(gw: Gateway, name: str) -> float:
    """The sum of metric sample ``name`` (e.g. ``prefixroute_usage_missing_total``) over its
    labels."""
    registry = gw.app[STATE].metrics.registry
    return sum(s.value for m in registry.collect() for s in m.samples if s.name == name)
