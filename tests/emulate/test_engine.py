"""The emulated engine: the simulator's replica model and step loop on a real-time kernel."""

from __future__ import annotations

import asyncio

import pytest

from prefixroute.core import RequestTooLarge
from prefixroute.emulate._engine import ABORTED, FINISHED, EngineLoop, EngineStopped
from prefixroute.sim.replica import ReplicaConfig, ReplicaModel, StepResult

CFG = ReplicaConfig(kv_capacity_blocks=64, block_size=1, step_tokens=64)


async def _drain(queue: asyncio.Queue[int]) -> list[int]:
    out = []
    async with asyncio.timeout(5):
        while (item := await queue.get()) >= 0:
            out.append(item)
    out.append(item)
    return out


async def test_tokens_arrive_in_order_and_cache_is_reused() -> None:
    engine = EngineLoop(ReplicaModel(CFG), time_scale=0.001)
    engine.start()
    try:
        g1 = engine.submit(list(range(10)), 3)
        assert await _drain(g1.queue) == [1, 2, 3, FINISHED]
        assert g1.cached_tokens == 0
        g2 = engine.submit(list(range(12)), 2)
        assert await _drain(g2.queue) == [1, 2, FINISHED]
        assert g2.cached_tokens == 10
        assert (engine.prefix_queries, engine.prefix_hits) == (22, 10)
        assert engine.generation_tokens == 5
        engine.release(g1)  # releasing a finished request is a no-op
    finally:
        await engine.stop()


async def test_release_mid_step_aborts_after_the_step() -> None:
    engine = EngineLoop(ReplicaModel(CFG), time_scale=0.5)
    engine.start()
    try:
        gen = engine.submit(list(range(8)), 50)
        await gen.queue.get()  # first token: the request is decoding, a step is under way
        engine.release(gen)
        assert gen.request in engine.model.running  # the planned step still holds it
        async with asyncio.timeout(5):
            while engine.model.has_work():
                await asyncio.sleep(0.005)
        assert engine.model.cache.used == 0  # its blocks were released
    finally:
        await engine.stop()


async def test_a_request_released_during_a_step_is_gone_after_stop() -> None:
    engine = EngineLoop(ReplicaModel(CFG), time_scale=0.5)
    engine.start()
    gen = engine.submit(list(range(8)), 50)
    await gen.queue.get()
    engine.release(gen)  # held back: a step is planned
    await engine.stop()  # that step never ends, so the abort is applied now
    assert not engine.model.has_work() and engine.model.cache.used == 0


async def test_stop_aborts_waiting_requests() -> None:
    engine = EngineLoop(ReplicaModel(CFG), time_scale=1.0)
    engine.start()
    gen = engine.submit(list(range(8)), 50)
    await engine.stop()
    assert (await _drain(gen.queue))[-1] == ABORTED
    with pytest.raises(EngineStopped):
        engine.submit([1], 1)


async def test_too_large_requests_are_refused() -> None:
    engine = EngineLoop(ReplicaModel(CFG), time_scale=0.001)
    engine.start()
    try:
        with pytest.raises(RequestTooLarge):
            engine.submit(list(range(100)), 1)
    finally:
        await engine.stop()


async def test_model_time_starts_at_zero_and_steps_last_exactly_their_duration() -> None:
    cfg = ReplicaConfig(kv_capacity_blocks=64, block_size=1, prefill_tokens_per_s=1000.0)
    engine = EngineLoop(ReplicaModel(cfg), time_scale=0.001)  # a model second is 1 ms of wall
    engine.start()
    try:
        gen = engine.submit(list(range(10)), 20)
        assert (await _drain(gen.queue))[-1] == FINISHED
    finally:
        await engine.stop()
    req = gen.request
    assert req.start_s is not None and req.first_token_s is not None and req.finish_s is not None
    assert 0.0 <= req.arrival_s <= req.start_s  # it arrived at the wall clock's model time
    # The kernel's clock, not the moment the event loop woke: no drift however late it woke.
    assert req.first_token_s - req.start_s == pytest.approx(10 / 1000.0)
    assert req.finish_s - req.first_token_s == pytest.approx(19 * cfg.decode_step_s)


async def test_a_replica_without_decode_time_still_streams_every_token() -> None:
    cfg = ReplicaConfig(kv_capacity_blocks=64, block_size=1, decode_step_s=0.0)
    engine = EngineLoop(ReplicaModel(cfg), time_scale=0.001)
    engine.start()
    try:
        gen = engine.submit(list(range(4)), 3)
        assert await _drain(gen.queue) == [1, 2, 3, FINISHED]  # zero-second steps still run
    finally:
        await engine.stop()


class BrokenModel(ReplicaModel):
    def end_step(self, now: float) -> StepResult:
        raise RuntimeError("a bug in the model")


async def test_a_failing_step_aborts_every_request_and_stops_the_engine() -> None:
    engine = EngineLoop(BrokenModel(CFG), time_scale=0.001)
    engine.start()
    try:
        gen = engine.submit(list(range(8)), 5)
        assert await _drain(gen.queue) == [ABORTED]
        assert not engine.running
        with pytest.raises(EngineStopped):
            engine.submit([1], 1)
    finally:
        await engine.stop()
