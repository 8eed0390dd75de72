"""Two pickers behind one real Envoy, sharing one view through a real ``redis-server``.

Envoy's ext_proc cluster lists both pickers; its round-robin sends each request's stream to one
of them, so a conversation's turns are picked by both. With the sync on they keep it on one
replica, each turn after the first a prefix match; each picker's first turn after another's
would otherwise find nothing in its own index.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import aiohttp
import pytest
from gateway.helpers import FAST_GATEWAY, FAST_REPLICA, STEADY, send
from gateway.redis_server import RedisServer

from prefixroute.core import DEFAULT_POLICY
from prefixroute.emulate import start_replicas
from prefixroute.epp import EndpointPicker, EppConfig

from .envoy import Envoy
from .test_sync import applied, connected, until

pytestmark = pytest.mark.envoy

TURNS = 6


def decisions(epp: EndpointPicker) -> float:
    return epp.metrics.registry.get_sample_value("prefixroute_decision_seconds_count") or 0.0


async def test_two_pickers_behind_one_envoy_keep_a_conversation_on_one_replica(
    envoy_path: str, tmp_path: Path, session: aiohttp.ClientSession, redis_server: RedisServer
) -> None:
    cluster = await start_replicas(4, FAST_REPLICA)
    routing = dataclasses.replace(
        FAST_GATEWAY, replicas=tuple(cluster.urls), policy=DEFAULT_POLICY,
        sync_redis=redis_server.url, **STEADY,
    )  # fmt: skip
    epps = [EndpointPicker(EppConfig(routing, grpc_port=0, http_port=None)) for _ in range(2)]
    envoy = None
    try:
        for epp in epps:
            await epp.start()
        await connected(*epps)
        envoy = Envoy(envoy_path, [e.grpc_port for e in epps], tmp_path, "FULL_DUPLEX_STREAMED")
        envoy.start()
        messages: list[dict[str, str]] = []
        replies = []
        for turn in range(TURNS):
            words = " ".join(f"t{turn}w{i}" for i in range(300))
            messages.append({"role": "user", "content": words})
            body = {"model": "emulated", "messages": messages, "max_tokens": 4}
            reply = await send(session, envoy.url, "/v1/chat/completions", body)
            assert reply.status == 200, reply
            replies.append(reply)
            messages.append({"role": "assistant", "content": reply.text})
            # each decision is applied by the one other picker: wait for it (the think time)
            await until(lambda n=turn + 1: sum(applied(e) for e in epps) == n)
    finally:
        if envoy is not None:
            envoy.stop()
        for epp in epps:
            await epp.stop(0)
        await cluster.stop()
    assert all(decisions(e) >= 1 for e in epps)  # both pickers picked turns
    assert sum(decisions(e) for e in epps) == TURNS
    assert len({r.headers["x-prefixroute-replica"] for r in replies}) == 1
    predicted = [int(r.headers["x-prefixroute-predicted-cached-tokens"]) for r in replies]
    assert predicted[0] == 0 and all(p > 0 for p in predicted[1:]), predicted
    cached = [r.usage["prompt_tokens_details"]["cached_tokens"] for r in replies if r.usage]
    assert len(cached) == TURNS and cached[0] == 0 and all(c > 0 for c in cached[1:]), cached
