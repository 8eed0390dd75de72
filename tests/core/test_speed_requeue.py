"""A first token's queue is taken again at each refit's estimates (``core/speed.py``, *How
queued work turns into waiting*).

The load view credits a busy replica with the progress its estimated rate would have made on its
queue. While a replica is cold its estimate is a prior: a replica four times slower than the
prior is credited with four times the progress it made, so the work left ahead of each request
sent into its backlog is understated. Kept as it was at dispatch, that turned into a first-token
overhead the replica does not have (353 ms on a simulated replica with none), and the replica
was hardly sent anything again. Taken again at the estimates each refit starts from, the same
first tokens teach the replica's true rate and no overhead.
"""

from __future__ import annotations

import pytest

from prefixroute.core.load import LoadTracker
from prefixroute.core.speed import QueuedObs, ReplicaSpeed, SpeedConfig

TRUE_RATE = 2_500.0  # tokens/s: four times slower than the prior
PRIOR = 10_000.0


def serve_fifo(tracker: LoadTracker, arrivals: list[tuple[float, int]]) -> None:
    """One replica prefilling ``(arrival time, tokens)`` requests one after another at
    ``TRUE_RATE`` with no decoding and no fixed cost; each ends at its first token."""
    free_at = 0.0
    events: list[tuple[float, int, str]] = []  # (time, kind: 0 dispatch / 1 first token, id)
    for i, (t, tokens) in enumerate(arrivals):
        free_at = max(free_at, t) + tokens / TRUE_RATE
        events += [(t, 0, f"q{i}"), (free_at, 1, f"q{i}")]
    sizes = {f"q{i}": tokens for i, (_, tokens) in enumerate(arrivals)}
    for now, kind, rid in sorted(events):
        if kind == 0:
            tracker.count_dispatch(
                rid, "r0", prompt_tokens=sizes[rid], output_tokens=1,
                predicted_cached_tokens=0, now=now,
            )  # fmt: skip
        else:
            tracker.first_token(rid, now)
            tracker.complete(rid, now, output_tokens=1)


def backlog_then_idle() -> list[tuple[float, int]]:
    """A cold replica sent a burst of 12 (each request behind the others), then 4 requests, 5 s
    apart, that find it idle."""
    burst = [(0.04 * i, 1_000 + 50 * (i % 7)) for i in range(12)]
    return burst + [(10.0 + 5.0 * i, 256) for i in range(4)]


def test_a_backlog_met_while_cold_does_not_make_the_replica_look_slow() -> None:
    tracker = LoadTracker(speed=SpeedConfig(prefill_tokens_per_s=PRIOR, learn_overhead=True))
    serve_fifo(tracker, backlog_then_idle())
    speed = tracker["r0"].speed
    assert speed.warmed_up
    # The four idle first tokens were taught, not thrown out as outliers of a fit that took
    # the backlog's queue at the prior's rate (there: a 172 ms overhead, 4 left out).
    assert speed.outliers == 0
    # So an idle request is predicted near its true first token (0.102 s; before: 0.246 s).
    assert speed.ttft_s(256, 0.0) == pytest.approx(256 / TRUE_RATE, rel=0.15)
    assert speed.first_token_overhead_s < 0.1


def test_an_observation_keeps_its_queue_and_follows_the_estimates() -> None:
    speed = ReplicaSpeed(SpeedConfig(prefill_tokens_per_s=PRIOR, min_observations=100))
    # 4,000 tokens queued, the replica on them for 0.2 s, 500 of its own.
    obs = speed.observe_first_token(4_000.0, 0.2, False, 500.0, 1.9)
    assert isinstance(obs, QueuedObs)
    # At 10,000 tokens/s the replica is credited 2,000 tokens: 2,000 left + 500 own.
    assert obs.x[0] == pytest.approx(2_500.0)
    assert speed.queue_work(4_000.0, 0.2, False, 500.0)[0] == pytest.approx(2_500.0)
    speed.prefill_tokens_per_s = 2_500.0  # as a refit would set it
    speed._refit()  # takes the queue again at the estimates it starts from
    # Credited at the rate the refit started from (2,500 tokens/s: 500 done), then refitted.
    assert obs.x[0] == pytest.approx(4_000.0 - 500.0 + 500.0)
    # The replica's own count corrects the request's own tokens, the queue stays.
    speed.correct_prefill(obs, 100.0)
    assert obs.own == 100.0
    assert obs.x[0] == pytest.approx(4_000.0 - 0.2 * speed.prefill_tokens_per_s + 100.0)


def test_the_load_view_hands_over_the_queue_as_it_was_at_dispatch() -> None:
    """What the speed model is handed for a first token, worked by hand: the queue in full,
    how long the replica had been on it, whether it was decoding, and the replica's own
    uncached count once reported."""
    tracker = LoadTracker(speed=SpeedConfig(prefill_tokens_per_s=PRIOR, min_observations=100))

    def send(rid: str, tokens: int, now: float, output_tokens: int = 1) -> None:
        tracker.count_dispatch(
            rid, "r0", prompt_tokens=tokens, output_tokens=output_tokens,
            predicted_cached_tokens=0, now=now,
        )  # fmt: skip

    send("c", 100, 0.0, output_tokens=50)
    tracker.first_token("c", 0.05)  # c decodes from here on
    send("a", 4_000, 1.0)  # an idle queue: the replica starts on it at 1.0
    send("b", 500, 1.2)  # behind a's 4,000 tokens, 0.2 s into them, while c decodes
    tracker.first_token("a", 1.5)
    tracker.first_token("b", 1.7)
    tracker.observe_usage("b", prompt_tokens=500, cached_tokens=100)  # 400 computed, not 500
    tracker.complete("b", 1.8, output_tokens=1)
    speed = tracker["r0"].speed
    obs = list(speed._prefill)[-1]
    assert isinstance(obs, QueuedObs)
    assert (obs.queued, obs.elapsed_s, obs.decoding, obs.own) == (
        4_000.0, pytest.approx(0.2), True, 400.0
    )
    # At the prior: one step is 2,048 / 10,000 + 0.015 s; 0.2 s is one step started, so
    # (0.2 - 0.015) x 10,000 = 1,850 tokens done; 2,150 left + 400 own = 2,550 tokens, over
    # ceil(2,550 / 2,048) + 0.5 = 2.5 decode-carrying steps.
    assert obs.x[0] == pytest.approx(2_550.0)
    assert obs.x[1] == pytest.approx(2.5)
    assert obs.seconds == pytest.approx(0.5)


def test_what_the_requests_ahead_really_computed_corrects_the_queue_behind_them() -> None:
    """core/queue_fixes.py: a replica holds less than predicted (every request predicted
    half cached computes in full). The queue each first token waited behind was the requests
    ahead's full prompts, not the predicted halves: their usage reports say so, and the rate
    comes out true. With the queue counted at the predictions (the requests' own tokens
    corrected, as before), it came out at 1,448 tokens/s, 42% low."""

    def run(report: bool) -> float:
        tracker = LoadTracker(speed=SpeedConfig(prefill_tokens_per_s=TRUE_RATE))
        free_at, events = 0.0, []
        for i in range(60):  # a request every 0.3 s, 1,000 tokens each: always a backlog
            t = 0.3 * i
            free_at = max(free_at, t) + 1_000 / TRUE_RATE
            events += [(t, 0, f"q{i}"), (free_at, 1, f"q{i}")]
        for now, kind, rid in sorted(events):
            if kind == 0:
                tracker.count_dispatch(
                    rid, "r0", prompt_tokens=1_000, output_tokens=1,
                    predicted_cached_tokens=500, now=now,
                )  # fmt: skip
            else:
                tracker.first_token(rid, now)
                if report:  # the replica's usage: nothing was cached
                    tracker.observe_usage(rid, prompt_tokens=1_000, cached_tokens=0)
                tracker.complete(rid, now, output_tokens=1)
        return tracker["r0"].speed.prefill_tokens_per_s

    assert run(report=True) == pytest.approx(TRUE_RATE, rel=0.05)


def obs_of(tracker: LoadTracker) -> list[QueuedObs]:
    return [o for o in tracker["r0"].speed._prefill if isinstance(o, QueuedObs)]


def test_a_correction_reaches_observations_taken_before_it_and_only_those_behind() -> None:
    tracker = LoadTracker(speed=SpeedConfig(prefill_tokens_per_s=PRIOR, min_observations=100))

    def send(rid: str, now: float) -> None:
        tracker.count_dispatch(rid, "r0", prompt_tokens=1_000, output_tokens=1,
                               predicted_cached_tokens=600, now=now)  # fmt: skip

    send("a", 0.0)  # 400 predicted
    send("b", 0.01)  # behind a
    tracker.first_token("a", 0.2)
    send("c", 0.3)  # after a's first token: not behind it
    tracker.first_token("b", 0.4)
    tracker.complete("b", 0.4, output_tokens=1)  # b's observation is taken before a reports
    tracker.first_token("c", 0.6)
    tracker.complete("c", 0.6, output_tokens=1)
    obs = {o.seq: o for o in obs_of(tracker)}
    assert (obs[2].queued, obs[3].queued) == (400.0, 400.0)  # b behind a, c behind b
    tracker.observe_usage("a", prompt_tokens=1_000, cached_tokens=0)  # a computed 1,000
    tracker.complete("a", 0.7, output_tokens=1)
    assert obs[2].queued == 1_000.0  # b waited behind a's real 1,000
    assert obs[3].queued == 400.0  # c never waited behind a
    send("d", 1.0)  # an idle replica: nothing ahead, nothing to correct
    tracker.first_token("d", 1.1)
    tracker.complete("d", 1.1, output_tokens=1)
    assert [o.queued for o in obs_of(tracker) if o.seq == 4] == [0.0]


def test_a_plain_answer_reports_before_its_first_token_is_counted() -> None:
    # A plain (non-streamed) answer arrives whole: its usage comes before complete() marks its
    # first token. The requests dispatched behind it so far waited for what it computed.
    tracker = LoadTracker(speed=SpeedConfig(prefill_tokens_per_s=PRIOR, min_observations=100))
    for rid, now in (("a", 0.0), ("b", 0.01)):
        tracker.count_dispatch(rid, "r0", prompt_tokens=1_000, output_tokens=1,
                               predicted_cached_tokens=600, now=now)  # fmt: skip
    tracker.observe_usage("a", prompt_tokens=1_000, cached_tokens=0)  # 1,000, not 400
    tracker.complete("a", 0.3, output_tokens=1)
    tracker.first_token("b", 0.4)
    tracker.complete("b", 0.4, output_tokens=1)
    assert [o.queued for o in obs_of(tracker)] == [1_000.0]  # b's, behind a's real work
