"""``POST /admin/explain/...`` (issue 14 item 4): where a request would go and why, per
candidate, without sending it; keyed as the proxied path keys it (tenants included)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from prefixroute.gateway import TenancyConfig

from .fakes import FakeReplica
from .helpers import STEADY, GatewayFactory, send

TOKEN = "explain-admin-token"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
SYSTEM = "You are a careful assistant who answers in one short line. " * 8


def chat(question: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return {"model": "emulated", "messages": messages, "max_tokens": 1}


async def explain(
    session: aiohttp.ClientSession, url: str, body: object, query: str = "", **headers: str
) -> tuple[int, Any]:
    async with session.post(
        f"{url}/admin/explain/v1/chat/completions{query}",
        json=body,
        headers={**BEARER, **headers},
    ) as resp:
        return resp.status, await resp.json()


async def fakes(n: int) -> list[FakeReplica]:
    out = [FakeReplica() for _ in range(n)]
    for f in out:
        await f.start()
    return out


def proxied(replicas: list[FakeReplica]) -> int:
    return sum(1 for f in replicas for s in f.seen if s.path.startswith("/v1/"))


async def test_it_names_the_replica_the_next_request_really_goes_to(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    replicas = await fakes(3)
    try:
        gw = await make_gateway([f.url for f in replicas], admin_token=TOKEN, **STEADY)
        first = await send(session, gw.url, "/v1/chat/completions", chat("What is a KV cache?"))
        assert first.status == 200
        sent = proxied(replicas)
        blocks, entries = gw.router.index_blocks(), gw.router.index_entries()
        status, why = await explain(session, gw.url, chat("And what is prefix caching?"))
        assert status == 200, why
        # Nothing was sent, routed or recorded.
        assert proxied(replicas) == sent
        assert (gw.router.index_blocks(), gw.router.index_entries()) == (blocks, entries)
        assert all(gw.router.replica_load(r).in_flight == 0 for r in gw.router.replicas)
        assert why["policy"] == "predicted_ttft"
        assert why["replica"] == first.headers["x-prefixroute-replica"]  # it holds the prefix
        assert why["reason"] == "prefix_match"
        cands = {c["replica"]: c for c in why["candidates"]}
        assert len(cands) == 3 and sum(c["chosen"] for c in cands.values()) == 1
        home = cands[why["replica"]]
        assert home["matched_blocks"] > 0
        assert home["cached_tokens"] == why["predicted_cached_tokens"]
        assert all(c["matched_blocks"] == 0 for n, c in cands.items() if n != why["replica"])
        assert home["score"] == min(c["score"] for c in cands.values())
        assert all(c["predicted_ttft_s"] > 0 for c in cands.values())
        assert {c["url"] for c in cands.values()} == {f.url for f in replicas}
        real = await send(
            session, gw.url, "/v1/chat/completions", chat("And what is prefix caching?")
        )
        assert real.headers["x-prefixroute-replica"] == why["replica"]
    finally:
        for f in replicas:
            await f.stop()


async def test_it_needs_the_admin_token_and_a_valid_request(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    (fake,) = await fakes(1)
    try:
        gw = await make_gateway([fake.url], admin_token=TOKEN, **STEADY)
        url = f"{gw.url}/admin/explain/v1/completions"
        async with session.post(url, json={"prompt": "hi"}) as resp:
            assert resp.status == 401
            assert (await resp.json())["error"]["type"] == "authentication_error"
        async with session.post(url, data=b"{not json", headers=BEARER) as resp:
            assert resp.status == 400 and "error" in await resp.json()
        status, body = await explain(session, gw.url, chat("hi"), "?tenant=no%20spaces")
        assert status == 400 and "tenant name" in body["error"]["message"]
        status, body = await explain(session, gw.url, {**chat("hi"), "model": "nope"})
        assert status == 404 and body["error"]["code"] == "model_not_found"
        assert proxied([fake]) == 0
    finally:
        await fake.stop()


async def test_a_tenant_is_explained_in_its_own_key_space(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    replicas = await fakes(2)
    tenancy = TenancyConfig(isolation=True, cache_salt_secret="s" * 32)
    try:
        gw = await make_gateway(
            [f.url for f in replicas], admin_token=TOKEN, tenancy=tenancy, **STEADY
        )
        a = {"x-tenant-id": "team-a"}
        reply = await send(session, gw.url, "/v1/chat/completions", chat("q1"), headers=a)
        assert reply.status == 200
        _, as_a = await explain(session, gw.url, chat("q2"), "?tenant=team-a")
        _, as_b = await explain(session, gw.url, chat("q2"), "?tenant=team-b")
        assert max(c["matched_blocks"] for c in as_a["candidates"]) > 0
        assert max(c["matched_blocks"] for c in as_b["candidates"]) == 0  # a stranger
    finally:
        for f in replicas:
            await f.stop()


QUESTION = "What is a KV cache?"
AS_CHAT = {  # the same conversation as each other API's request body
    "/v1/responses": {"model": "emulated", "instructions": SYSTEM, "input": QUESTION},
    "/v1/messages": {"model": "emulated", "system": [{"type": "text", "text": SYSTEM}],
                     "max_tokens": 4, "messages": [{"role": "user", "content": QUESTION}]},
}  # fmt: skip


@pytest.mark.parametrize("path", sorted(AS_CHAT))
async def test_another_apis_request_is_explained_as_the_same_chat(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession, path: str
) -> None:
    """``/admin/explain/v1/responses`` and ``/admin/explain/v1/messages``: keyed as the chat
    their instructions and input, or system prompt and messages, stand for
    (core/responses_input.py, core/messages_input.py), so drawn to where that chat's prefix is."""
    replicas = await fakes(3)
    try:
        gw = await make_gateway([f.url for f in replicas], admin_token=TOKEN, **STEADY)
        first = await send(session, gw.url, "/v1/chat/completions", chat(QUESTION))
        async with session.post(
            f"{gw.url}/admin/explain{path}", json=AS_CHAT[path], headers=BEARER
        ) as resp:
            assert resp.status == 200
            why = await resp.json()
        assert why["replica"] == first.headers["x-prefixroute-replica"]
        assert why["reason"] == "prefix_match" and why["predicted_cached_tokens"] > 0
    finally:
        for f in replicas:
            await f.stop()
