"""The fleet's speed as one replica's estimates: what a cold replica starts from
(``LoadTracker``, core/load.py's module docstring).

**A fresh replica in a running fleet** (``fleet_prior``) predicts with its fleet's learned
estimates (:meth:`ReplicaSpeed.start_from`; the load view picks them: its median replica's)
until its own observations take over. The constants are a guess about hardware nobody measured:
a replica joining a fleet that learned 3x the configured rate looked 3x slower than its peers and
was sent nothing; one joining a fleet 3x slower looked 3x faster and was flooded.
"""

from __future__ import annotations

from prefixroute.core.speed import Estimates, ReplicaSpeed


def fleet_median_speed(speeds: list[ReplicaSpeed]) -> ReplicaSpeed:
    """The median replica of ``speeds`` (non-empty), ranked by how long one full batch step of
    prefill takes at each: one replica's own estimates, so they fit together (a median of each
    separately could pair one replica's rate with another's overhead), and its kind of step
    with them, which they were fitted with (core/batch_mixing.py: a fleet of engines whose
    prefill runs alone starts its fresh replicas as such)."""
    cfg = speeds[0].config
    ranked = sorted(speeds, key=lambda s: s.ttft_s(cfg.step_tokens, 1.0))
    return ranked[(len(ranked) - 1) // 2]


def fleet_median(speeds: list[ReplicaSpeed]) -> Estimates:
    """The estimates of :func:`fleet_median_speed`."""
    return fleet_median_speed(speeds).estimates()
