"""OpenAI's Responses API on real vLLM through the gateway (gateway/_responses.py).

The engines store their answers (``VLLM_ENABLE_RESPONSES_API_STORE=1``, engines.py), as a
deployment that uses ``previous_response_id`` must. Each continuation carries only its new
input, so nothing in its prefix tells the router where the conversation is: it must go to the
engine that stored the response it names, and vLLM must report that engine's cache hit on the
conversation so far. The usage of each answer, whole or streamed, is read."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from prefixroute.gateway import Gateway, GatewayConfig

from .engines import BLOCK_SIZE, MODEL_NAME, VLLMServer
from .metrics import total

pytestmark = pytest.mark.vllm

REPLICA = "x-prefixroute-replica"



async def _respond(
    session: aiohttp.ClientSession, gw: Gateway, body: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """(the replica that answered, the response object: a stream's from response.completed)."""
    async with session.post(gw.url + "/v1/responses", json={"model": MODEL_NAME, **body}) as resp:
        raw = await resp.text()
        assert resp.status == 200, raw
        replica = resp.headers[REPLICA]
    if not body.get("stream"):
        return replica, json.loads(raw)
    events = [json.loads(line[6:]) for line in raw.split("\n") if line.startswith("data: {")]
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    return replica, events[-1]["response"]


async def test_a_conversation_continued_by_id_stays_with_the_engine_that_stored_it(
    engines: list[VLLMServer],
) -> None:
    config = GatewayConfig(
        port=0, replicas=tuple(e.url for e in engines), kv_block_size=BLOCK_SIZE,
        health_interval_s=0.5, read_timeout_s=120.0, expose_replica_urls=True,
    )  # fmt: skip
    for e in engines:
        e.reset_prefix_cache()
    opening = "You answer questions about the history of the river towns. " * 12
    async with (
        Gateway(config) as gw,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session,
    ):
        homes = []
        for user in range(2):
            home, answer = await _respond(
                session, gw, {"input": f"User {user}: {opening}", "max_output_tokens": 4}
            )
            homes.append(home)
            for turn in range(3):
                body = {"input": f"Question {turn}?", "previous_response_id": answer["id"],
                        "max_output_tokens": 4, "stream": turn == 1}  # fmt: skip
                replica, answer = await _respond(session, gw, body)
                assert replica == home
                # vLLM's own count: the stored conversation was in that engine's cache.
                assert answer["usage"]["input_tokens_details"]["cached_tokens"] >= BLOCK_SIZE
            async with session.get(gw.url + f"/v1/responses/{answer['id']}") as resp:
                assert resp.status == 200 and resp.headers[REPLICA] == home
        missing = total(gw, "prefixroute_usage_missing_total")
        reported = total(gw, "prefixroute_prompt_tokens_total")
    print(f"\nResponses API on vLLM: homes {homes}, prompt tokens reported {reported:.0f}")
    assert missing == 0 and reported > 0
