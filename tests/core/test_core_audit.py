"""Contracts an outside fuzzing of the core found broken (2026-12-02); each test failed on the
code before its fix."""

from __future__ import annotations

import pytest

from prefixroute.core import BlockHash, BlockHasher, ReplicaId, Router, make_policy
from prefixroute.core._solve import solve_feasible
from prefixroute.core.speculative import SpeculativeEntries
from prefixroute.core.speed import ReplicaSpeed
from prefixroute.core.speed_config import SpeedConfig

R0, R1 = ReplicaId("r0"), ReplicaId("r1")
A, B = BlockHash(11), BlockHash(22)


def test_a_withdrawal_keeps_what_a_later_decision_at_the_same_time_refreshed() -> None:
    """``withdraw``: "drop the entries its decision added that no later decision refreshed",
    so the rest stays closed under prefixes, even when both decisions read the same clock."""
    spec = SpeculativeEntries(ttl_s=2.0)
    spec.add(R0, [A], 5.0, "x")
    spec.add(R0, [A, B], 5.0, "y")  # refreshes A, adds B
    spec.withdraw("x")  # x was turned away, y was not
    assert spec.match([A, B], [R0], 5.0) == {R0: 2}
    spec.withdraw("y")
    assert spec.match([A, B], [R0], 5.0) == {R0: 1}  # A: y found it held, added only B
    assert spec.match([A, B], [R0], 7.0) == {}  # and everything expires at its time


@pytest.mark.parametrize("precise", [False, True])
def test_both_modes_predict_alike_after_a_withdrawal_at_one_clock_reading(precise: bool) -> None:
    router = Router(
        make_policy("round_robin"), BlockHasher(block_size=1), insert_on_route=not precise,
        speculative_ttl_s=2.0 if precise else None,
    )  # fmt: skip
    router.add_replica(R0)
    router.route(router.view("x", tokens=[1, 2]), 5.0)
    router.route(router.view("y", tokens=[1, 2, 3]), 5.0)
    router.withdraw("x")
    probe = router.explain(router.view("z", tokens=[1, 2, 3, 4]), 5.0)
    assert probe.predicted_cached_tokens == 3  # y's three blocks


def test_a_solve_that_fixes_every_unknown_returns_the_fixed_values() -> None:
    """``solve_feasible``: 1/rate positive, the rest not negative; an unknown the solution
    makes infeasible is fixed (a step at 0)."""
    a = [[4.5, 2.0, 0, 0], [2.0, 2.5, 0, 0], [0, 0, 0.5, 0], [0, 0, 0, 0.5]]
    c = [0.5, 1.0, 0.0, 0.0]
    theta = solve_feasible(a, c, [1.0, 0.5, 0.0, 0.0], [0, 1])
    assert theta[0] > 0 and all(v >= 0 for v in theta[1:])


def test_a_decode_step_learned_from_a_zero_prior_is_never_negative() -> None:
    speed = ReplicaSpeed(SpeedConfig(decode_step_s=0.0))  # allowed: "decode step >= 0"
    speed.observe_first_token(0.0, 0.0, False, 0.0, 1.0)
    speed.observe_decode(1.0, 1, 0.0)
    speed.observe_first_token(0.0, 0.0, False, 0.0, 1.0)
    speed.observe_first_token(0.0, 0.0, False, 0.0, 1.0)
    speed.observe_first_token(0.0, 0.0, True, 12289.0, 0.25)
    speed.observe_first_token(0.0, 0.0, True, 18433.0, 0.125)
    speed.observe_first_token(0.0, 0.0, True, 49153.0, 1.0)
    speed.observe_decode(1.0, 3, 3733.0)  # the eighth observation: the first refit
    assert speed.decode_step_s >= 0


@pytest.mark.parametrize("precise", [False, True])
def test_another_instances_decision_for_a_replica_we_do_not_route_to_records_nothing(
    precise: bool,
) -> None:
    """``remote_routed``: another instance sent a prompt to one of *our* replicas. One we do
    not know (or removed) must not enter the index, or it would not start cold when added."""
    router = Router(
        make_policy("round_robin"), BlockHasher(block_size=1), insert_on_route=not precise,
        speculative_ttl_s=2.0 if precise else None,
    )  # fmt: skip
    router.add_replica(R0)
    chain = router.view("q", tokens=[1, 2, 3]).block_hashes
    router.remote_routed(R1, chain, 1.0, request_id="other/q")
    router.add_replica(R1)
    probe = router.explain(router.view("z", tokens=[1, 2, 3, 4]), 1.0, [R1])
    assert probe.predicted_cached_tokens == 0
    assert router.indexed_blocks(R1) == 0
