"""A learned speed's priors count as one observation each, as far off either way (``core/speed.py``,
*Priors and bounds*): a replica four times slower than the configured rate and one four times
faster end up the same ratio from their true rates, on the same evidence.

Each prior's error was once divided by its own prediction, where the data's are divided by the
current estimate's: the prior then weighed ``(estimate / prior)**2`` observations, 16 for a
replica 4x slower (learned at 1.35x its rate after 16 first tokens) and a sixteenth for one 4x
faster (0.99x). Divided by the current estimate's, as the data are, it is the other way round
(1.05x and 0.85x). Weighed alike both ways as a whole observation: 1.09x and 0.91x; as a quarter
(``PRIOR_WEIGHT``): 1.02x and 0.98x.
"""

from __future__ import annotations

import math

import pytest

from prefixroute.core.speed import ReplicaSpeed, SpeedConfig

PRIOR = 10_000.0


def learned_rate(true_rate: float, observations: int) -> float:
    """The rate learned from ``observations`` exact, idle first tokens of two sizes."""
    speed = ReplicaSpeed(SpeedConfig(prefill_tokens_per_s=PRIOR))
    for i in range(observations):
        tokens = 250.0 if i % 2 else 1_500.0
        speed.observe_prefill(tokens, 0.0, tokens / true_rate)
    return speed.prefill_tokens_per_s


@pytest.mark.parametrize("observations", [16, 32, 64])
def test_a_prior_pulls_a_slow_and_a_fast_replica_alike(observations: int) -> None:
    slow = learned_rate(PRIOR / 4, observations) / (PRIOR / 4)
    fast = learned_rate(PRIOR * 4, observations) / (PRIOR * 4)
    assert slow > 1.0 > fast  # each pulled towards the prior
    assert math.log(slow) == pytest.approx(-math.log(fast), rel=0.15)  # was 25x apart


def test_a_prior_among_many_observations_pulls_little() -> None:
    # A quarter of an observation's worth: within 5% after 16 exact ones, 1% after 64.
    assert learned_rate(PRIOR / 4, 16) == pytest.approx(PRIOR / 4, rel=0.05)
    assert learned_rate(PRIOR * 4, 16) == pytest.approx(PRIOR * 4, rel=0.05)
    assert learned_rate(PRIOR / 4, 64) == pytest.approx(PRIOR / 4, rel=0.01)
    assert learned_rate(PRIOR * 4, 64) == pytest.approx(PRIOR * 4, rel=0.01)


def test_a_replica_at_its_prior_stays_there() -> None:
    assert learned_rate(PRIOR, 16) == pytest.approx(PRIOR, rel=1e-9)
