"""Anthropic's Messages API (``/v1/messages``, which vLLM serves) through the gateway, on
emulated replicas that answer it as vLLM 0.32 does (emulate/_messages.py).

From the spec (core/messages_input.py, gateway/_usage.py, gateway/_sse.py): a conversation is
routed on its prefix like a chat, even as its client moves ``cache_control`` to the newest turn
and stamps its system prompt per request (Claude Code); its usage is read from a whole answer
and a stream in Anthropic's split (``input_tokens`` less ``cache_read_input_tokens``); a stream
is relayed as sent, with no ``stream_options`` added (vLLM's Messages stream reports usage on
its own)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from aiohttp import web

from prefixroute.gateway import Gateway, TenancyConfig, TenantSpec, hash_api_key

from . import helpers as h
from .helpers import STEADY, ClusterFactory, FakeFactory, GatewayFactory, words

REPLICA = "x-prefixroute-replica"


async def message(
    session: aiohttp.ClientSession, gw: Gateway, body: dict[str, Any]
) -> tuple[int, dict[str, str], str]:
    return await h.post_json(session, gw.url + "/v1/messages", {"model": "emulated", **body})


def events(raw: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in raw.split("\n") if line.startswith("data: {")]


def coding_agent_turn(turn: int, history: list[dict[str, Any]]) -> dict[str, Any]:
    """A request as Claude Code sends it: a per-request attribution block first in the system
    prompt, and the cache_control marker on the newest message only."""
    system = [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2; cch={turn}"},
              {"type": "text", "text": words(200), "cache_control": {"type": "ephemeral"}}]
    messages = [{"role": m["role"], "content": [{"type": "text", "text": m["text"]}]}
                for m in history]  # fmt: skip
    messages[-1]["content"][0]["cache_control"] = {"type": "ephemeral"}
    return {"system": system, "messages": messages, "max_tokens": 3, "stream": turn % 2 == 1}


async def test_a_coding_agents_conversation_stays_where_it_is_cached(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    cluster = await make_cluster(4)
    gw = await make_gateway(cluster.urls, **STEADY)
    history: list[dict[str, Any]] = []
    served, cached, prompts = [], [], []
    for turn in range(4):
        history.append({"role": "user", "text": words(120)})
        body = coding_agent_turn(turn, history)
        status, headers, raw = await message(session, gw, body)
        assert status == 200, raw
        if body["stream"]:
            got = events(raw)
            usage, text = got[-2]["usage"], "".join(e["delta"]["text"] for e in got
                                                    if e["type"] == "content_block_delta")
        else:
            answer = json.loads(raw)
            usage, text = answer["usage"], answer["content"][0]["text"]
        assert usage["output_tokens"] == 3
        served.append(headers[REPLICA])
        cached.append(usage["cache_read_input_tokens"])
        prompts.append(usage["input_tokens"] + usage["cache_read_input_tokens"]
                       + usage["cache_creation_input_tokens"])  # fmt: skip
        if turn:
            assert int(headers["x-prefixroute-predicted-cached-tokens"]) > 300
        history.append({"role": "assistant", "text": text})
    assert len(set(served)) == 1 and min(cached[1:]) > 300
    page = await h.metrics_page(session, gw)
    # Every answer's usage read, whole and streamed, in Anthropic's split.
    assert h.counter(page, "prefixroute_actual_cached_tokens_total") == sum(cached)
    assert h.counter(page, "prefixroute_usage_missing_total") == 0
    assert h.counter(page, "prefixroute_prompt_tokens_total") == sum(prompts)
    load = gw.router.replica_load(gw.registry.find(served[0]).id)
    assert load.completed == 4


async def test_a_stream_is_relayed_as_sent_without_a_usage_ask(
    make_gateway: GatewayFactory, make_fake: FakeFactory, make_cluster: ClusterFactory,
    session: aiohttp.ClientSession,
) -> None:
    fake = await make_fake()
    gw = await make_gateway([fake.url], **STEADY)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}
    await message(session, gw, body)
    sent = json.loads(fake.seen[-1].body)
    assert fake.seen[-1].path == "/v1/messages" and "stream_options" not in sent

    cluster = await make_cluster(1)
    gw = await make_gateway(cluster.urls, **STEADY)
    status, headers, raw = await message(session, gw, {**body, "max_tokens": 4})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    kinds = [e["type"] for e in events(raw)]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds.count("content_block_delta") == 4 and "[DONE]" not in raw
    page = await h.metrics_page(session, gw)
    assert h.counter(page, "prefixroute_usage_missing_total") == 0


async def test_a_bad_request_is_a_400_that_reaches_no_replica(
    make_gateway: GatewayFactory, make_fake: FakeFactory, session: aiohttp.ClientSession
) -> None:
    fake = await make_fake()
    gw = await make_gateway([fake.url], **STEADY)
    for body in ({"messages": []}, {"messages": [{"role": "user", "content": 5}]},
                 {"messages": [{"role": "user", "content": "x"}], "system": 3}):  # fmt: skip
        status, _, raw = await message(session, gw, body)
        assert status == 400 and "error" in json.loads(raw), raw
    assert [s.path for s in fake.seen if s.path.startswith("/v1/")] == []


def anthropic_error(raw: str, kind: str) -> None:
    """``raw`` is an error as Anthropic's API writes it, of type ``kind``, with a message."""
    body = json.loads(raw)
    assert set(body) == {"type", "error"} and body["type"] == "error", raw
    assert body["error"]["type"] == kind and body["error"]["message"], raw


async def test_the_gateways_own_errors_take_anthropics_shape_on_its_api(
    make_gateway: GatewayFactory, make_fake: FakeFactory, session: aiohttp.ClientSession
) -> None:
    """Anthropic's SDKs and Claude Code read ``{"type": "error", "error": {"type", "message"}}``;
    the OpenAI routes keep OpenAI's shape."""
    fake = await make_fake()
    key = "pr-" + "k" * 40
    tenancy = TenancyConfig(tenants=(TenantSpec("team", (hash_api_key(key),)),))
    gw = await make_gateway([fake.url], tenancy=tenancy, **STEADY)
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    status, _, raw = await message(session, gw, chat)  # no key
    assert status == 401
    anthropic_error(raw, "authentication_error")
    status, _, raw = await h.post_json(session, gw.url + "/v1/messages/count_tokens", chat)
    assert status == 401
    anthropic_error(raw, "authentication_error")
    auth = {"x-api-key": key}
    for body, code, kind in (
        ({"model": "nope", **chat}, 404, "not_found_error"),
        ({"model": "emulated", "messages": []}, 400, "invalid_request_error"),
    ):
        async with session.post(gw.url + "/v1/messages", json=body, headers=auth) as resp:
            assert resp.status == code
            anthropic_error(await resp.text(), kind)
    async with session.post(gw.url + "/v1/messages", data=b"{", headers=auth) as resp:
        assert resp.status == 400
        anthropic_error(await resp.text(), "invalid_request_error")
    # The OpenAI routes: OpenAI's shape.
    body = {"model": "nope", "messages": chat["messages"]}
    async with session.post(gw.url + "/v1/chat/completions", json=body, headers=auth) as resp:
        assert resp.status == 404
        assert (await resp.json())["error"]["code"] == "model_not_found"


async def test_a_messages_stream_that_breaks_ends_with_anthropics_error_event(
    make_gateway: GatewayFactory, make_fake: FakeFactory, session: aiohttp.ClientSession
) -> None:
    async def breaks(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(b'event: message_start\ndata: {"type":"message_start","message":{}}\n\n')
        await out.write(b'event: content_block_delta\ndata: {"type":"content_block_delta",'
                        b'"index":0,"delta":{"type":"text_delta","text":"a"}}\n\n')  # fmt: skip
        await asyncio.sleep(0.02)
        assert request.transport is not None
        request.transport.abort()
        return out

    fake = await make_fake(handler=breaks)
    gw = await make_gateway([fake.url], **STEADY)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}
    status, _, raw = await message(session, gw, body)
    assert status == 200 and "[DONE]" not in raw
    last = raw.rstrip("\n").split("\n\n")[-1].split("\n")
    assert last[0] == "event: error"
    anthropic_error(last[1].removeprefix("data: "), "api_error")
