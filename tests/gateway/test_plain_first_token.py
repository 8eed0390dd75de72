"""A plain answer's first token, guessed when due (gateway/_accounting.py).

From its docstring: once the replica's speed is its own, a plain request stops counting as
queued prefill when its first token is due at that speed, not when its answer ends; and the
answer, read whole, teaches the speed model (``whole_observations``).
"""

from __future__ import annotations

import asyncio

import aiohttp

from prefixroute.emulate import EmulatorConfig
from prefixroute.sim.replica import ReplicaConfig

from .helpers import ClusterFactory, GatewayFactory, send, words


async def test_a_plain_answer_leaves_the_queue_when_its_first_token_is_due(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    cluster = await make_cluster(1, EmulatorConfig(ReplicaConfig(block_size=16)))
    gw = await make_gateway(cluster.urls, health_interval_s=0.05)
    load = gw.router.replica_load(gw.registry.find(cluster.urls[0]).id)
    for i in range(12):  # streams: the replica's speed becomes its own
        body = {"prompt": f"s{i} " + words(200 + 50 * i), "max_tokens": 2 + i, "stream": True}
        assert (await send(session, gw.url, "/v1/completions", body)).complete
    assert load.speed.warmed_up
    before = load.speed.whole_observations
    # About 150 ms of prefill at most, then 160 decode steps of 15 ms: 2.4 s to its end.
    body = {"prompt": "plain " + words(600), "max_tokens": 160, "ignore_eos": True}
    answer = asyncio.create_task(send(session, gw.url, "/v1/completions", body))
    seen_decoding = False
    for _ in range(150):  # up to 1.5 s, well before the answer can end
        await asyncio.sleep(0.01)
        if load.in_flight == 1 and load.prefilling == 0 and load.queued_prefill_tokens == 0:
            seen_decoding = True
            break
    assert seen_decoding, (load.in_flight, load.prefilling, load.queued_prefill_tokens)
    assert not answer.done()
    reply = await answer
    assert reply.complete and reply.usage is not None
    assert reply.usage["completion_tokens"] == 160
    assert load.speed.whole_observations == before + 1
    assert load.in_flight == 0
