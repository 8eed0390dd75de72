"""Pins of the load view's smaller rules, each written from its docstring: the decay of the
completion rate, the fleet's median replica, the steps a decode phase is counted in, a key
block's size in tokens, and a prompt the replica had all cached."""

from __future__ import annotations

import math

import pytest

from prefixroute.core import LoadTracker, ReplicaId, ReplicaSpeed, SpeedConfig
from prefixroute.core.batch_slots import RATE_WINDOW_S, BatchSlots
from prefixroute.core.fleet_speed import fleet_median
from prefixroute.core.types import Decision, DecisionReason, RequestView

R0 = ReplicaId("r0")


def test_the_completion_rate_decays_from_the_last_completion() -> None:
    """Recent completions per second, exponentially decayed (time constant RATE_WINDOW_S)
    from the last one's time, not from the clock's zero."""
    slots = BatchSlots()
    slots.completed(100.0)
    assert slots.completion_rate(100.0) == pytest.approx(1 / RATE_WINDOW_S)
    later = 100.0 + RATE_WINDOW_S
    assert slots.completion_rate(later) == pytest.approx(math.exp(-1) / RATE_WINDOW_S)


def _speed(rate: float, step: float) -> ReplicaSpeed:
    speed = ReplicaSpeed(SpeedConfig())
    speed.prefill_tokens_per_s, speed.decode_step_s = rate, step
    return speed


def test_the_fleet_median_ranks_by_one_full_step_with_its_decodes() -> None:
    """Ranked by how long one full batch step of prefill takes (step_tokens of prefill and one
    decode step): with two decode steps the middle replica would be another."""
    fast_prefill = _speed(20_000.0, 0.02)  # 0.102 + 0.020 = 0.122 s a step
    no_decode = _speed(8_000.0, 0.0)  # 0.256 s
    middle = _speed(10_000.0, 0.05)  # 0.205 + 0.050 = 0.255 s (0.305 with two decode steps)
    assert fleet_median([no_decode, middle, fast_prefill]) == middle.estimates()


def _tracker() -> LoadTracker:
    tracker = LoadTracker(block_size=16)
    tracker.add_replica(R0)
    return tracker


def _decision(cached: int = 0) -> Decision:
    return Decision(R0, DecisionReason.LEAST_LOADED, cached)


@pytest.mark.parametrize("output", [2, 5])
def test_a_decode_phase_is_counted_in_steps_after_the_first_token(output: int) -> None:
    """From first to last token a request sees ``output_tokens - 1`` steps (core/speed.py),
    two tokens included: one step."""
    tracker = _tracker()
    tracker.dispatch(RequestView("a", (), 16, 100, 100, output), _decision(), now=0.0)
    tracker.first_token("a", 0.05)
    tracker.complete("a", 0.2, output_tokens=output)
    phases = tracker[R0].speed._decode
    assert len(phases) == 1 and phases[0].x[1] == output - 1


def test_a_text_keys_block_is_counted_in_tokens_at_the_prompts_estimate() -> None:
    """A text key's blocks are characters: in tokens, a block is what the prompt's estimate
    makes of it (64 characters of a prompt of 800 characters and 300 tokens: 24 tokens); a
    count without one is a KV block."""
    tracker = _tracker()
    text = RequestView("a", (), 64, 300, 800, char_units=True)
    tracker.dispatch(text, _decision(), now=0.0)
    req = tracker.observe_usage("a", 300, 0)
    assert req is not None and req.key_block_tokens == pytest.approx(64 * 300 / 800)
    tiny = RequestView("b", (), 64, 1, 1, char_units=True)  # one character, one token
    tracker.dispatch(tiny, _decision(), now=0.0)
    req = tracker.observe_usage("b", 1, 0)
    assert req is not None and req.key_block_tokens == pytest.approx(64.0)
    tracker.count_dispatch("c", R0, prompt_tokens=50, output_tokens=0,
                           predicted_cached_tokens=0, now=0.0)  # fmt: skip
    req = tracker.observe_usage("c", 50, 0)
    assert req is not None and req.key_block_tokens == 16  # the tracker's KV block


def test_a_prompt_the_replica_had_all_cached_computed_nothing() -> None:
    tracker = _tracker()
    tracker.dispatch(RequestView("a", (), 16, 100, 100), _decision(cached=96), now=0.0)
    req = tracker.observe_usage("a", 100, 100)
    assert req is not None and req.actual_uncached == 0
