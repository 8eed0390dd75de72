"""SGLang's native ``/generate`` through the gateway: routed on its text or token ids like the
OpenAI calls, its adapter (``lora_path``) and its tenant's ``extra_key`` keeping blocks apart,
its answer relayed as sent, and the counts in its ``meta_info`` learned as a usage report.
SGLang's own benchmark (``bench_serving --backend sglang``) and RL trainers send this call."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from prefixroute.gateway import Gateway, TenancyConfig

from .helpers import (
    FAST_REPLICA,
    STEADY,
    ClusterFactory,
    FakeFactory,
    GatewayFactory,
    counter,
    metrics_page,
    post_json,
    words,
)

SECRET = "0123456789abcdef-tenant-salt-secret"


async def generate(
    session: aiohttp.ClientSession, gw: Gateway, body: dict[str, Any], **kw: Any
) -> tuple[int, dict[str, str], str]:
    return await post_json(session, gw.url + "/generate", body, **kw)


async def test_a_conversation_on_generate_stays_where_it_is_cached(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    cluster = await make_cluster(4)
    gw = await make_gateway(cluster.urls, **STEADY)
    text, served, cached = words(300), [], []
    for turn in range(4):
        text += f" turn {turn}: " + words(80)
        body = {"text": text, "sampling_params": {"max_new_tokens": 3}}
        status, headers, raw = await generate(session, gw, body)
        assert status == 200, raw
        answer = json.loads(raw)
        assert answer["meta_info"]["completion_tokens"] == 3  # SGLang's answer, as sent
        served.append(headers["x-prefixroute-replica"])
        cached.append(answer["meta_info"]["cached_tokens"])
        if turn:
            assert int(headers["x-prefixroute-predicted-cached-tokens"]) > 300
        text += " " + answer["text"]
    assert len(set(served)) == 1 and min(cached[1:]) > 300
    page = await metrics_page(session, gw)
    # Counted as requests, and every answer's meta_info read as its usage report.
    assert 'prefixroute_requests_total{reason="prefix_match"' in page
    assert counter(page, "prefixroute_actual_cached_tokens_total") == sum(cached)
    assert counter(page, "prefixroute_usage_missing_total") == 0


async def test_token_id_prompts_route_on_their_ids(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    cluster = await make_cluster(4)
    gw = await make_gateway(cluster.urls, **STEADY)
    ids = list(range(100, 700))
    _, first, _ = await generate(session, gw, {"input_ids": ids})
    status, again, raw = await generate(session, gw, {"input_ids": [ids + [7, 8, 9]]})
    assert status == 200, raw
    assert again["x-prefixroute-replica"] == first["x-prefixroute-replica"]
    assert int(again["x-prefixroute-predicted-cached-tokens"]) > 500
    assert json.loads(raw)["meta_info"]["cached_tokens"] > 500


async def test_a_generate_stream_is_relayed_and_its_counts_learned(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    cluster = await make_cluster(1)
    gw = await make_gateway(cluster.urls, **STEADY)
    body = {"text": words(200), "sampling_params": {"max_new_tokens": 4}, "stream": True}
    for _ in range(2):  # the second is served from the first one's cache
        status, headers, raw = await generate(session, gw, body)
        assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
        assert raw.endswith("data: [DONE]\n\n")
        chunks = [json.loads(e[6:]) for e in raw.split("\n\n") if e.startswith("data: {")]
        assert [c["meta_info"]["completion_tokens"] for c in chunks] == [1, 2, 3, 4]
    page = await metrics_page(session, gw)
    assert counter(page, "prefixroute_actual_cached_tokens_total") == chunks[-1]["meta_info"][
        "cached_tokens"
    ] > 150  # fmt: skip
    assert counter(page, "prefixroute_usage_missing_total") == 0


async def test_an_adapters_blocks_are_not_the_base_models(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    cluster = await make_cluster(1, dataclasses.replace(FAST_REPLICA, adapters=("sql",)))
    gw = await make_gateway(cluster.urls, **STEADY)
    text = words(300)

    async def predicted_and_cached(**fields: Any) -> tuple[int, int]:
        body = {"text": text, "sampling_params": {"max_new_tokens": 1}, **fields}
        status, headers, raw = await generate(session, gw, body)
        assert status == 200, raw
        return int(headers["x-prefixroute-predicted-cached-tokens"]), json.loads(raw)[
            "meta_info"
        ]["cached_tokens"]  # fmt: skip

    await predicted_and_cached()
    assert await predicted_and_cached(lora_path="sql") == (0, 0)
    predicted, cached = await predicted_and_cached(lora_path="sql")
    assert predicted > 250 and cached > 250


async def test_two_tenants_on_generate_are_strangers(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """One replica, so tenant B lands where A's prompt is cached: only the ``extra_key`` the
    gateway sets keeps the engine from serving B from A's blocks."""
    cluster = await make_cluster(1)
    tenancy = TenancyConfig(isolation=True, cache_salt_secret=SECRET)
    gw = await make_gateway(cluster.urls, tenancy=tenancy, **STEADY)
    body = {"text": words(300), "sampling_params": {"max_new_tokens": 1}}

    async def send_as(team: str) -> tuple[int, int]:
        # The client's own extra_key is the gateway's to replace.
        status, headers, raw = await generate(
            session, gw, {**body, "extra_key": "shared"}, headers={"x-tenant-id": team}
        )
        assert status == 200, raw
        predicted = int(headers["x-prefixroute-predicted-cached-tokens"])
        return predicted, json.loads(raw)["meta_info"]["cached_tokens"]

    await send_as("team-a")
    predicted, cached = await send_as("team-a")
    assert predicted > 250 and cached > 250
    assert await send_as("team-b") == (0, 0)


async def test_the_gateway_adds_nothing_to_a_generate_body_but_the_tenants_key(
    make_gateway: GatewayFactory, make_fake: FakeFactory, session: aiohttp.ClientSession
) -> None:
    async def answer(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        meta = {"prompt_tokens": 3, "completion_tokens": 1, "cached_tokens": 0}
        await out.write(b"data: " + json.dumps({"text": "x", "meta_info": meta}).encode())
        await out.write(b"\n\ndata: [DONE]\n\n")
        return out

    fake = await make_fake(handler=answer)
    tenancy = TenancyConfig(isolation=True, cache_salt_secret=SECRET)
    gw = await make_gateway([fake.url], tenancy=tenancy, **STEADY)
    body = {"text": "a b c", "stream": True, "sampling_params": {"max_new_tokens": 1}}
    status, _, raw = await generate(session, gw, body)
    assert status == 200 and raw.endswith("data: [DONE]\n\n")
    sent = json.loads(fake.seen[-1].body)
    assert fake.seen[-1].path == "/generate"
    assert "stream_options" not in sent and "cache_salt" not in sent  # not SGLang's to read
    assert sent.pop("extra_key")  # the tenant's salt, under isolation
    assert sent == body


@pytest.mark.parametrize(
    "body",
    [{}, {"text": "a", "input_ids": [1]}, {"text": 5}, {"input_ids": ["a"]}, [1, 2], "text"],
)
async def test_a_generate_body_with_no_usable_prompt_is_a_400_that_reaches_no_replica(
    make_gateway: GatewayFactory,
    make_fake: FakeFactory,
    session: aiohttp.ClientSession,
    body: Any,
) -> None:
    fake = await make_fake()
    gw = await make_gateway([fake.url], **STEADY)
    async with session.post(gw.url + "/generate", json=body) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert not [s for s in fake.seen if s.path == "/generate"]
