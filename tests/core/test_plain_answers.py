"""Plain (non-streamed) answers: no first token is seen, only the end.

From the docs: ``Router.first_token_due`` predicts a request's first token at its replica's
learned speed, behind the queue it joined, and only once that speed is the replica's own
(``LoadTracker.first_token_due``); ``complete(..., whole=True)`` teaches the prefill rate and
decode step from the whole answer's time (core/speed.py, "An answer that arrives whole") once
other observations have warmed the replica up, and not when the queue it joined counted answers
nobody saw or guessed a first token of.
"""

from __future__ import annotations

import pytest

from prefixroute.core import (
    BlockHasher,
    ConfigError,
    Decision,
    DecisionReason,
    LoadTracker,
    ReplicaId,
    RequestView,
    Router,
    SpeedConfig,
    make_policy,
)
from prefixroute.core.speed import ReplicaSpeed
from prefixroute.sim import ClusterSim, ReplicaConfig, make_workload, parse_fleet

from .helpers import send

R0 = ReplicaId("r0")
RATE, STEP = 5_000.0, 0.02  # the replica's true prefill rate (tokens/s) and decode step (s)


def answers(
    tracker: LoadTracker, n: int, start: float = 0.0, whole: bool = True, rate: float = RATE
) -> float:
    """``n`` answers one after another to an idle replica of ``rate`` and STEP, plain
    (``whole``) or streamed; returns the time after the last. Prompts and outputs vary."""
    now = start
    for i in range(n):
        prompt, output = 200 + 150 * (i % 7), 2 + 9 * (i % 5)
        rid = f"{start}-{i}"
        send(tracker, rid, prompt, output, now)
        ttft = prompt / rate
        if not whole:
            tracker.first_token(rid, now + ttft)
        took = ttft + (output - 1) * STEP
        tracker.complete(rid, now + took, output, whole=whole)
        now += took + 0.5
    return now


def test_whole_answers_alone_warm_nothing_up() -> None:
    """Answers of similar shapes cannot tell a slower prefill from a longer decode step."""
    tracker = LoadTracker(speed=SpeedConfig(decode_step_s=0.015))  # priors 10,000 and 15 ms
    answers(tracker, 40)
    speed = tracker[R0].speed
    assert not speed.warmed_up
    assert speed.estimates()[:2] == (10_000.0, 0.015)
    assert speed.whole_observations == speed.prefill_observations == 40
    assert speed.snapshot()["whole_observations"] == 40
    assert speed.ttft_predictions == 0  # a whole answer's time is no first token's


def test_once_warm_whole_answers_teach_rate_and_step() -> None:
    """Warmed up by streams at RATE, the replica then prefills twice as fast: plain answers
    alone bring its estimate there."""
    tracker = LoadTracker(speed=SpeedConfig(decode_step_s=0.015))
    now = answers(tracker, 30, whole=False)
    speed = tracker[R0].speed
    assert speed.warmed_up and speed.prefill_tokens_per_s == pytest.approx(RATE, rel=0.05)
    answers(tracker, 96, start=now, rate=2 * RATE)  # the window (64) and then some
    assert speed.prefill_tokens_per_s == pytest.approx(2 * RATE, rel=0.1)
    assert speed.decode_step_s == pytest.approx(STEP, rel=0.1)
    assert speed.whole_observations == 96 and speed.ttft_predictions < 30


def test_an_answer_not_said_to_be_whole_teaches_nothing() -> None:
    tracker = LoadTracker()
    send(tracker, "a", 1000, 50, 0.0)
    tracker.complete("a", 2.0, 50)  # a failure, a cancellation: its time means nothing
    assert tracker[R0].speed.prefill_observations == 0


def test_a_whole_answer_behind_an_unseen_queue_teaches_nothing() -> None:
    """Before the replica's speed is its own, no first token is guessed: an answer in flight
    counts as queued prefill until its end, however long ago its prefill ended."""
    tracker = LoadTracker()
    send(tracker, "long", 500, 400, 0.0)  # prefilled by 0.1 s, decoding until its end
    send(tracker, "next", 500, 5, 5.0)  # behind "long" in the queue view, not in truth
    tracker.complete("next", 5.0 + 0.1 + 4 * STEP, 5, whole=True)
    assert tracker[R0].speed.prefill_observations == 0
    tracker.complete("long", 0.1 + 399 * STEP, 400, whole=True)  # it joined an idle replica
    assert tracker[R0].speed.whole_observations == 1


def test_first_token_due_only_at_a_speed_of_its_own() -> None:
    tracker = LoadTracker(speed=SpeedConfig(decode_step_s=0.015, fleet_prior=False))
    send(tracker, "cold", 1000, 10, 0.0)
    assert tracker.first_token_due("cold") is None  # priors: a guess nobody measured
    tracker.complete("cold", 1.0)
    now = answers(tracker, 20, start=10.0, whole=False)
    speed = tracker[R0].speed
    assert speed.warmed_up
    send(tracker, "a", 3000, 10, now)
    send(tracker, "b", 2000, 10, now)  # behind a's 3,000 tokens
    rate = speed.prefill_tokens_per_s
    due = tracker.first_token_due("b")
    assert due == pytest.approx(speed.first_token_overhead_s + 5000 / rate, rel=1e-9)
    assert due == pytest.approx(5000 / RATE, rel=0.1)
    tracker.first_token("a", now + 0.6, measured=False)  # guessed: the view moves on
    assert tracker[R0].prefilling == 1 and tracker[R0].queued_prefill_tokens == 2000
    assert tracker.first_token_due("a") is None  # past its prefill
    assert tracker.first_token_due("nobody") is None


def test_half_plain_answers_leave_learned_speeds_right() -> None:
    """A fleet half 4x slower, half the answers plain. Unguessed, the plain answers sat in the
    queue each stream's first token was learned behind, and the rates came out several times
    too fast (up to the bound); guessed, each replica's is within 20% of its truth."""
    fleet = parse_fleet("2:prefill=20000+2:prefill=5000", ReplicaConfig())
    workload = make_workload("no-sharing", 0, {"requests": "600"})
    res = ClusterSim(workload, make_policy("predicted_ttft"), fleet=fleet, plain=0.5).run()
    for rec in res.replicas:
        assert rec.learned_prefill_tokens_per_s == pytest.approx(
            rec.prefill_tokens_per_s, rel=0.2
        ), rec


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_the_plain_share_is_a_share(share: float) -> None:
    workload = make_workload("no-sharing", 0, {"requests": "10"})
    with pytest.raises(ConfigError, match="plain"):
        ClusterSim(workload, make_policy("round_robin"), plain=share)


def test_whole_answers_leaving_the_window_leave_the_count() -> None:
    """The window keeps the last 64 first tokens, whole answers among them: eight first tokens
    after 64 whole answers are eight observations that warm the replica up."""
    speed = ReplicaSpeed(SpeedConfig(window=64, min_observations=8))
    for i in range(64):
        speed.observe_first_token(0.0, 0.0, False, 1000 + i, 0.3, after=(0.0, 10.0, 0.0))
    assert not speed.warmed_up
    for i in range(7):
        speed.observe_first_token(0.0, 0.0, False, 1000 + i, 0.1)
    assert not speed.warmed_up
    speed.observe_first_token(0.0, 0.0, False, 2000, 0.2)
    assert speed.warmed_up and speed.whole_observations == 64


def test_what_a_whole_answer_is_taken_as() -> None:
    """Its own uncached tokens are the replica's count when reported; its decode phase is
    ``output - 1`` steps; it keeps its place among the dispatches and whether the replica was
    decoding when it was sent. Only one sequence with a known output of at least one token."""
    tracker = LoadTracker(speed=SpeedConfig(decode_step_s=0.015))
    now = answers(tracker, 20, whole=False)
    window = tracker[R0].speed._prefill
    send(tracker, "x", 1000, 5, now)
    tracker.observe_usage("x", 1000, 600)
    tracker.complete("x", now + 0.5, 5, whole=True)
    x = window[-1]
    assert (x.own, x.after, x.decoding, x.seconds) == (400, (0, 4, 0), False, 0.5)
    assert x.own_context == 400 * (600 + 400 / 2) / 1000  # 400 tokens after 600 cached
    send(tracker, "long", 500, 400, now + 1)  # streamed: its first token seen, then decoding
    tracker.first_token("long", now + 1.1)
    send(tracker, "one", 300, 1, now + 1.2)
    tracker.complete("one", now + 1.3, 1, whole=True)
    one = window[-1]
    assert one.whole and one.after == (0, 0, 0) and one.decoding and one.seq == x.seq + 2
    taken = tracker[R0].speed.whole_observations
    for output in (None, 0):
        send(tracker, "none", 300, 5, now + 2)
        tracker.complete("none", now + 2.5, output, whole=True)
    tracker.dispatch(
        RequestView("n2", (), 16, 300, 300, 5, sequences=2),
        Decision(R0, DecisionReason.LEAST_LOADED, 0),
        now + 3,
    )
    tracker.complete("n2", now + 3.5, 10, whole=True)
    tracker.dispatch(
        RequestView("batch", (), 16, 300, 300, 5, batch=True),
        Decision(R0, DecisionReason.LEAST_LOADED, 0),
        now + 4,
    )
    tracker.complete("batch", now + 4.5, 10, whole=True)
    assert tracker[R0].speed.whole_observations == taken


def test_the_router_passes_whole_on() -> None:
    router = Router(make_policy("round_robin"), BlockHasher(16), seed=0)
    router.add_replica(R0)
    view = router.view("a", tokens=list(range(200)), output_tokens=5)
    router.route(view, 0.0)
    router.complete("a", 0.4, 5, whole=True)
    assert router.replica_load(R0).speed.whole_observations == 1
