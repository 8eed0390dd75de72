"""An engine's own batch size (``gateway._server_info``): SGLang's ``/get_server_info`` and vLLM's
development-mode ``/server_info`` state how many requests the engine runs at once. The gateway
asks each replica when it learns its models, tells the router (whose slot term then applies from
the first request, instead of after the batch has filled and stayed full: core/batch_slots.py),
keeps an operator's ``max_running`` over the engine's word, and does not ask a path again at a
replica where it answered 404."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from prefixroute.core import ReplicaId
from prefixroute.emulate import EmulatorConfig, start_replicas
from prefixroute.gateway import Gateway
from prefixroute.gateway._server_info import PATHS, batch_size_said
from prefixroute.gateway._state import STATE
from prefixroute.sim.replica import ReplicaConfig

from .helpers import STEADY, FakeFactory, GatewayFactory


def _emulated(max_running: int) -> EmulatorConfig:
    return EmulatorConfig(ReplicaConfig(block_size=16, max_running=max_running), time_scale=0.01)


def _slots(gw: Gateway, url: str) -> int | None:
    router = gw.registry.router
    return router.replica_load(ReplicaId(gw.registry.find(url).id)).slots.size


async def _until(check: object, what: str) -> None:
    assert callable(check)
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(what)


async def test_each_replica_is_known_by_the_batch_size_its_engine_states(
    make_gateway: GatewayFactory,
) -> None:
    small = await start_replicas(1, _emulated(8))
    large = await start_replicas(1, _emulated(96))
    try:
        urls = [small.urls[0], large.urls[0]]
        gw = await make_gateway(urls, **STEADY)
        await _until(lambda: _slots(gw, urls[0]) is not None and _slots(gw, urls[1]) is not None,
                     "the engines' batch sizes never became known")  # fmt: skip
        assert (_slots(gw, urls[0]), _slots(gw, urls[1])) == (8, 96)
        listed = gw.registry.describe(gw.registry.find(urls[0]))["speed"]
        assert (listed["batch_slots"], listed["batch_slots_from"]) == (8, "engine")
        # Before any request was sent: nothing was learned from running counts.
        small_id = ReplicaId(gw.registry.find(urls[0]).id)
        assert gw.registry.router.replica_load(small_id).in_flight == 0
    finally:
        await small.stop()
        await large.stop()


async def test_an_operators_batch_size_outranks_the_engines(
    make_gateway: GatewayFactory,
) -> None:
    cluster = await start_replicas(1, _emulated(8))
    try:
        url = cluster.urls[0]
        gw = await make_gateway([url], replica_speeds=(f"{url}=max_running=4",), **STEADY)
        asked = gw.app[STATE].health
        assert asked is not None
        await _until(lambda: gw.registry.find(url).healthy, "the replica never became healthy")
        assert await asked.server_info.learn(gw.registry.find(url)) == 8  # the engine says 8
        assert _slots(gw, url) == 4
        listed = gw.registry.describe(gw.registry.find(url))["speed"]
        assert listed["batch_slots_from"] == "told"
    finally:
        await cluster.stop()


async def no_server_info(request: web.Request) -> web.Response:
    if request.path in ("/get_server_info", "/server_info"):
        return web.json_response({"detail": "Not Found"}, status=404)
    return web.json_response({"error": {"message": "no"}}, status=404)


async def test_a_path_that_answered_404_is_not_asked_again(
    make_gateway: GatewayFactory, make_fake: FakeFactory
) -> None:
    fake = await make_fake(handler=no_server_info, server_info=True)
    gw = await make_gateway([fake.url])
    await _until(lambda: gw.registry.find(fake.url).healthy, "the replica never became healthy")
    # It goes away and comes back: its models are learned again, its batch size is not asked.
    fake.failing = True
    await _until(lambda: not gw.registry.find(fake.url).healthy, "it never went down")
    fake.failing = False
    await _until(lambda: gw.registry.find(fake.url).healthy, "it never came back")
    asked = [s.path for s in fake.seen if s.method == "GET" and s.path.split("?")[0] in
             ("/get_server_info", "/server_info")]  # fmt: skip
    assert sorted(asked) == sorted(PATHS)
    assert _slots(gw, fake.url) is None


# SGLang's answer, the fields that matter (the rest of its server arguments left out).
SGLANG = {
    "model_path": "qwen/qwen2.5-0.5b-instruct",
    "max_running_requests": None,  # not given: the scheduler derived its own
    "dp_size": 1,
    "max_total_num_tokens": 20480,
    "internal_states": [
        {"last_gen_throughput": 357.2, "effective_max_running_requests_per_dp": 128}
    ],
    "version": "0.5.5",
}


@pytest.mark.parametrize(
    ("body", "size"),
    [
        (SGLANG, 128),
        # two data-parallel ranks: the replica runs both batches
        ({**SGLANG, "internal_states": [{"effective_max_running_requests_per_dp": 64}] * 2}, 128),
        # an engine before the derived field: its argument, where set
        ({**SGLANG, "internal_states": [{"last_gen_throughput": 1.0}], "max_running_requests": 48},
         48),
        ({**SGLANG, "internal_states": []}, None),
        # a rank without the field, or with one that is no batch size: the ranks say nothing
        ({**SGLANG, "internal_states": [{"effective_max_running_requests_per_dp": 64}, {}]}, None),
        ({**SGLANG, "internal_states": [{"effective_max_running_requests_per_dp": True}]}, None),
        ({**SGLANG, "internal_states": [{"effective_max_running_requests_per_dp": 0}]}, None),
        ({**SGLANG, "internal_states": [{"effective_max_running_requests_per_dp": 8.0}]}, None),
        # vLLM's development mode, config_format=json
        ({"vllm_config": {"scheduler_config": {"max_num_seqs": 256},
                          "parallel_config": {"data_parallel_size": 2}}}, 512),
        ({"vllm_config": {"scheduler_config": {"max_num_seqs": 16}}}, 16),
        ({"vllm_config": "model='x', max_num_seqs=256"}, None),  # the text form: not parsed
        ({"vllm_config": {"scheduler_config": {"max_num_seqs": "256"}}}, None),
        ([128], None),
        ("128", None),
        (None, None),
    ],
)  # fmt: skip
def test_the_batch_size_in_an_engines_server_information(body: object, size: int | None) -> None:
    assert batch_size_said(body) == size


async def test_the_emulated_replica_states_its_batch_size_as_sglang_does(
    session: aiohttp.ClientSession,
) -> None:
    cluster = await start_replicas(1, _emulated(12))
    try:
        async with session.get(cluster.urls[0] + "/get_server_info") as resp:
            assert resp.status == 200
            body = await resp.json()
        assert body["max_running_requests"] == 12
        assert body["internal_states"] == [{"effective_max_running_requests_per_dp": 12}]
        assert body["max_total_num_tokens"] == ReplicaConfig().kv_capacity_blocks * 16
        assert batch_size_said(body) == 12
    finally:
        await cluster.stop()


def _sglang_after(delays: list[float], statuses: list[int]) -> tuple[object, list[float]]:
    """A handler whose n-th /get_server_info waits ``delays[n]`` seconds and answers
    ``statuses[n]`` (200: SGLang's body, batch size 6); everything else 404. Returns it and
    the times its server-info asks arrived."""
    asked: list[float] = []

    async def handler(request: web.Request) -> web.Response:
        if request.path != "/get_server_info":
            return web.json_response({"error": {"message": "no"}}, status=404)
        n = len(asked)
        asked.append(asyncio.get_running_loop().time())
        await asyncio.sleep(delays[min(n, len(delays) - 1)])
        status = statuses[min(n, len(statuses) - 1)]
        body = {**SGLANG, "internal_states": [{"effective_max_running_requests_per_dp": 6}]}
        return web.json_response(body if status == 200 else {"error": "busy"}, status=status)

    return handler, asked


async def test_a_slow_first_answer_is_waited_for_outside_the_health_rounds(
    make_gateway: GatewayFactory, make_fake: FakeFactory
) -> None:
    """vLLM's first /server_info takes seconds: longer than a probe's timeout (0.2 s here), it is
    still read, and the replica is healthy meanwhile (the rounds go on without it)."""
    handler, asked = _sglang_after([1.0], [200])
    fake = await make_fake(handler=handler, server_info=True)
    gw = await make_gateway([fake.url])
    await _until(lambda: gw.registry.find(fake.url).healthy, "the replica never became healthy")
    assert _slots(gw, fake.url) is None  # still waiting for the answer
    await _until(lambda: _slots(gw, fake.url) == 6, "the slow answer was never read")
    assert len(asked) == 1


async def test_an_engine_that_did_not_answer_is_asked_again(
    make_gateway: GatewayFactory, make_fake: FakeFactory
) -> None:
    handler, asked = _sglang_after([0.0], [503, 200])
    fake = await make_fake(handler=handler, server_info=True)
    gw = await make_gateway([fake.url])
    await _until(lambda: _slots(gw, fake.url) == 6, "the second answer was never read")
    assert len(asked) == 2


async def test_an_engine_that_never_answers_is_left_alone_after_a_few_tries(
    make_gateway: GatewayFactory, make_fake: FakeFactory
) -> None:
    from prefixroute.gateway._server_info import TRIES

    handler, asked = _sglang_after([0.0], [500])
    fake = await make_fake(handler=handler, server_info=True)
    await make_gateway([fake.url])  # health rounds every 50 ms
    await _until(lambda: len(asked) >= TRIES, "it was not asked again")
    await asyncio.sleep(0.5)  # ten more rounds
    assert len(asked) == TRIES


async def test_a_replica_that_comes_back_is_asked_again(
    make_gateway: GatewayFactory, make_fake: FakeFactory
) -> None:
    """Down and back, it may have restarted with another ``--max-running-requests``."""
    size = [6]

    async def handler(request: web.Request) -> web.Response:
        if request.path != "/get_server_info":
            return web.json_response({"error": {"message": "no"}}, status=404)
        states = [{"effective_max_running_requests_per_dp": size[0]}]
        return web.json_response({**SGLANG, "internal_states": states})

    fake = await make_fake(handler=handler, server_info=True)
    gw = await make_gateway([fake.url])
    await _until(lambda: _slots(gw, fake.url) == 6, "the size was never read")
    fake.failing = True
    await _until(lambda: not gw.registry.find(fake.url).healthy, "it never went down")
    size[0] = 24
    fake.failing = False
    await _until(lambda: _slots(gw, fake.url) == 24, "the new size was never read")
