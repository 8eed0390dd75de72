"""A replica's batch slots (core/batch_slots.py): the size told or learned from the engine's
reports, the wait for a free slot, and that wait in predicted_ttft's prediction.

Expected values are worked from the module docstrings: a slot frees per completion, at the
replica's recent completion rate (completions decayed over ``RATE_WINDOW_S``, divided by it),
at least one per window; a batch size is learned after ``FULL_REPORTS`` reports at the largest
running count with requests waiting.
"""

from __future__ import annotations

import math

import pytest

from prefixroute.core import ConfigError, Router, RoutingContext, SpeedPrior
from prefixroute.core.batch_slots import FULL_REPORTS, RATE_WINDOW_S, BatchSlots
from prefixroute.core.load import LoadTracker

from .helpers import R0, R1, busy, context, make_router, prime, router_over, tokens


def test_the_batch_size_is_learned_after_full_reports_at_the_largest_count() -> None:
    slots = BatchSlots()
    slots.report(running=3, waiting=0)
    slots.report(running=8, waiting=0)  # the largest count, nobody waiting: not full
    for _ in range(FULL_REPORTS - 1):
        slots.report(running=8, waiting=2)
    assert slots.size is None
    assert slots.source is None
    slots.report(running=8, waiting=1)
    assert (slots.size, slots.source) == (8, "learned")


def test_a_running_count_the_engine_exceeded_is_no_cap() -> None:
    slots = BatchSlots()
    for _ in range(FULL_REPORTS):
        slots.report(running=8, waiting=3)
    assert slots.size == 8
    slots.report(running=9, waiting=0)
    assert slots.size is None
    for _ in range(FULL_REPORTS):
        slots.report(running=9, waiting=1)
    assert slots.size == 9


def test_requests_waiting_beside_a_smaller_batch_do_not_make_a_cap() -> None:
    # vLLM keeps requests waiting while a long prompt takes a step's budget, with few running:
    # the largest count, not the latest, is the candidate.
    slots = BatchSlots()
    slots.report(running=40, waiting=0)
    for _ in range(5 * FULL_REPORTS):
        slots.report(running=1, waiting=1)
        slots.report(running=0, waiting=4)
    assert slots.size is None
    assert slots.wait_s(in_flight=100, now=0.0) == 0.0


def test_a_batch_of_one_is_learned_and_an_empty_one_is_no_batch() -> None:
    # vLLM's --max-num-seqs 1: one running, the rest waiting, report after report.
    one = BatchSlots()
    for _ in range(FULL_REPORTS):
        one.report(running=1, waiting=4)
    assert one.size == 1
    # Nothing running while requests wait (an engine that has not started its batch): no cap.
    empty = BatchSlots()
    for _ in range(2 * FULL_REPORTS):
        empty.report(running=0, waiting=4)
    assert empty.size is None


def test_a_replicas_speed_report_gives_its_batch_size_and_where_it_came_from() -> None:
    tracker = LoadTracker()
    tracker.add_replica(R0)
    tracker.add_replica(R1, SpeedPrior(max_running=16))
    report = tracker[R0].speed_report()
    assert (report["batch_slots"], report["batch_slots_from"]) == (None, None)
    tracker.observe(R0, max_running=48)
    report = tracker[R0].speed_report()
    assert (report["batch_slots"], report["batch_slots_from"]) == (48, "engine")
    report = tracker[R1].speed_report()
    assert (report["batch_slots"], report["batch_slots_from"]) == (16, "told")


def test_a_told_size_needs_no_reports_and_outlasts_them() -> None:
    slots = BatchSlots(told=4)
    assert slots.size == 4
    slots.report(running=9, waiting=5)
    assert slots.size == 4


def test_the_wait_counts_the_completions_ahead_at_the_recent_rate() -> None:
    slots = BatchSlots(told=4)
    for _ in range(20):
        slots.completed(0.0)  # 20 completions: 2 per second over a 10 s window
    rate = 20 / RATE_WINDOW_S
    assert slots.completion_rate(0.0) == pytest.approx(rate)
    assert slots.wait_s(in_flight=3, now=0.0) == 0.0  # a slot is free
    assert slots.wait_s(in_flight=4, now=0.0) == pytest.approx(1 / rate)
    assert slots.wait_s(in_flight=6, now=0.0) == pytest.approx(3 / rate)
    # A window later the rate has decayed by e, and the wait has grown by as much.
    assert slots.wait_s(in_flight=4, now=RATE_WINDOW_S) == pytest.approx(math.e / rate)


def test_a_replica_that_finished_nothing_counts_one_completion_per_window() -> None:
    slots = BatchSlots(told=2)
    assert slots.wait_s(in_flight=2, now=5.0) == pytest.approx(RATE_WINDOW_S)
    assert slots.wait_s(in_flight=3, now=5.0) == pytest.approx(2 * RATE_WINDOW_S)
    assert BatchSlots().wait_s(in_flight=1000, now=5.0) == 0.0  # size unknown: no wait


# --- the wait in predicted_ttft's prediction ---------------------------------------------------

RATE, STEP, DECODE = 10_000.0, 2048, 0.015  # predicted_ttft's defaults


def _full_r0(**params: object) -> object:
    """A router whose r0 runs 2 slots, both taken by decoding requests, nothing completed."""
    router = router_over("predicted_ttft", [], params=params)
    router.add_replica(R0, speed=SpeedPrior(max_running=2))
    router.add_replica(R1)
    busy(router, R0, 2, prefilled=True)
    return router


def test_a_full_batch_adds_the_wait_for_a_slot_to_the_predicted_ttft() -> None:
    router = _full_r0(arrivals=0.0)
    ctx = context(router, tokens(1000))
    # Nothing queued for prefill, so the whole slot wait counts: 1 completion at the floor of
    # one per window; then the prompt, one step with decodes, half a step in progress.
    expected = RATE_WINDOW_S + 1000 / RATE + 1.5 * DECODE
    assert router.policy.predict(ctx, R0) == pytest.approx(expected)  # type: ignore[attr-defined]
    off = _full_r0(arrivals=0.0, batch_slots=False)
    plain = 1000 / RATE + 1.5 * DECODE
    assert off.policy.predict(context(off, tokens(1000)), R0) == pytest.approx(plain)  # type: ignore[attr-defined]


def _one_slot_behind(queued: int) -> tuple[Router, RoutingContext]:
    """A router whose r0 runs 1 slot, freed every 1/3 s, taken by a request with ``queued``
    tokens still to prefill; and a context for a fresh 1,000-token prompt."""
    router = router_over("predicted_ttft", [], params={"arrivals": 0.0})
    router.add_replica(R0, speed=SpeedPrior(max_running=1))
    for _ in range(30):
        router.loads.get(R0).slots.completed(0.0)  # 3 per second: a slot in 1/3 s
    busy(router, R0, 1, prompt=queued)
    return router, context(router, tokens(1000, start=90_000))


def test_a_prefill_queue_longer_than_the_slot_wait_is_not_counted_twice() -> None:
    router, ctx = _one_slot_behind(5000)  # 0.5 s of prefill queued, longer than the slot wait
    expected = 6000 / RATE  # the queue and ours; nothing decodes yet
    assert router.policy.predict(ctx, R0) == pytest.approx(expected)  # type: ignore[attr-defined]


def test_a_prefill_queue_shorter_than_the_slot_wait_leaves_the_rest_of_the_wait() -> None:
    """The slot wait and the queue ahead overlap: what is added is the wait past the queue's
    own time, in seconds at the replica's rate."""
    router, ctx = _one_slot_behind(1000)  # 0.1 s of prefill queued, shorter than the slot wait
    expected = 2000 / RATE + (1 / 3 - 1000 / RATE)  # the queue and ours, then the rest
    assert router.policy.predict(ctx, R0) == pytest.approx(expected)  # type: ignore[attr-defined]


def test_a_cached_prefix_on_a_full_batch_loses_to_a_free_slot() -> None:
    for batch_slots, home in ((True, R1), (False, R0)):
        router = _full_r0(batch_slots=batch_slots)
        prime(router, R0, tokens(4000))
        decision = router.route(router.view("q", tokens=tokens(4100)), 0.0)
        assert decision.replica == home


# --- told: a replica's max_running ------------------------------------------------------------


@pytest.mark.parametrize("value", [8, 8.0])
def test_max_running_is_a_whole_number_of_requests(value: float) -> None:
    prior = SpeedPrior.from_mapping({"max_running": value})
    assert prior.max_running == 8 and isinstance(prior.max_running, int)
    assert not prior.has_speeds


@pytest.mark.parametrize("value", [0, -1, 8.5, True, "8", float("inf")])
def test_a_bad_max_running_is_a_config_error(value: object) -> None:
    with pytest.raises(ConfigError, match="max_running"):
        SpeedPrior.from_mapping({"max_running": value})


def test_a_batch_size_alone_leaves_the_speed_to_be_learned() -> None:
    tracker = LoadTracker()
    tracker.add_replica(R0, SpeedPrior(max_running=16))
    load = tracker[R0]
    assert load.slots.size == 16
    assert not load.told and not load.speed_known  # speeds: the fleet's, then its own
    tracker.add_replica(R1, SpeedPrior(prefill_tokens_per_s=5000.0, max_running=4))
    assert tracker[R1].told and tracker[R1].slots.size == 4


def test_a_batch_size_told_after_registration_is_taken() -> None:
    tracker = LoadTracker()
    tracker.add_replica(R0)
    assert tracker.tell(R0, SpeedPrior(max_running=32))
    assert tracker[R0].slots.size == 32 and not tracker[R0].told
    assert not tracker.tell(R1, SpeedPrior(max_running=32))  # not registered


def test_engine_reports_through_the_router_teach_the_batch_size() -> None:
    router = make_router("predicted_ttft", n=2)
    for _ in range(FULL_REPORTS):
        router.observe_replica(R0, num_running=6, num_waiting=2)
    assert router.replica_load(R0).slots.size == 6
    assert router.replica_load(R1).slots.size is None


# --- said: the engine's own word (SGLang's /get_server_info, gateway/_server_info.py) ---------


def test_a_size_the_engine_said_is_known_at_once_and_outranks_its_counts() -> None:
    slots = BatchSlots()
    slots.report(running=None, waiting=None, max_running=12)
    assert (slots.size, slots.source) == (12, "engine")
    for _ in range(2 * FULL_REPORTS):  # counts that would teach 5: the engine's word stands
        slots.report(running=5, waiting=3)
    assert slots.size == 12
    slots.report(running=5, waiting=3, max_running=20)  # it restarted with another size
    assert slots.size == 20


def test_an_operators_size_outranks_the_engines_word() -> None:
    slots = BatchSlots(told=4)
    slots.report(running=1, waiting=0, max_running=12)
    assert (slots.size, slots.source) == (4, "told")


def test_the_size_an_engine_said_through_the_router_puts_the_wait_in_the_prediction() -> None:
    router = router_over("predicted_ttft", [], params={"arrivals": 0.0})
    router.add_replica(R0)
    router.add_replica(R1)
    router.observe_replica(R0, max_running=2)
    assert router.replica_load(R0).slots.size == 2
    assert router.replica_load(R1).slots.size is None
    busy(router, R0, 2, prefilled=True)
    expected = RATE_WINDOW_S + 1000 / RATE + 1.5 * DECODE  # as told: one completion ahead
    assert router.policy.predict(context(router, tokens(1000)), R0) == pytest.approx(expected)  # type: ignore[attr-defined]


# --- what a request sent to a full batch teaches ----------------------------------------------


def _sent(tracker: LoadTracker, rid: str, now: float) -> None:
    from prefixroute.core import Decision, DecisionReason, RequestView

    view = RequestView(rid, (), 1, 500, 500, output_tokens=20)
    tracker.dispatch(view, Decision(R0, DecisionReason.LEAST_LOADED, 0), now)


@pytest.mark.parametrize("whole", [False, True])
def test_a_request_that_waited_for_a_slot_teaches_no_prefill_rate(whole: bool) -> None:
    tracker = LoadTracker()
    # Its speeds given too: a whole answer's queue ahead then counts (InFlight.queue_known).
    tracker.add_replica(R0, SpeedPrior(10_000.0, max_running=1))
    _sent(tracker, "a", 0.0)  # a slot is free
    _sent(tracker, "b", 0.0)  # the only slot is a's: b waits for a to finish
    for rid, first, end in (("a", 0.05, 0.4), ("b", 0.45, 0.8)):
        if not whole:
            tracker.first_token(rid, first)
        tracker.complete(rid, end, output_tokens=20, whole=whole)
    speed = tracker[R0].speed
    assert speed.prefill_observations == 1  # a's only
    assert speed.decode_observations == (0 if whole else 2)  # a decode phase is no slot wait
