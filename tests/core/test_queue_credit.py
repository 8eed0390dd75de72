"""A decode phase that ends with prefill under way is credited with the progress on it
(core/queue_credit.py, *A decode phase's last prefill*).

The expected numbers are worked by hand from ``ReplicaSpeed.progress``'s rule: the replica is
credited ``rate x (elapsed - one decode step per step started)`` tokens of the queue, never more
than is queued, where a step that also decodes takes ``step_tokens / rate + decode_step`` seconds.
At the default priors (10,000 tokens/s, 2,048-token steps, 15 ms decode steps) a step is
0.2198 s: 0.3 s on the queue is 2 steps started, 0.27 s of prefill, 2,700 tokens.
"""

from __future__ import annotations

import pytest

from prefixroute.core._solve import PhaseObs, QueuedObs
from prefixroute.core.load import LoadTracker
from prefixroute.core.queue_credit import REDERIVE_TOLERANCE, derive, rederive
from prefixroute.core.speed import ReplicaSpeed, SpeedConfig

COLD = SpeedConfig(min_observations=1_000)  # never refits: the estimates stay the priors


def last_phase(speed: ReplicaSpeed) -> PhaseObs:
    obs = speed._decode[-1]
    assert type(obs) is PhaseObs
    return obs


def observed(
    queue: tuple[float, float, float, int] | None, context: float = 10.0
) -> PhaseObs:
    """A phase of 20 steps in 0.9 s that counted 1,000 tokens (and ``context`` work)."""
    speed = ReplicaSpeed(COLD)
    speed.observe_decode(0.9, 20, 1_000.0, context, (0, 3), queue)
    return last_phase(speed)


def test_the_prefill_under_way_at_its_end_is_credited_at_the_estimates() -> None:
    phase = observed((5_000.0, 0.3, 0.0, 2))
    assert phase.x[0] == pytest.approx(1_000.0 + 2_700.0)
    assert phase.credit[0] == pytest.approx(2_700.0)
    assert phase.x[1] == 20 and phase.x[4] == pytest.approx(10.0)  # steps, counted context


def test_no_queue_no_credit() -> None:
    phase = observed(None)
    assert phase.x[0] == 1_000.0 and phase.credit == (0.0, 0.0)
    assert observed((5_000.0, 0.0, 0.0, 2)).x[0] == 1_000.0  # nothing done of it yet


def test_never_more_than_is_queued() -> None:
    assert observed((500.0, 0.3, 0.0, 2)).x[0] == pytest.approx(1_500.0)


def test_the_queue_context_work_is_credited_in_proportion() -> None:
    phase = observed((5_000.0, 0.3, 50.0, 2))
    assert phase.x[4] == pytest.approx(10.0 + 50.0 * 2_700.0 / 5_000.0)
    assert phase.credit[1] == pytest.approx(27.0)


def test_usage_corrects_the_counted_part_and_keeps_the_credit() -> None:
    phase = observed((5_000.0, 0.3, 50.0, 2))
    phase.correct(2, 300.0, 5.0)  # a request in its range computed 300 more
    assert phase.x[0] == pytest.approx(1_300.0 + 2_700.0)
    assert phase.x[4] == pytest.approx(15.0 + 27.0)
    phase.correct(3, -5_000.0, -100.0)  # far fewer: the count stops at 0, the credit stays
    assert phase.x[0] == pytest.approx(2_700.0)
    assert phase.x[4] == pytest.approx(27.0)
    phase.correct(4, 1_000.0, 1.0)  # not one of its first tokens
    assert phase.x[0] == pytest.approx(2_700.0)


def test_each_refit_takes_the_credit_again_at_the_estimates_it_starts_from() -> None:
    speed = ReplicaSpeed(COLD)
    speed.observe_decode(0.9, 20, 1_000.0, 0.0, (0, 3), (5_000.0, 0.3, 0.0, 2))
    phase = last_phase(speed)
    speed.prefill_tokens_per_s = 5_000.0  # a step is now 0.4246 s: 1 started, 0.285 s
    rederive(speed, [], [phase])
    assert phase.x[0] == pytest.approx(1_000.0 + 0.285 * 5_000.0)
    assert phase.basis[0] == 5_000.0
    # Moved by less than the tolerance: kept as it was taken.
    speed.prefill_tokens_per_s = 5_000.0 * (1 + REDERIVE_TOLERANCE / 2)
    rederive(speed, [], [phase])
    assert phase.x[0] == pytest.approx(1_000.0 + 0.285 * 5_000.0)


def test_a_request_ending_while_another_prefills_passes_that_queue() -> None:
    t = LoadTracker(speed=COLD)
    send = t.count_dispatch
    send("x", "r0", prompt_tokens=1_000, output_tokens=21, predicted_cached_tokens=600, now=0.0)
    t.first_token("x", 0.1)  # x decodes from here; the replica is idle
    send("y", "r0", prompt_tokens=8_000, output_tokens=5, predicted_cached_tokens=0, now=0.5)
    t.complete("x", 0.8, output_tokens=21)  # y has been prefilling for 0.3 s, all of it
    phase = last_phase(t["r0"].speed)
    assert phase.x[0] == pytest.approx(0.0 + 2_700.0)  # nothing counted, y's progress credited
    t.first_token("y", 1.0)
    send("z", "r0", prompt_tokens=1_000, output_tokens=5, predicted_cached_tokens=0, now=1.0)
    t.first_token("z", 1.2)
    t.complete("y", 1.3, output_tokens=5)  # nothing under way at its end: no credit
    assert last_phase(t["r0"].speed).x[0] == pytest.approx(1_000.0)


def test_the_queue_context_slows_the_progress_where_attention_is_learned() -> None:
    speed = ReplicaSpeed(COLD)
    speed.attention_s = 0.002  # 5,000 tokens with 250 token-kilotokens: 0.5 + 0.5 s
    speed.observe_decode(0.9, 20, 1_000.0, 10.0, (0, 3), (5_000.0, 0.3, 250.0, 2))
    phase = last_phase(speed)
    # At 5,000 tokens/s a step is 0.4246 s: 1 started, 0.285 s of prefill, 1,425 tokens.
    assert phase.x[0] == pytest.approx(1_000.0 + 1_425.0)
    assert phase.x[4] == pytest.approx(10.0 + 250.0 * 1_425.0 / 5_000.0)
    assert phase.x[2] == 0.0 and phase.x[3] == 0.0  # no engine request, no first token


def test_taken_again_the_context_credit_replaces_the_last() -> None:
    speed = ReplicaSpeed(COLD)
    speed.observe_decode(0.9, 20, 1_000.0, 10.0, (0, 3), (5_000.0, 0.3, 50.0, 2))
    phase = last_phase(speed)
    speed.prefill_tokens_per_s = 5_000.0
    rederive(speed, [], [phase])
    assert phase.x[4] == pytest.approx(10.0 + 50.0 * 0.285 * 5_000.0 / 5_000.0)
    assert phase.x[3] == 0.0


def first_token(speed: ReplicaSpeed, elapsed_s: float = 0.3) -> QueuedObs:
    """A first token sent behind 5,000 tokens the replica had been on for ``elapsed_s``, with
    400 uncached tokens of its own."""
    obs = speed.observe_first_token(5_000.0, elapsed_s, True, 400.0, 1.0, seq=1)
    assert obs is not None
    return obs


def test_a_first_token_queue_is_what_is_left_of_it_plus_its_own() -> None:
    obs = first_token(ReplicaSpeed(COLD))
    assert obs.x[0] == pytest.approx(5_000.0 - 2_700.0 + 400.0)
    assert obs.x[2] == 0.0 and obs.x[3] == 1.0  # no engine request; one first token


def test_a_whole_answer_adds_its_decode_phase_to_its_queue() -> None:
    speed = ReplicaSpeed(COLD)
    obs = QueuedObs((0.0, 0.0, 0.0, 1.0, 0.0), 2.0, 5_000.0, 0.3, True, 400.0, 30.0, 4.0,
                    after=(500.0, 20.0, 7.0))  # fmt: skip
    derive(speed, obs)
    assert obs.x[0] == pytest.approx(5_000.0 - 2_700.0 + 400.0 + 500.0)
    assert obs.x[4] == pytest.approx(4.0 + 30.0 * 2_300.0 / 5_000.0 + 7.0)


@pytest.mark.parametrize(
    ("moved", "retaken"),
    [
        ({"prefill_tokens_per_s": 10_000.0 * 1.005}, False),
        ({"prefill_tokens_per_s": 10_000.0 + REDERIVE_TOLERANCE * 10_000.0}, False),  # the edge
        ({"prefill_tokens_per_s": 10_000.0 * 1.02}, True),
        ({"decode_step_s": 0.015 * 1.005}, False),
        ({"decode_step_s": 0.015 * 1.02}, True),
        # Attention against a token's time at the rate: 0.01 x 1/10,000 s is the edge.
        ({"attention_s": REDERIVE_TOLERANCE * (1.0 / 10_000.0)}, False),
        ({"attention_s": 1.5 * REDERIVE_TOLERANCE * (1.0 / 10_000.0)}, True),
    ],
)
def test_a_queue_is_taken_again_once_the_estimates_moved_past_the_tolerance(
    moved: dict[str, float], retaken: bool
) -> None:
    speed = ReplicaSpeed(COLD)
    obs, phase = first_token(speed), observed_on(speed)
    for name, value in moved.items():
        setattr(speed, name, value)
    rederive(speed, [obs], [phase])
    expect = (speed.prefill_tokens_per_s, speed.decode_step_s, speed.attention_s)
    assert (obs.basis == expect) is retaken
    assert (phase.basis == expect) is retaken


def test_with_attention_learned_its_own_move_is_judged_beside_it() -> None:
    speed = ReplicaSpeed(COLD)
    speed.attention_s = 1e-3  # well above a token's time at the rate (1e-4 s)
    obs, phase = first_token(speed), observed_on(speed)
    speed.prefill_tokens_per_s = 10_000.0 * 1.005  # the rate within the tolerance
    rederive(speed, [obs], [phase])
    assert obs.basis[0] == 10_000.0 and phase.basis[0] == 10_000.0  # kept
    speed.attention_s = 1e-3 + 2 * REDERIVE_TOLERANCE * (1e-4 + 1e-3)
    rederive(speed, [obs], [phase])
    assert obs.basis[2] == speed.attention_s and phase.basis[2] == speed.attention_s


def observed_on(speed: ReplicaSpeed) -> PhaseObs:
    speed.observe_decode(0.9, 20, 1_000.0, 10.0, (0, 3), (5_000.0, 0.3, 50.0, 2))
    return last_phase(speed)


def test_the_load_view_counts_the_same_progress_in_seconds() -> None:
    t = LoadTracker(speed=COLD)
    t.count_dispatch("x", "r0", prompt_tokens=1_000, output_tokens=21,
                     predicted_cached_tokens=600, now=0.0)  # fmt: skip
    t.first_token("x", 0.1)  # x decodes: each step also carries its decode
    t.count_dispatch("y", "r0", prompt_tokens=5_000, output_tokens=5,
                     predicted_cached_tokens=0, now=0.5)  # fmt: skip
    # 0.3 s on y with x decoding: 2,700 of its 5,000 tokens done, 2,300 left at 10,000/s.
    assert t["r0"].queued_prefill_s(0.8) == pytest.approx(0.23)


def test_a_queued_request_s_usage_corrects_the_queue_a_phase_was_credited_from() -> None:
    # 324 tokens queued as predicted: 2,680 tokens of progress in 0.298 s, capped at 324.
    speed = ReplicaSpeed(COLD)
    speed.observe_decode(0.298, 1, 89.0, 0.0, (0, 3), (324.0, 0.298, 0.0, 5))
    phase = last_phase(speed)
    assert phase.x[0] == pytest.approx(89.0 + 324.0)
    # First token 4 (after the phase), dispatched 6th: sent after its end, not in its queue.
    speed.correct_decode(4, 4_676.0, 0.0, 6)
    assert phase.x[0] == pytest.approx(89.0 + 324.0)
    # First token 3, dispatched 5th: one the phase counted; its count is corrected, not the queue.
    speed.correct_decode(3, 11.0, 0.0, 5)
    assert phase.x[0] == pytest.approx(100.0 + 324.0) and phase.queued == 324.0
    # First token 4, dispatched 5th: queued at the phase's end. It computed 5,000 tokens.
    speed.correct_decode(4, 4_676.0, 0.0, 5)
    assert phase.queued == pytest.approx(5_000.0)
    assert phase.x[0] == pytest.approx(100.0 + 2_680.0)


def test_the_load_view_passes_a_queued_request_s_usage_to_the_phase_it_was_credited_to() -> None:
    t = LoadTracker(speed=COLD)
    t.count_dispatch("x", "r0", prompt_tokens=1_000, output_tokens=21,
                     predicted_cached_tokens=600, now=0.0)  # fmt: skip
    t.first_token("x", 0.1)
    # y is predicted nearly all cached: 324 uncached tokens.
    t.count_dispatch("y", "r0", prompt_tokens=5_000, output_tokens=5,
                     predicted_cached_tokens=4_676, now=0.5)  # fmt: skip
    t.complete("x", 0.8, output_tokens=21)  # 0.3 s on y: 2,700 tokens of progress, capped
    phase = last_phase(t["r0"].speed)
    assert phase.x[0] == pytest.approx(324.0)
    t.first_token("y", 1.0)
    t.observe_usage("y", prompt_tokens=5_000, cached_tokens=0)  # y computed all 5,000
    assert phase.x[0] == pytest.approx(2_700.0)


def test_a_queue_its_usage_empties_is_credited_nothing() -> None:
    # The one request queued at the phase's end reports it computed none of its 324 tokens.
    speed = ReplicaSpeed(COLD)
    speed.observe_decode(0.298, 1, 89.0, 0.0, (0, 3), (324.0, 0.298, 10.0, 5))
    speed.correct_decode(4, -324.0, -10.0, 5)
    phase = last_phase(speed)
    assert phase.queued == 0.0
    assert phase.x[0] == pytest.approx(89.0) and phase.x[4] == pytest.approx(0.0)
    assert phase.credit == (0.0, 0.0)
