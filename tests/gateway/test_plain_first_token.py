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


class _Listener:
    def __init__(self) -> None:
        self.heard: list[str] = []

    def first_token(self, rid: str) -> None:
        self.heard.append(rid)


async def test_a_held_guess_is_asked_again_and_shared_once_taken() -> None:
    """The router holds a guess while a request sent before it has no first token
    (core/plain_answers.py): the timer asks again after the wait it is told, and tells the
    listener (the Redis sync) only once the guess is taken."""
    from prefixroute.core import Router, SpeedConfig, make_policy
    from prefixroute.gateway import guess_first_token

    router = Router(make_policy("least_loaded"), speed=SpeedConfig(min_observations=1))
    router.add_replica("r0")
    ids = list(range(64))
    for i in range(3):  # a speed of its own
        router.route(router.view(f"w{i}", tokens=ids, output_tokens=2), 0.0)
        router.first_token(f"w{i}", 0.01)
        router.complete(f"w{i}", 0.02, 2)
    router.route(router.view("ahead", tokens=ids, output_tokens=2), 1.0)  # a stream
    router.route(router.view("plain", tokens=ids[::-1], output_tokens=2), 1.0)
    clock = [1.0]
    listener = _Listener()
    guess = guess_first_token(router, listener, "plain", lambda: clock[0])  # type: ignore[arg-type]
    assert guess is not None
    load = router.replica_load("r0")
    for _ in range(50):  # held: asked again and again, never taken, nothing shared
        clock[0] += 0.05
        await asyncio.sleep(0.005)
    assert load.prefilling == 2 and listener.heard == []
    router.first_token("ahead", clock[0])
    for _ in range(100):
        await asyncio.sleep(0.005)
        if listener.heard:
            break
    assert listener.heard == ["plain"] and load.prefilling == 0
    guess.cancel()
