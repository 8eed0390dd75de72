"""Whether a replica's prefill steps carry its decodes (core/batch_mixing.py), learned.

From the module's docstring: vLLM's first token waits, while others decode, for a decode step
per chunk of its prefill plus half the step under way; SGLang's (prefill run alone) only for
that half. A replica of either kind is learned as that kind, and its rate within the speed
model's tolerance; fitted as the other kind, the rate is not (so the tests fail if the trial
goes). Where the other kind does not explain the first tokens better, nothing changes."""

from __future__ import annotations

import random

import pytest

from prefixroute.core import ReplicaSpeed, SpeedConfig
from prefixroute.core import batch_mixing as mixing
from prefixroute.core.policies.predicted_ttft import PredictedTTFT, PredictedTTFTConfig

RATE, STEP = 20_000.0, 0.015
TOLERANCE = 0.15


def feed(speed: ReplicaSpeed, mixed: bool, requests: int, seed: int = 0) -> None:
    """``requests`` first tokens and decode phases from an engine of that kind: prompts with
    short new parts (a conversation's turns, 100-600 tokens: about one decode step's time),
    some longer (one to three chunks of 2,048), most arriving while others decode."""
    rng = random.Random(seed)
    for _ in range(requests):
        own = rng.uniform(100, 600) if rng.random() < 0.8 else rng.uniform(2_000, 6_000)
        decoding = rng.random() < 0.8
        chunks = -(-own // 2048)
        waits = (rng.uniform(0, 1) + (chunks if mixed else 0)) if decoding else 0.0
        speed.observe_first_token(0.0, 0.0, decoding, own, own / RATE + waits * STEP)
        steps = rng.randrange(20, 200)
        prefilled = steps * rng.uniform(0, 0.3 * STEP * RATE)  # a little: few first tokens
        speed.observe_decode(steps * STEP + prefilled / RATE, steps, prefilled)


@pytest.mark.parametrize("mixed", [True, False])
def test_each_kind_is_learned_and_its_rate_with_it(mixed: bool) -> None:
    speed = ReplicaSpeed(SpeedConfig())
    feed(speed, mixed, 300)
    assert speed.carries_decodes is mixed
    assert speed.prefill_tokens_per_s == pytest.approx(RATE, rel=TOLERANCE)
    assert speed.kind_changes == (0 if mixed else 1)


def test_without_the_trial_an_engine_whose_prefill_runs_alone_reads_too_fast(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the trial is for: fitted with vLLM's steps, SGLang's first tokens come a decode
    step sooner than the rate explains, and the rate is stretched to cover it."""
    monkeypatch.setattr(mixing, "EVERY", 10**9)
    speed = ReplicaSpeed(SpeedConfig())
    feed(speed, False, 300)
    assert speed.carries_decodes
    assert speed.prefill_tokens_per_s > RATE * (1 + TOLERANCE)


def test_the_kind_is_learned_with_a_learned_first_token_overhead_too() -> None:
    """The gateway learns each replica's overhead, which can take a constant step's worth: the
    idle and multi-chunk first tokens still tell the kinds apart."""
    for mixed in (True, False):
        speed = ReplicaSpeed(SpeedConfig(learn_overhead=True))
        feed(speed, mixed, 300, seed=3)
        assert speed.carries_decodes is mixed
        assert speed.prefill_tokens_per_s == pytest.approx(RATE, rel=TOLERANCE)


def test_a_trial_that_keeps_the_kind_leaves_every_observation_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """So a fleet of vLLM-like replicas is simulated exactly as before the trials existed."""
    speed = ReplicaSpeed(SpeedConfig())
    feed(speed, True, 100)
    firsts, phases = speed.first_token_window, speed._decode
    before = [o.x for o in firsts], [(p.x, p.credit) for p in phases], speed.estimates()
    monkeypatch.setattr(mixing, "EVERY", 1)
    mixing.try_the_other_kind(speed, firsts, phases)
    assert speed.carries_decodes
    assert ([o.x for o in firsts], [(p.x, p.credit) for p in phases], speed.estimates()) == before


def test_steps_a_first_token_waits_for_by_kind() -> None:
    speed = ReplicaSpeed(SpeedConfig(step_tokens=2048))
    assert speed.steps(3000, True) == 2.5  # two chunks, each with the decodes, and half a step
    assert speed.steps(3000, False) == 0.0  # nobody decoding: no step to wait for
    speed.carries_decodes = False
    assert speed.steps(3000, True) == 0.5  # only the step under way
    assert speed.steps(3000, False) == 0.0


def test_the_policy_predicts_a_first_token_with_the_replicas_kind() -> None:
    """predicted_ttft's own formula (its ``_terms``) waits for the same steps as the model."""
    from prefixroute.core import ReplicaId, Router

    router = Router(PredictedTTFT())
    r = ReplicaId("r")
    router.add_replica(r)
    load = router.replica_load(r)
    load.in_flight, load.prefilling = 3, 0  # three decoding, nothing queued
    policy = PredictedTTFT()
    step = load.speed.decode_step_s
    mixed = policy._terms(load, 3000, 3000, 0.0)[0]
    load.speed.carries_decodes = False
    alone = policy._terms(load, 3000, 3000, 0.0)[0]
    assert mixed - alone == pytest.approx(2 * step)  # the two chunks' decode steps
    # With fixed speeds (learned_speeds off: the policy before issue 11) nothing learned is
    # used, the kind neither: vLLM's steps, at the configured decode step.
    fixed = PredictedTTFT(PredictedTTFTConfig(learned_speeds=False))
    assert fixed._terms(load, 3000, 3000, 0.0)[0] == pytest.approx(
        3000 / fixed.config.prefill_tokens_per_s + 2.5 * fixed.config.decode_step_s
    )


def test_progress_on_a_queue_spends_no_decode_steps_where_prefill_runs_alone() -> None:
    """queue_credit's progress: on vLLM's steps each step started also spent a decode step on
    the decodes; where prefill runs alone the decodes wait, and all the time is prefill."""
    speed = ReplicaSpeed(SpeedConfig(prefill_tokens_per_s=10_000.0, decode_step_s=0.01))
    mixed = speed.progress(50_000, 0.5, True)
    speed.carries_decodes = False
    assert speed.progress(50_000, 0.5, True) == pytest.approx(5_000)  # 0.5 s at 10,000/s
    assert mixed < 5_000 - 10_000 * 0.01  # at least one decode step's time went to decodes
