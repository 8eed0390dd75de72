"""A guessed first token waits its turn, and a stream's first token passes the plain answers
sent before it (core/plain_answers.py).

From the module docstring: engines admit requests in arrival order, so a guess that finds a
request sent to the same replica before it still without a first token is not taken, and the
caller is told to ask again after the time the work still ahead should take; a first token seen
on a request sent after a plain answer takes that answer's first token as come, guessed or not.
"""

from __future__ import annotations

import pytest

from prefixroute.core import (
    LoadTracker,
    ReplicaId,
    Router,
    SpeedConfig,
    make_policy,
)
from prefixroute.sim import ClusterSim, make_workload

from .helpers import send

R0 = ReplicaId("r0")
RATE = 5_000.0  # the replica's true prefill rate, tokens/s


def warm(tracker: LoadTracker) -> float:
    """Streams one after another until the replica's speed is its own; the time after."""
    now = 0.0
    for i in range(20):
        prompt = 500 + 100 * (i % 5)
        send(tracker, f"w{i}", prompt, 10, now)
        tracker.first_token(f"w{i}", now + prompt / RATE)
        tracker.complete(f"w{i}", now + prompt / RATE + 0.2, 10)
        now += 1.0
    assert tracker[R0].speed.warmed_up
    return now


def test_a_guess_waits_for_the_requests_sent_before_it() -> None:
    tracker = LoadTracker(speed=SpeedConfig(decode_step_s=0.0, fleet_prior=False))
    now = warm(tracker)
    send(tracker, "a", 3000, 10, now)  # a stream, its first token late
    send(tracker, "b", 2000, 10, now)  # a plain answer behind it
    due = tracker.first_token_due("b")
    assert due is not None
    rate = tracker[R0].speed.prefill_tokens_per_s
    again = tracker.guess_first_token("b", now + due)
    # a's 3,000 tokens are done by then at the learned rate (due covers 5,000): b's own are left.
    assert again == pytest.approx(2000 / rate, rel=1e-6)
    assert tracker[R0].prefilling == 2 and tracker[R0].queued_prefill_tokens == 5000
    tracker.first_token("a", now + due + 0.5)  # a came, late
    assert tracker.guess_first_token("b", now + due + 0.5 + again) is None
    assert tracker[R0].prefilling == 0 and tracker[R0].queued_prefill_tokens == 0
    assert tracker.guess_first_token("b", now + 10) is None  # taken already: nothing to do


def test_the_wait_is_the_work_still_ahead_at_the_learned_speed() -> None:
    """Two requests ahead (both counted), a replica decoding meanwhile (each step carries a
    decode step), part of the queue already done (credited at the learned rate)."""
    tracker = LoadTracker(speed=SpeedConfig(fleet_prior=False))
    now = warm(tracker)
    speed = tracker[R0].speed
    assert speed.decode_step_s > 0
    send(tracker, "d", 100, 10, now)
    tracker.first_token("d", now + 0.02)  # decoding from here on
    start = now + 0.1
    send(tracker, "a", 3000, 10, start)  # the replica starts on its queue here
    send(tracker, "a2", 1000, 10, start)
    send(tracker, "b", 2000, 10, start)
    assert tracker.first_token_due("b") is not None
    for elapsed in (0.0, 0.3):
        done = speed.progress(4000, elapsed, True)
        assert 0 < done < 4000 or elapsed == 0
        work = 4000 - done + 2000
        want = speed.prefill_s(work) + speed.steps(work, True) * speed.decode_step_s
        assert tracker.guess_first_token("b", start + elapsed) == pytest.approx(want, rel=1e-9)


def test_a_guess_with_nothing_ahead_is_taken_and_teaches_nothing() -> None:
    tracker = LoadTracker(speed=SpeedConfig(decode_step_s=0.0, fleet_prior=False))
    now = warm(tracker)
    speed = tracker[R0].speed
    seen = speed.prefill_observations
    send(tracker, "a", 1000, 10, now)
    assert tracker.first_token_due("a") is not None
    assert tracker.guess_first_token("a", now + 0.2) is None
    assert tracker[R0].prefilling == 0 and tracker[R0].queued_prefill_tokens == 0
    tracker.complete("a", now + 5.0, 10)  # not said whole: its time means nothing
    assert speed.prefill_observations == seen
    assert tracker.guess_first_token("nobody", now) is None


def test_a_later_stream_passes_the_plain_answers_before_it_only() -> None:
    """Cold (no guess is made), the plain answer would count as queued until its end."""
    tracker = LoadTracker(speed=SpeedConfig(fleet_prior=False))
    send(tracker, "early", 700, 10, 0.0)  # a stream, its first token not seen yet
    send(tracker, "plain", 1000, 10, 0.0)
    assert tracker.first_token_due("plain") is None  # cold: no guess, but now known unseen
    send(tracker, "late", 400, 10, 0.0)
    send(tracker, "plain-after", 900, 10, 0.0)
    assert tracker.first_token_due("plain-after") is None
    tracker.first_token("late", 0.5)
    load = tracker[R0]
    # "plain" is through (sent before "late"); "early" is a stream: its own token will tell;
    # "plain-after" was sent after "late".
    assert load.prefilling == 2 and load.queued_prefill_tokens == 700 + 900


def test_heard_first_tokens_pass_plain_answers_too() -> None:
    """Another instance's first token (heard, not measured) is a first token all the same."""
    tracker = LoadTracker(speed=SpeedConfig(fleet_prior=False))
    send(tracker, "plain", 1000, 10, 0.0)
    tracker.first_token_due("plain")
    send(tracker, "remote", 400, 10, 0.0)
    tracker.first_token("remote", 0.5, measured=False)
    assert tracker[R0].prefilling == 0


def test_the_router_passes_the_guess_on() -> None:
    router = Router(make_policy("least_loaded"), speed=SpeedConfig(fleet_prior=False))
    router.add_replica(R0)
    view = router.view("a", tokens=list(range(64)), output_tokens=4)
    router.route(view, 0.0)
    assert router.first_token_due("a") is None  # cold
    assert router.guess_first_token("a", 0.1) is None
    assert router.replica_load(R0).prefilling == 0


def test_half_plain_answers_on_equal_replicas_never_misjudge_a_speed() -> None:
    """Four equal replicas, half the answers plain. Before the order rule, the plain answers
    nobody guessed (a replica still cold) stayed in the queue each stream was learned behind,
    and at some point of the run every replica was held 4.2-11.5x faster than it is; with it,
    no sample strays more than 1.5x (1.07-1.23x) either way."""
    workload = make_workload("no-sharing", 0, {"requests": "600"})
    res = ClusterSim(workload, make_policy("predicted_ttft"), plain=0.5, trace_speeds=True).run()
    assert len(res.speed_trace) == 600
    for sample in res.speed_trace:
        ratio = sample.learned_prefill_tokens_per_s / sample.prefill_tokens_per_s
        assert 1 / 1.5 <= ratio <= 1.5, sample


def test_the_order_stays_small_behind_a_request_that_never_prefills() -> None:
    """A stream that hangs (or another instance's request whose end was lost) holds the front
    of the order: the requests that pass behind it must not pile up there until it ends."""
    tracker = LoadTracker()
    send(tracker, "stuck", 500, 10, 0.0)
    longest = 0
    for i in range(1000):
        send(tracker, f"r{i}", 500, 10, i * 0.1)
        longest = max(longest, len(tracker[R0].unprefilled))
        tracker.first_token(f"r{i}", i * 0.1 + 0.05)
        tracker.complete(f"r{i}", i * 0.1 + 0.08, 10)
    load = tracker[R0]
    assert load.prefilling == 1
    # Dropped at a dispatch once they number more than 2 x the waiting ones (the stuck one)
    # + 8; the new one joins after.
    assert longest <= 2 * 1 + 8 + 1
    assert not load.unprefilled[0].prefilled


def test_behind_a_first_token_that_never_comes_the_guess_backs_off() -> None:
    """The work ahead overdue by the model (a request routed and not sent yet, another
    instance's whose news was lost): the wait doubles from MIN_RECHECK_S at each guess put off,
    up to MAX_RECHECK_S. It was asked again every millisecond, 30,000 times in 30 s."""
    from prefixroute.core.plain_answers import MAX_RECHECK_S, MIN_RECHECK_S

    tracker = LoadTracker(speed=SpeedConfig(decode_step_s=0.0, fleet_prior=False))
    now = warm(tracker)
    send(tracker, "a", 3000, 10, now)  # its first token never comes
    tracker.count_dispatch(  # nothing of its own to compute
        "b", R0, prompt_tokens=3000, output_tokens=10, predicted_cached_tokens=3000, now=now
    )
    assert tracker.first_token_due("b") is not None
    t = now + 3000 / RATE  # a's work is done by the model's count from here on
    waits = []
    while t < now + 30:
        again = tracker.guess_first_token("b", t)
        assert again is not None  # never taken while a is ahead
        waits.append(again)
        t += again
    assert waits[:3] == pytest.approx([MIN_RECHECK_S, 2 * MIN_RECHECK_S, 4 * MIN_RECHECK_S])
    assert max(waits) == MAX_RECHECK_S and len(waits) < 30 / MAX_RECHECK_S + 20
    tracker.first_token("a", t)  # it comes at last: the guess is taken at the next ask
    assert tracker.guess_first_token("b", t) is None
