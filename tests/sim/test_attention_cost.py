"""Prefill's attention cost in the replica model (sim/replica.py's
``ReplicaConfig.attention_tokens`` L): a chunk of c prompt tokens after k tokens with KV costs
c * (1 + (k + c/2) / L) / rate seconds, not c / rate, as a token's attention work grows with the
context before it; 0 keeps the article's model. ``--fleet ...:attention=N`` sets it per replica,
``prefixroute emulate --attention-tokens N`` for the emulated replicas."""

from __future__ import annotations

import argparse
import json

import pytest

from prefixroute.cli import main
from prefixroute.commands.emulate import add_parser, config_from_args, fleet_from_args
from prefixroute.core import ConfigError
from prefixroute.sim import FLEET_HELP, parse_fleet
from prefixroute.sim.replica import EngineRequest, ReplicaConfig, ReplicaModel

RATE = 10_000.0


def cost(c: int, k: int, attention: float) -> float:
    """Seconds to prefill ``c`` tokens after ``k`` with KV, by the spec's formula."""
    return c * (1 + (k + c / 2) / attention) / RATE


def run_alone(model: ReplicaModel, r: EngineRequest, now: float = 0.0) -> tuple[float, list[float]]:
    """Submit ``r`` to an idle ``model`` and step until it is done: (end, step durations)."""
    model.submit(r)
    durations = []
    while model.has_work():
        d = model.begin_step(now)
        durations.append(d)
        now += d
        model.end_step(now)
    return now, durations


def test_one_prompt_pays_for_the_context_each_token_attends_to() -> None:
    p, attention = 400, 1000.0
    m = ReplicaModel(ReplicaConfig(block_size=1, prefill_tokens_per_s=RATE, attention_tokens=1000))
    r = EngineRequest("a", list(range(p)), 1, arrival_s=0.0)
    run_alone(m, r)
    assert r.first_token_s == pytest.approx(p * (1 + (p / 2) / attention) / RATE)  # 0.048 s
    assert r.first_token_s == pytest.approx(cost(p, 0, attention))
    free = ReplicaModel(ReplicaConfig(block_size=1, prefill_tokens_per_s=RATE))
    r = EngineRequest("a", list(range(p)), 1, arrival_s=0.0)
    run_alone(free, r)
    assert r.first_token_s == p / RATE  # exactly today's arithmetic


def test_chunks_pay_for_the_context_before_them_and_sum_to_the_whole_prompt() -> None:
    p, attention, budget = 1000, 500.0, 256
    cfg = ReplicaConfig(
        block_size=16, prefill_tokens_per_s=RATE, step_tokens=budget, attention_tokens=attention
    )
    r = EngineRequest("a", list(range(p)), 1, arrival_s=0.0)
    end, durations = run_alone(ReplicaModel(cfg), r)
    chunks = [256, 256, 256, 232]
    assert durations == pytest.approx(
        [cost(c, k, attention) for c, k in zip(chunks, (0, 256, 512, 768), strict=True)]
    )
    assert r.first_token_s == end == pytest.approx(p * (1 + (p / 2) / attention) / RATE)


def test_a_cached_prefix_is_context_the_new_tokens_attend_to() -> None:
    attention = 2048.0
    cfg = ReplicaConfig(block_size=16, prefill_tokens_per_s=RATE, attention_tokens=attention)
    m = ReplicaModel(cfg)
    now, _ = run_alone(m, EngineRequest("first", list(range(600)), 1, arrival_s=0.0))
    again = EngineRequest("again", [*range(600), *range(1000, 1400)], 1, arrival_s=now)
    run_alone(m, again, now)
    k = 592  # 37 full blocks of the first prompt's 600 tokens
    assert again.cached_tokens == k and again.start_s == now
    assert again.first_token_s is not None
    assert again.first_token_s - now == pytest.approx(cost(1000 - k, k, attention))


def test_a_speed_change_keeps_the_attention_setting() -> None:
    m = ReplicaModel(ReplicaConfig(attention_tokens=8192))
    m.set_speed(2500.0, 0.03)
    assert (m.config.prefill_tokens_per_s, m.config.attention_tokens) == (2500.0, 8192)


def test_the_setting_is_checked_and_the_fleet_sets_it() -> None:
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="attention tokens"):
            ReplicaConfig(attention_tokens=bad)
    fleet = parse_fleet("2+2:attention=8192", ReplicaConfig())
    assert [c.attention_tokens for c in fleet.configs] == [0.0, 0.0, 8192.0, 8192.0]
    assert fleet.describe() == (
        "r0-r1: 10,000 tok/s, 15 ms/step, 131,072 KV tokens; "
        "r2-r3: 10,000 tok/s, 15 ms/step, 131,072 KV tokens, attention 8,192 tokens"
    )
    assert "attention" in FLEET_HELP
    with pytest.raises(ConfigError):
        parse_fleet("1:attention=-5", ReplicaConfig())


def test_emulate_takes_it_as_a_flag_and_in_its_fleet() -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["emulate", "--attention-tokens", "16384"])
    assert config_from_args(args).engine.attention_tokens == 16384.0
    plain = parser.parse_args(["emulate"])
    assert config_from_args(plain).engine.attention_tokens == 0.0
    args = parser.parse_args(
        ["emulate", "--attention-tokens", "4096", "--fleet", "1+1:prefill=5000"]
    )
    fleet = fleet_from_args(args, config_from_args(args))
    assert fleet is not None and [c.attention_tokens for c in fleet.configs] == [4096.0, 4096.0]


def test_simulate_fleet_takes_it(capsys: pytest.CaptureFixture[str]) -> None:
    def ttft(fleet: str) -> tuple[str, float]:
        argv = ["simulate", "-w", "seed-conversation", "--fleet", fleet, "--json"]
        assert main(argv) == 0
        doc = json.loads(capsys.readouterr().out)
        return doc["fleet"], doc["policies"][0]["ttft_ms"]["mean"]

    free, paying = ttft("1"), ttft("1:attention=4096")
    assert "attention" not in free[0] and paying[0].endswith(", attention 4,096 tokens")
    assert paying[1] > free[1]


def test_prompts_admitted_in_one_step_each_pay_for_their_own_context() -> None:
    """Two fresh prompts in one step: the step lasts both prompts' tokens and each one's own
    context work (neither attends to the other)."""
    attention = 1000.0
    m = ReplicaModel(ReplicaConfig(block_size=1, prefill_tokens_per_s=RATE, attention_tokens=1000))
    m.submit(EngineRequest("a", list(range(300)), 1, arrival_s=0.0))
    m.submit(EngineRequest("b", list(range(1000, 1500)), 1, arrival_s=0.0))
    assert m.begin_step(0.0) == pytest.approx(cost(300, 0, attention) + cost(500, 0, attention))


def test_bad_settings_say_what_is_wrong() -> None:
    with pytest.raises(ConfigError, match=r"^first-token overhead must be non-negative$"):
        ReplicaConfig(first_token_overhead_s=-1.0)
    message = r"^attention tokens must be >= 0 and finite \(0: attention is free\)$"
    with pytest.raises(ConfigError, match=message):
        ReplicaConfig(attention_tokens=-1.0)
