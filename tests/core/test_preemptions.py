"""A replica that preempts: what its speed model must not learn from (core/preemptions.py).

From the module's rules: a scrape interval in which the engine preempted taints itself and the
next; what was learned during a tainted interval is taken back at its end; a request in flight
when a tainted interval ended teaches nothing.
"""

from __future__ import annotations

import pytest

from prefixroute.core import PreemptionCounts, ReplicaId, ReplicaSpeed, SpeedConfig, make_policy
from prefixroute.core.router import Router

RATE = 5_000.0  # the true replica, tokens/s
R0 = ReplicaId("r0")


def test_discarding_takes_back_what_was_learned_since_the_mark() -> None:
    speed = ReplicaSpeed(SpeedConfig(min_observations=8))
    for _ in range(20):
        speed.observe_prefill(1000.0, 0.0, 1000.0 / RATE)
    learned = speed.prefill_tokens_per_s
    assert learned == pytest.approx(RATE, rel=0.05)
    speed.mark()
    for _ in range(20):  # answers slowed by recomputation: they look like 2,000 tokens/s
        speed.observe_prefill(1000.0, 0.0, 1000.0 / 2000.0)
    assert speed.prefill_tokens_per_s < 0.8 * RATE
    assert speed.discard_fresh() == 20
    assert speed.prefill_tokens_per_s == pytest.approx(learned, rel=0.01)
    assert (speed.discarded, speed.prefill_observations) == (20, 40)  # 40 seen, 20 taken back
    assert speed.discard_fresh() == 0  # discarding marks: nothing is fresh now


def test_taking_back_all_it_learned_returns_to_the_priors() -> None:
    speed = ReplicaSpeed(SpeedConfig(min_observations=8))
    prior = speed.prefill_tokens_per_s
    speed.mark()
    for _ in range(10):
        speed.observe_prefill(1000.0, 0.0, 1000.0 / 2000.0)
    assert speed.warmed_up and speed.prefill_tokens_per_s < 0.5 * prior
    assert speed.discard_fresh() == 10
    assert not speed.warmed_up
    assert speed.prefill_tokens_per_s == prior


def test_decode_phases_and_engine_times_are_taken_back_too() -> None:
    speed = ReplicaSpeed(SpeedConfig(min_observations=1))
    speed.observe_decode(1.0, 50, 0.0)
    learned = speed.decode_step_s
    speed.mark()
    speed.observe_decode(2.0, 50, 0.0)
    speed.observe_engine_prefill(1000.0, 2, 0.5)
    assert speed.decode_step_s > 1.2 * learned
    assert speed.discard_fresh() == 2
    assert speed.decode_step_s == pytest.approx(learned, rel=0.03)  # the first phase's alone


def serve(router: Router, rid: str, dispatched: float, done: float) -> None:
    """One 2,000-token request on r0: first token 0.1 s after dispatch, 10 tokens by ``done``."""
    view = router.view(rid, tokens=list(range(1000, 3000)), output_tokens=10)
    assert router.route(view, dispatched).replica == R0
    router.first_token(rid, dispatched + 0.1)
    router.complete(rid, done, output_tokens=10)


def test_the_router_learns_nothing_from_a_tainted_interval_or_a_request_across_one() -> None:
    router = Router(make_policy("predicted_ttft"))
    router.add_replica(R0)
    speed = router.replica_load(R0).speed
    assert router.observe_preemptions(R0, 0, 0.0) == 0  # a clean interval: nothing taken back
    # Dispatched at 1.0; the scrape at 1.05 counts a preemption: it was in flight then.
    view = router.view("a", tokens=list(range(2000)), output_tokens=10)
    router.route(view, 1.0)
    assert router.observe_preemptions(R0, 1, 1.05) == 0  # nothing learned meanwhile
    router.first_token("a", 1.1)
    router.complete("a", 1.5, output_tokens=10)
    assert (speed.prefill_observations, speed.decode_observations) == (0, 0)
    # Dispatched after it: it teaches, until the next scrape, whose interval the one before
    # tainted (the preempted request is recomputed after its preemption).
    serve(router, "b", 2.0, 2.5)
    assert (speed.prefill_observations, speed.decode_observations) == (1, 1)
    assert router.observe_preemptions(R0, 0, 3.0) == 2
    assert speed.discarded == 2
    # Dispatched as that scrape ended (not in flight at its end), it teaches; the next scrape
    # is clean, and what it learned stays.
    serve(router, "c", 3.0, 4.0)
    assert (speed.prefill_observations, speed.decode_observations) == (2, 2)
    assert router.observe_preemptions(R0, 0, 4.5) == 0
    assert speed.discarded == 2
    report = router.replica_load(R0).speed_report()  # what the admin API lists
    assert (report["preemptions"], report["discarded_observations"]) == (1, 2)


def test_a_replica_not_registered_is_ignored() -> None:
    router = Router(make_policy("predicted_ttft"))
    assert router.observe_preemptions(ReplicaId("gone"), 3, 1.0) == 0
    assert not router.has_replica(ReplicaId("gone"))


def test_preemption_counts_between_scrapes() -> None:
    deltas = PreemptionCounts()
    assert deltas.update("r", 40) is None  # the engine's whole life: a baseline
    assert deltas.update("r", 43) == 3
    assert deltas.update("r", 43) == 0
    assert deltas.update("r", 2) == 2  # restarted: its count began again
    deltas.forget("r")
    assert deltas.update("r", 5) is None
    deltas.forget("never scraped")  # a replica gone before its first scrape: nothing to forget
