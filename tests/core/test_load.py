"""Tests for prefixroute.core.load: dispatch / first token / completion bookkeeping."""

from __future__ import annotations

import contextlib
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixroute.core import (
    Decision,
    DecisionReason,
    LoadTracker,
    PrefixrouteError,
    ReplicaId,
    RequestView,
)
from prefixroute.core.replica_load import THROUGHPUT_WINDOW_S

R0, R1 = ReplicaId("r0"), ReplicaId("r1")


def view(request_id: str, prompt: int, output: int = 0) -> RequestView:
    return RequestView(request_id, (), 16, prompt, prompt, output)


def decision(replica: ReplicaId, cached: int = 0) -> Decision:
    return Decision(replica, DecisionReason.LEAST_LOADED, cached)


def send(
    tracker: LoadTracker,
    request_id: str,
    prompt: int,
    output: int = 0,
    cached: int = 0,
    now: float = 0.0,
) -> None:
    """Dispatch a request of these numbers to ``R0``."""
    tracker.dispatch(view(request_id, prompt, output), decision(R0, cached), now=now)


def assert_idle(tracker: LoadTracker, replica: ReplicaId) -> None:
    load = tracker[replica]
    assert (load.in_flight, load.prefilling, load.decoding) == (0, 0, 0)
    assert load.queued_prefill_tokens == 0
    assert load.active_blocks == 0


@pytest.fixture
def tracker() -> LoadTracker:
    return LoadTracker()


def test_dispatch_first_token_complete() -> None:
    tracker = LoadTracker(block_size=16)
    tracker.add_replica(R0)
    send(tracker, "a", prompt=100, output=30, cached=64)
    load = tracker[R0]
    assert load.in_flight == 1
    assert load.prefilling == 1
    assert load.decoding == 0
    assert load.queued_prefill_tokens == 36  # 100 prompt - 64 cached
    assert load.active_blocks == 9  # ceil((100 + 30) / 16)

    tracker.first_token("a", now=1.0)
    assert (load.in_flight, load.prefilling, load.decoding) == (1, 0, 1)
    assert load.queued_prefill_tokens == 0
    assert load.active_blocks == 9

    tracker.complete("a", now=2.0)
    assert_idle(tracker, R0)
    assert load.completed == 1


@pytest.mark.parametrize(
    ("prompt", "output", "cached", "queued"),
    [(10, 0, 50, 0), (40, 8, 0, 40)],
    ids=["cached-beyond-prompt-never-queues-negative-work", "complete-before-first-token"],
)
def test_complete_without_first_token_releases_everything(
    tracker: LoadTracker, prompt: int, output: int, cached: int, queued: int
) -> None:
    send(tracker, "a", prompt, output, cached)
    assert tracker[R0].queued_prefill_tokens == queued
    tracker.complete("a", now=1.0)  # failed or cancelled before its first token
    assert_idle(tracker, R0)


def test_complete_twice_is_safe(tracker: LoadTracker) -> None:
    send(tracker, "a", prompt=40)
    send(tracker, "b", prompt=40)
    tracker.complete("a", now=1.0)
    tracker.complete("a", now=1.0)
    load = tracker[R0]
    assert load.in_flight == 1
    assert load.completed == 1
    tracker.complete("b", now=1.0)
    assert_idle(tracker, R0)
    assert load.completed == 2


def test_first_token_twice_and_unknown_ids_are_ignored(tracker: LoadTracker) -> None:
    send(tracker, "a", prompt=40)
    tracker.first_token("a", now=1.0)
    tracker.first_token("a", now=1.0)
    assert tracker[R0].prefilling == 0
    assert tracker[R0].queued_prefill_tokens == 0
    tracker.first_token("nope", now=1.0)
    tracker.complete("nope", now=1.0)
    tracker.complete("a", now=2.0)
    assert_idle(tracker, R0)


def test_get_registers_and_getitem_does_not(tracker: LoadTracker) -> None:
    with pytest.raises(KeyError):
        tracker[R0]
    assert tracker.get(R0).in_flight == 0
    assert tracker.replicas == [R0]


def test_removed_replica_completes_quietly(tracker: LoadTracker) -> None:
    send(tracker, "a", prompt=40)
    tracker.remove_replica(R0)
    assert tracker.replicas == []
    tracker.first_token("a", now=1.0)
    tracker.complete("a", now=1.0)
    assert tracker.replicas == []


def test_observe_keeps_scraped_numbers_apart(tracker: LoadTracker) -> None:
    send(tracker, "a", prompt=40)
    tracker.observe(R0, kv_usage=0.5, num_waiting=3)
    tracker.observe(R0, num_running=2)
    load = tracker[R0]
    assert (load.kv_usage, load.num_waiting, load.num_running) == (0.5, 3, 2)
    assert load.in_flight == 1  # the router's own count is untouched


def test_throughput_decays(tracker: LoadTracker) -> None:
    send(tracker, "a", prompt=1000, output=200)
    tracker.first_token("a", now=1.0)  # 1000 prefill tokens processed
    tracker.complete("a", now=1.0)  # 200 output tokens
    load = tracker[R0]
    start = load.throughput(1.0)
    assert start == pytest.approx(1200 / THROUGHPUT_WINDOW_S)
    later = [load.throughput(1.0 + dt) for dt in (0.5, 1.0, 5.0, 10.0, 100.0)]
    assert all(a > b for a, b in zip([start, *later], later, strict=False))
    assert load.throughput(1.0 + THROUGHPUT_WINDOW_S) == pytest.approx(start / math.e)
    assert load.throughput(1.0 + 50 * THROUGHPUT_WINDOW_S) < 1e-6


def test_throughput_accumulates_with_decay(tracker: LoadTracker) -> None:
    for i, t in enumerate((0.0, THROUGHPUT_WINDOW_S)):
        tracker.dispatch(view(str(i), prompt=100), decision(R0), now=t)
        tracker.complete(str(i), now=t, output_tokens=0)
    load = tracker[R0]
    expected = (100 / math.e + 100) / THROUGHPUT_WINDOW_S
    assert load.throughput(THROUGHPUT_WINDOW_S) == pytest.approx(expected)


def test_complete_can_override_output_tokens(tracker: LoadTracker) -> None:
    send(tracker, "a", prompt=0, output=500)
    tracker.complete("a", now=0.0, output_tokens=7)
    assert tracker[R0].throughput(0.0) == pytest.approx(7 / THROUGHPUT_WINDOW_S)


ops = st.lists(
    st.tuples(
        st.sampled_from(["dispatch", "first_token", "complete"]),
        st.integers(min_value=0, max_value=6),  # request id
        st.sampled_from([R0, R1]),
        st.integers(min_value=0, max_value=300),  # prompt tokens
        st.integers(min_value=0, max_value=300),  # cached tokens
        st.integers(min_value=0, max_value=50),  # output tokens
    ),
    max_size=60,
)


@given(ops=ops, block_size=st.integers(min_value=1, max_value=32))
def test_any_sequence_returns_to_zero_after_completing_everything(
    ops: list[tuple[str, int, ReplicaId, int, int, int]], block_size: int
) -> None:
    tracker = LoadTracker(block_size=block_size)
    live: dict[str, tuple[ReplicaId, int, int, bool]] = {}  # id -> replica, work, blocks, prefilled
    for now, (op, n, replica, prompt, cached, output) in enumerate(ops):
        rid = str(n)
        if op == "dispatch":
            if rid in live:  # request ids are unique while in flight
                continue
            tracker.dispatch(view(rid, prompt, output), decision(replica, cached), float(now))
            live[rid] = (
                replica,
                max(0, prompt - cached),
                -(-(prompt + output) // block_size),
                False,
            )
        elif op == "first_token":
            tracker.first_token(rid, float(now))
            if rid in live:
                live[rid] = (*live[rid][:3], True)
        else:
            tracker.complete(rid, float(now))
            live.pop(rid, None)
        for r in tracker.replicas:  # the tracker agrees with a recount of live requests
            mine = [v for v in live.values() if v[0] == r]
            load = tracker[r]
            assert load.in_flight == len(mine)
            assert load.prefilling == sum(not v[3] for v in mine)
            assert load.queued_prefill_tokens == sum(v[1] for v in mine if not v[3])
            assert load.active_blocks == sum(v[2] for v in mine)
            assert load.throughput(float(now)) >= 0
    for rid in list(live):
        tracker.complete(rid, 1e3)
    for r in tracker.replicas:
        assert_idle(tracker, r)


# --- regressions: bugs found by this suite, fixed ---------------------------------------------


def test_request_from_before_a_remove_does_not_touch_the_re_added_replica(
    tracker: LoadTracker,
) -> None:
    tracker.add_replica(R0)
    send(tracker, "a", prompt=100, output=10)
    tracker.remove_replica(R0)  # health check failed ...
    tracker.add_replica(R0)  # ... and passed again, while "a" was still running
    tracker.complete("a", now=1.0)
    assert_idle(tracker, R0)  # today: in_flight == -1, queued_prefill_tokens == -100


def test_dispatching_a_live_request_id_again_does_not_leak_load(tracker: LoadTracker) -> None:
    send(tracker, "a", prompt=100)
    with contextlib.suppress(PrefixrouteError):  # rejecting the duplicate is a fine fix too
        send(tracker, "a", prompt=100)
    tracker.complete("a", now=1.0)
    tracker.complete("a", now=1.0)
    assert_idle(tracker, R0)  # today: in_flight == 1 forever


def test_arrival_rate_and_mean_uncached_decay(tracker: LoadTracker) -> None:
    for i in range(10):
        view = RequestView(f"a{i}", (), 1, 300, 300)
        tracker.dispatch(view, Decision(ReplicaId("r0"), DecisionReason.LEAST_LOADED, 100), 0.0)
    load = tracker[ReplicaId("r0")]
    assert load.arrival_rate(0.0) == pytest.approx(10 / THROUGHPUT_WINDOW_S)
    assert load.mean_uncached() == pytest.approx(200)
    assert load.arrival_rate(THROUGHPUT_WINDOW_S) == pytest.approx(
        10 / THROUGHPUT_WINDOW_S / math.e
    )
