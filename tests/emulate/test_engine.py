from __future__ import annotations

import asyncio

import pytest

from prefixroute.core import RequestTooLarge
from prefixroute.emulate._engine import ABORTED, FINISHED, EngineLoop, EngineStopped
from prefixroute.sim.replica import ReplicaConfig, ReplicaModel

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
        async with asyncio.timeout(5):
            while engine.model.has_work():
                await asyncio.sleep(0.005)
        assert engine.model.cache.used == 0  # its blocks were released
    finally:
        await engine.stop()


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
