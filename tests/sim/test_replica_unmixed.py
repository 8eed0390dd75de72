"""The replica model with ``mixed_batches`` off (sim/replica.py's docstring): SGLang's default
scheduling, where a step that has prefill to do runs it alone, with the whole token budget, and
the decoding requests wait for it, against vLLM v1's mixed steps."""

from __future__ import annotations

import pytest

from prefixroute.core import ConfigError
from prefixroute.sim.fleet import parse_fleet
from prefixroute.sim.replica import EngineRequest, ReplicaConfig, ReplicaModel

RATE, STEP_S = 10_000.0, 0.01


def config(mixed: bool, **kw: object) -> ReplicaConfig:
    return ReplicaConfig(block_size=16, prefill_tokens_per_s=RATE, decode_step_s=STEP_S,
                         mixed_batches=mixed, **kw)  # type: ignore[arg-type]  # fmt: skip


def decoding_then_a_prompt(mixed: bool, prompt: int, **kw: object) -> tuple[
    ReplicaModel, EngineRequest, EngineRequest, list[float]
]:
    """A request decoding 10 tokens, joined after its first token by a ``prompt``-token one;
    the model run to the end: (model, decoder, newcomer, each step's duration)."""
    m = ReplicaModel(config(mixed, **kw))
    decoder = EngineRequest("d", list(range(5)), 10, arrival_s=0.0)
    m.submit(decoder)
    now = m.begin_step(0.0)
    m.end_step(now)
    assert decoder.first_token_s == pytest.approx(now)
    newcomer = EngineRequest("n", list(range(1000, 1000 + prompt)), 2, arrival_s=now)
    m.submit(newcomer)
    steps = []
    while m.has_work():
        d = m.begin_step(now)
        now += d
        steps.append(d)
        m.end_step(now)
    return m, decoder, newcomer, steps


def test_unmixed_a_prefill_step_runs_alone_and_the_decodes_wait() -> None:
    _, decoder, newcomer, steps = decoding_then_a_prompt(False, 1500)
    start = decoder.first_token_s
    assert start is not None and newcomer.first_token_s is not None
    # 1,500 tokens in one step of the whole budget (2,048), no decode step in it.
    assert newcomer.first_token_s - start == pytest.approx(1500 / RATE)
    assert steps[0] == pytest.approx(1500 / RATE)
    # The decoder's nine more tokens took nine decode steps after that, none during it.
    assert decoder.finish_s == pytest.approx(start + 1500 / RATE + 9 * STEP_S)
    assert newcomer.finish_s == pytest.approx(newcomer.first_token_s + STEP_S)
    assert decoder.generated == 10 and newcomer.generated == 2


def test_mixed_the_same_prompt_shares_its_step_with_the_decode() -> None:
    """The same case on vLLM's steps: the decode rides along (one token less of budget) and
    the step costs a decode step more; so a test that passed on both would test nothing."""
    _, decoder, newcomer, steps = decoding_then_a_prompt(True, 1500)
    start = decoder.first_token_s
    assert start is not None and newcomer.first_token_s is not None
    assert newcomer.first_token_s - start == pytest.approx(1500 / RATE + STEP_S)
    assert decoder.finish_s == pytest.approx(start + 1500 / RATE + 9 * STEP_S)


def test_unmixed_a_long_prompt_takes_whole_budgets_one_after_another() -> None:
    _, decoder, newcomer, steps = decoding_then_a_prompt(False, 5000, step_tokens=2048)
    start = decoder.first_token_s
    assert start is not None and newcomer.first_token_s is not None
    # Three prefill-only steps (2,048 + 2,048 + 904 tokens), no decode between them.
    assert steps[:3] == pytest.approx([2048 / RATE, 2048 / RATE, 904 / RATE])
    assert newcomer.first_token_s - start == pytest.approx(5000 / RATE)


def test_unmixed_decode_steps_run_when_nothing_is_left_to_prefill() -> None:
    m = ReplicaModel(config(False, max_running=1))
    a = EngineRequest("a", list(range(5)), 4, arrival_s=0.0)
    b = EngineRequest("b", list(range(100, 200)), 1, arrival_s=0.0)
    m.submit(a)
    m.submit(b)  # waits: the batch holds one request
    now = 0.0
    while m.has_work():
        d = m.begin_step(now)
        now += d
        m.end_step(now)
    # b's prefill could not start while a ran, so a decoded on (a prefill that cannot be
    # planned is no reason to stop decoding), then b came.
    assert a.finish_s == pytest.approx(5 / RATE + 3 * STEP_S)
    assert b.first_token_s == pytest.approx(a.finish_s + 100 / RATE)


def test_the_fleet_flag_and_what_it_refuses() -> None:
    fleet = parse_fleet("1+1:mixed=0", ReplicaConfig())
    assert [c.mixed_batches for c in fleet.configs] == [True, False]
    assert fleet.describe().count("prefill alone") == 1 and "r1: " in fleet.describe()
    assert parse_fleet("1:mixed=1", ReplicaConfig()).configs[0].mixed_batches
    with pytest.raises(ConfigError, match="mixed is 0 or 1"):
        parse_fleet("1:mixed=2", ReplicaConfig())
    refused = r"\Apreemption is modelled for mixed batches \(vLLM's\) only\Z"
    with pytest.raises(ConfigError, match=refused):
        parse_fleet("1:mixed=0,preempt=1", ReplicaConfig())


@pytest.mark.parametrize("mixed", [1, 0])
def test_the_simulators_router_learns_each_replicas_kind_and_rate(mixed: int) -> None:
    """The simulator's router is told nothing of the kind (core/batch_mixing.py learns it): on
    a fleet of either kind, every replica is learned as its kind and at its rate."""
    from prefixroute.core import make_policy
    from prefixroute.sim import ClusterSim, make_workload

    fleet = parse_fleet(f"2:prefill=20000,mixed={mixed}+2:prefill=5000,mixed={mixed}",
                        ReplicaConfig())  # fmt: skip
    workload = make_workload("multi-turn", 0, {"sessions": "200"})
    sim = ClusterSim(workload, make_policy("predicted_ttft"), 4, ReplicaConfig(), 0, fleet=fleet)
    sim.run()
    for name, true in zip(fleet.names, fleet.configs, strict=True):
        speed = sim._router.replica_load(name).speed  # type: ignore[arg-type]
        assert speed.carries_decodes is bool(mixed), name
        assert speed.prefill_tokens_per_s == pytest.approx(true.prefill_tokens_per_s, rel=0.15)
