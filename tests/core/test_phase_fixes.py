"""What a decode phase is told of the prefill that shared its steps (core/queue_fixes.py,
*Decode phases*; core/speed_fit.py, *A decode phase's count*).

A decode phase's observation counts the uncached tokens of the requests whose first tokens came
back during it. Counted as predicted, a replica that computed more than predicted (it evicted
what the index still claims) did more prefill in every phase than the phase was told, and the
fit took the rate up to explain the time. Each request's usage corrects the phases its prefill
shared, and only those. And whatever the corrections, a phase's count can be off by the prefill
under way at either end (the end's is credited as an estimate: core/queue_credit.py): a short
phase's error is judged against a typical request's prefill time as well as its prediction.
"""

from __future__ import annotations

import pytest

from prefixroute.core import speed_fit
from prefixroute.core._solve import PhaseObs, QueuedObs, solve_feasible
from prefixroute.core.load import LoadTracker
from prefixroute.core.queue_fixes import KEEP
from prefixroute.core.speed import ReplicaSpeed, SpeedConfig


def tracker() -> LoadTracker:
    # Never warmed up: no refit moves the estimates while the observations are inspected.
    return LoadTracker(speed=SpeedConfig(min_observations=1_000))


def send(t: LoadTracker, rid: str, now: float) -> None:
    """1,000-token prompts predicted 600 cached: 400 uncached tokens each."""
    t.count_dispatch(rid, "r0", prompt_tokens=1_000, output_tokens=10,
                     predicted_cached_tokens=600, now=now)  # fmt: skip


def phases(t: LoadTracker) -> list[PhaseObs]:
    decode = list(t["r0"].speed._decode)
    assert all(type(o) is PhaseObs for o in decode)
    return decode  # type: ignore[return-value]


def test_usage_corrects_the_phases_its_prefill_shared_and_only_those() -> None:
    t = tracker()
    send(t, "v", 0.0)
    t.first_token("v", 0.05)  # v's phase starts: it shares x's, y's and z's prefill
    send(t, "x", 0.06)
    t.first_token("x", 0.1)  # x's phase starts: it shares y's and z's
    send(t, "y", 0.15)
    t.first_token("y", 0.3)
    send(t, "z", 0.35)
    t.first_token("z", 0.5)  # z's phase starts after y's first token: it shares nothing
    t.complete("x", 0.6, output_tokens=10)
    (x_phase,) = phases(t)
    assert x_phase.x[0] == 800.0  # y's and z's predicted 400 each
    t.observe_usage("y", prompt_tokens=1_000, cached_tokens=0)  # y computed 1,000, not 400
    assert x_phase.x[0] == 1_400.0  # taken before y reported, corrected after
    t.complete("y", 0.65, output_tokens=10)
    t.complete("z", 0.8, output_tokens=10)
    t.complete("v", 0.9, output_tokens=10)
    x_phase, y_phase, z_phase, v_phase = phases(t)
    assert y_phase.x[0] == 400.0  # z only: y's own prefill is not in its decode phase
    assert z_phase.x[0] == 0.0  # y's correction is not z's: y was prefilled before z's phase
    assert v_phase.x[0] == 400.0 + 1_000.0 + 400.0  # x, y as reported, z: taken after y's fix
    assert x_phase.x[0] == 1_400.0  # once


def x_phase_shared_by_y() -> tuple[LoadTracker, PhaseObs]:
    """x's decode phase, taken, with y's first token in it."""
    t = tracker()
    send(t, "x", 0.0)
    t.first_token("x", 0.1)
    send(t, "y", 0.15)
    t.first_token("y", 0.3)
    t.complete("x", 0.6, output_tokens=10)
    (x_phase,) = phases(t)
    return t, x_phase


def test_the_correction_carries_the_context_work_too() -> None:
    t, x_phase = x_phase_shared_by_y()
    # y's 400 tokens after 600 cached: 400 x (600 + 200) / 1,000 token-kilotokens.
    assert x_phase.x[4] == pytest.approx(320.0)
    t.observe_usage("y", prompt_tokens=1_000, cached_tokens=0)
    assert x_phase.x[4] == pytest.approx(1_000 * 500 / 1_000)  # all 1,000, from the start


def test_a_report_of_what_was_predicted_changes_nothing() -> None:
    t, x_phase = x_phase_shared_by_y()
    t.observe_usage("y", prompt_tokens=1_000, cached_tokens=600)
    assert x_phase.x[0] == 400.0
    assert t["r0"].phase_fixes.within(0) == (0.0, 0.0)


def test_an_open_phase_sums_every_correction_of_its_prefills() -> None:
    """Two requests prefilled during a phase still open both report, each with its tokens and
    context work: the phase, taken at its end, carries both corrections."""
    t = tracker()
    send(t, "x", 0.0)
    t.first_token("x", 0.1)
    for i, (rid, cached) in enumerate((("y", 0), ("z", 300))):
        send(t, rid, 0.2 + i)
        t.first_token(rid, 0.3 + i)
        t.observe_usage(rid, prompt_tokens=1_000, cached_tokens=cached)  # 1,000 and 700
        t.complete(rid, 0.35 + i, output_tokens=1)
    assert t["r0"].phase_fixes.prefills == 3  # x, y and z: numbered by their first tokens
    t.complete("x", 3.0, output_tokens=10)
    x_phase = phases(t)[-1]
    assert x_phase.x[0] == 1_000.0 + 700.0
    # y: 1,000 tokens after none cached; z: 700 after 300 (token-kilotokens)
    assert x_phase.x[4] == pytest.approx(1_000 * 500 / 1_000 + 700 * (300 + 350) / 1_000)


def test_reports_that_change_nothing_keep_no_room() -> None:
    """Only the last corrections are kept for phases still open (queue_fixes.KEEP); reports of
    exactly what was predicted are no corrections and do not push a real one out."""
    t = tracker()
    send(t, "x", 0.0)
    t.first_token("x", 0.1)
    send(t, "y", 0.2)
    t.first_token("y", 0.3)
    t.observe_usage("y", prompt_tokens=1_000, cached_tokens=0)  # 600 more than predicted
    for i in range(2 * KEEP):
        rid = f"exact{i}"
        send(t, rid, 0.4 + i / 1_000)
        t.first_token(rid, 0.5 + i / 1_000)
        t.observe_usage(rid, prompt_tokens=1_000, cached_tokens=600)  # as predicted
        t.complete(rid, 0.6 + i / 1_000, output_tokens=1)
    t.complete("x", 1.0, output_tokens=10)
    assert phases(t)[-1].x[0] == 1_000.0 + 2 * KEEP * 400.0


RATE, STEP, OWN = 10_000.0, 0.015, 5_000.0  # the truth, and the typical request's own tokens


def fitted(floor: bool) -> tuple[float, float]:
    """A replica's (rate, decode step) fitted on first tokens and decode phases true to
    ``RATE`` and ``STEP``, but for every other phase: one step that shared a 2,000-token chunk,
    1,200 tokens of it of a prefill whose first token came after the phase (counted: 800)."""
    speed = ReplicaSpeed(SpeedConfig(min_observations=10**6))  # no refit of its own
    for i in range(64):
        own = OWN * (0.5 + (i % 5) / 4)
        speed.observe_first_token(0.0, 0.0, False, own, own / RATE)
        if i % 2:
            tokens, steps = 2_000.0 * (i % 7), 5 + i % 11
            speed.observe_decode(tokens / RATE + steps * STEP, steps, tokens)
        else:
            speed.observe_decode(2_000.0 / RATE + STEP, 1, 800.0)
    assert all(type(o) is QueuedObs for o in speed._prefill)
    windows, theta = (speed._prefill, speed._decode, speed._engine), speed.theta()
    typical = speed_fit._typical_own
    try:
        if not floor:
            speed_fit._typical_own = lambda window: 0.0  # type: ignore[assignment]
        a, c, _ = speed_fit.normal_equations(speed.config, theta, windows)
    finally:
        speed_fit._typical_own = typical
    b, step = solve_feasible(a, c, theta, [0, 1])[:2]
    return 1.0 / b, step


def test_a_short_phase_s_miscount_weighs_as_a_typical_prefill_not_as_its_own_size() -> None:
    # Each short phase took 0.215 s for a predicted 0.095: 2.3x, within the outlier test's 3x.
    # Judged against its prediction alone, half the window drags the rate down (7,783 tokens/s
    # when this was written); against a typical request's prefill (0.5 s) too, it hardly moves.
    rate, step = fitted(floor=True)
    assert rate == pytest.approx(RATE, rel=0.05)
    assert step == pytest.approx(STEP, rel=0.2)
    assert fitted(floor=False)[0] < 0.85 * RATE
