"""A replica's own speed priors (``SpeedPrior``), where its operator knows them: it predicts
with them until warmed up, not with the fleet's constants or its learned median, and routing
compares replicas at them from the first request (core/speed_config.py, core/load.py)."""

from __future__ import annotations

import math

import pytest

from prefixroute.core import (
    ConfigError,
    LoadTracker,
    ReplicaId,
    Router,
    SpeedConfig,
    SpeedPrior,
    make_policy,
)

from .test_fleet_prior import COLD, learned_requests, warm_fleet

KNOWN = ReplicaId("known")


def test_its_priors_replace_the_fleet_s_and_its_bounds_follow_them() -> None:
    fleet = SpeedConfig(prefill_tokens_per_s=10_000.0, decode_step_s=0.015, bound=20.0)
    own = SpeedPrior(prefill_tokens_per_s=40_000.0).applied_to(fleet)
    assert (own.prefill_tokens_per_s, own.decode_step_s) == (40_000.0, 0.015)  # step: the fleet's
    assert own.within_bounds(1e9, 0.015, 0.0, 0.0)[0] == 40_000.0 * 20  # bounded around its own
    both = SpeedPrior(decode_step_s=0.0).applied_to(fleet)
    assert (both.prefill_tokens_per_s, both.decode_step_s) == (10_000.0, 0.0)


@pytest.mark.parametrize(
    "prior",
    [{"prefill_tokens_per_s": 0.0}, {"prefill_tokens_per_s": -5.0},
     {"prefill_tokens_per_s": math.inf}, {"decode_step_s": -0.01}, {"decode_step_s": math.nan}],
)  # fmt: skip
def test_a_prior_that_is_no_speed_is_refused(prior: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        SpeedPrior(**prior)


def test_a_replica_with_its_own_priors_is_not_started_from_the_fleet() -> None:
    """The fleet's median replica learned 20,000 tokens/s: a cold replica takes that up, one
    whose operator said 40,000 keeps 40,000 until its own requests teach it otherwise."""
    tracker = warm_fleet()
    tracker.add_replica(KNOWN, SpeedPrior(prefill_tokens_per_s=40_000.0))
    learned_requests(tracker, 20)
    assert tracker.fleet_estimates() is not None
    cold_rate = tracker[COLD].speed.prefill_tokens_per_s
    assert cold_rate == pytest.approx(tracker.fleet_estimates()[0])  # type: ignore[index]
    assert cold_rate != pytest.approx(40_000.0, rel=0.2)
    assert tracker[KNOWN].speed.prefill_tokens_per_s == 40_000.0


def test_routing_compares_idle_replicas_at_their_own_priors() -> None:
    """Two idle replicas, nothing cached: an 8,000-token prompt's TTFT is 0.2 s on the one
    known to prefill 40,000 tokens/s and 0.8 s on one at the fleet's 10,000, so the default
    policy sends it to the first, whichever was added first."""
    for order in ((KNOWN, COLD), (COLD, KNOWN)):
        router = Router(make_policy("predicted_ttft"), seed=1)
        for replica in order:
            prior = SpeedPrior(prefill_tokens_per_s=40_000.0) if replica == KNOWN else None
            router.add_replica(replica, speed=prior)
        view = router.view("r1", tokens=list(range(8000)), output_tokens=16)
        assert router.route(view, 0.0).replica == KNOWN


def test_a_plain_answer_s_first_token_is_guessed_at_given_priors_from_the_start() -> None:
    """A speed its operator gave is the replica's own: a plain answer's first token is guessed
    at it before anything is learned (an idle replica, 8,000 uncached tokens at 40,000 tokens/s:
    0.2 s), and its whole answer teaches. A replica at the fleet's priors guesses nothing."""
    from prefixroute.core import LoadTracker

    tracker = LoadTracker()
    tracker.add_replica(KNOWN, SpeedPrior(prefill_tokens_per_s=40_000.0, decode_step_s=0.0))
    tracker.add_replica(COLD)
    for replica in (KNOWN, COLD):
        tracker.count_dispatch(f"p-{replica}", replica, prompt_tokens=8000, output_tokens=10,
                               predicted_cached_tokens=0, now=0.0)  # fmt: skip
    assert tracker.first_token_due(f"p-{KNOWN}") == pytest.approx(0.2)
    assert tracker.first_token_due(f"p-{COLD}") is None
    assert tracker.guess_first_token(f"p-{KNOWN}", 0.2) is None  # guessed: out of the queue
    assert tracker[KNOWN].queued_prefill_tokens == 0
    assert tracker[COLD].queued_prefill_tokens == 8000
    tracker.complete(f"p-{KNOWN}", 0.5, output_tokens=10, whole=True)
    assert tracker[KNOWN].speed.whole_observations == 1


def test_reports_say_whose_priors_a_replica_predicts_with() -> None:
    """Until a replica learned its own speed, the admin API and the fleet page say what its
    estimates are: the priors given for it ("given"), or the fleet's ("prior"), or the fleet's
    learned median ("fleet")."""
    tracker = warm_fleet()
    tracker.add_replica(KNOWN, SpeedPrior(prefill_tokens_per_s=40_000.0))
    assert tracker[KNOWN].speed_report()["estimates_from"] == "given"
    assert tracker[KNOWN].speed_report()["prior_prefill_tokens_per_s"] == 40_000.0
    learned_requests(tracker, 20)
    assert tracker[COLD].speed_report()["estimates_from"] == "fleet"
    assert tracker[KNOWN].speed_report()["estimates_from"] == "given"  # not the fleet's median


def test_priors_told_after_registration_count_while_its_speed_is_not_its_own() -> None:
    """``LoadTracker.tell``: a cold replica told its priors later (a Ray replica's routing
    stats) predicts with them, not the fleet's median, from then on; a replica that already
    has its own speed, given or learned, and one never registered, are left as they are."""
    tracker = warm_fleet()
    learned_requests(tracker, 20)
    fleet_rate = tracker[COLD].speed.prefill_tokens_per_s
    assert tracker.tell(COLD, SpeedPrior(prefill_tokens_per_s=40_000.0))
    assert tracker[COLD].speed.prefill_tokens_per_s == 40_000.0 != fleet_rate
    assert tracker[COLD].speed_known
    learned_requests(tracker, 20)  # the fleet's median is taken again: COLD keeps its own
    assert tracker[COLD].speed.prefill_tokens_per_s == 40_000.0
    assert not tracker.tell(COLD, SpeedPrior(prefill_tokens_per_s=1_000.0))  # given already
    warmed = tracker[ReplicaId("mid")].speed
    assert warmed.warmed_up
    before = warmed.prefill_tokens_per_s
    assert not tracker.tell(ReplicaId("mid"), SpeedPrior(prefill_tokens_per_s=1_000.0))
    assert tracker[ReplicaId("mid")].speed.prefill_tokens_per_s == before
    assert not tracker.tell(ReplicaId("nobody"), SpeedPrior(prefill_tokens_per_s=1_000.0))
    assert ReplicaId("nobody") not in tracker.replicas


def test_the_router_takes_priors_told_late_once() -> None:
    router = Router(make_policy("predicted_ttft"))
    router.add_replica(KNOWN)
    assert router.tell_speed(KNOWN, SpeedPrior(prefill_tokens_per_s=40_000.0))
    assert router.replica_load(KNOWN).speed.prefill_tokens_per_s == 40_000.0
    assert not router.tell_speed(KNOWN, SpeedPrior(prefill_tokens_per_s=1_000.0))
    assert router.replica_load(KNOWN).speed_report()["estimates_from"] == "given"


def test_priors_told_late_where_no_replica_starts_from_the_fleet() -> None:
    """With the fleet's median off, no replica waits in the cold set: telling one its priors
    still takes (it must not fail on a replica the cold set never held)."""
    tracker = LoadTracker(speed=SpeedConfig(fleet_prior=False))
    tracker.add_replica(KNOWN)
    assert tracker.tell(KNOWN, SpeedPrior(prefill_tokens_per_s=40_000.0))
    assert tracker[KNOWN].speed.prefill_tokens_per_s == 40_000.0


@pytest.mark.parametrize("rate", [math.nan, math.inf, 0.0, -1.0])
def test_the_fleets_prefill_rate_prior_is_positive_and_finite(rate: float) -> None:
    # A NaN passed "<= 0" and was refused under attention_s's name; an infinity was taken
    # ([policy_params] prefill_tokens_per_s in a config file; the CLI audit of 2026-12-07).
    from prefixroute.core import SpeedConfig

    with pytest.raises(ConfigError, match="prefill rate and step budget must be positive"):
        SpeedConfig(prefill_tokens_per_s=rate)
