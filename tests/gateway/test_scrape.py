from __future__ import annotations

import asyncio

from prefixroute.gateway._scrape import EngineLoad, parse_engine_load

from .helpers import ClusterFactory, GatewayFactory

VLLM = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
"""
SGLANG = """\
sglang:num_running_reqs{model_name="m"} 4.0
sglang:num_queue_reqs{model_name="m"} 6.0
sglang:token_usage{model_name="m"} 0.1
"""


def test_vllm_and_sglang_names() -> None:
    assert parse_engine_load(VLLM) == EngineLoad(5, 1, 0.375)
    assert parse_engine_load(SGLANG) == EngineLoad(4, 6, 0.1)
    assert parse_engine_load("other_metric 1\n") == EngineLoad(None, None, None)
    assert parse_engine_load("{{{ not prometheus") == EngineLoad(None, None, None)


async def test_health_rounds_feed_the_load_view(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory
) -> None:
    cluster = await make_cluster(1)
    gw = await make_gateway(cluster.urls)
    load = gw.router.loads.get(gw.registry.find(cluster.urls[0]).id)
    async with asyncio.timeout(5):
        while load.kv_usage is None:
            await asyncio.sleep(0.02)
    assert load.num_running == 0 and load.num_waiting == 0
