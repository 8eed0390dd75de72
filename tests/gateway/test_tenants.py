"""Tenants end to end: isolation (router and engine), shareable prefixes, keys, limits, admin.

Emulated replicas honour ``cache_salt`` as vLLM does, so "strangers" is checked twice: the
router predicts nothing cached for the second tenant, and the engine reports nothing cached.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from polling import until
from prometheus_client import CollectorRegistry

from prefixroute.core import EMPTY_KEY, Endpoint, RouteKey
from prefixroute.gateway import Gateway, TenancyConfig, TenantLimits, TenantSpec, hash_api_key
from prefixroute.gateway._requests import key_of
from prefixroute.gateway._tenants import TENANTS, Tenants, TenantScope

from .fakes import FakeReplica, Seen, completion_body, held_until
from .helpers import (
    STEADY,
    ClusterFactory,
    FakeFactory,
    GatewayFactory,
    GatewayOf,
    Reply,
    send,
    words,
)

SECRET = "0123456789abcdef-tenant-salt-secret"


def isolated(**settings: Any) -> TenancyConfig:
    """Tenancy with isolation on and a salt secret, plus ``settings``."""
    return TenancyConfig(isolation=True, cache_salt_secret=SECRET, **settings)


ISOLATED = isolated()
KEY_A, KEY_B = "pr-" + "a" * 40, "pr-" + "b" * 40
TOKEN = "s3cret-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def team(name: str) -> dict[str, str]:
    return {"x-tenant-id": name}


async def predicted_total(session: aiohttp.ClientSession, gw: Gateway) -> float:
    """Sum over replicas of prefixroute_predicted_cached_tokens_total."""
    async with session.get(gw.url + "/metrics") as resp:
        text = await resp.text()
    return sum(
        float(v) for v in re.findall(r"^prefixroute_predicted_cached_tokens_total\{.*\} (\S+)$",
                                     text, re.M)
    )  # fmt: skip


async def complete(
    session: aiohttp.ClientSession, gw: Gateway, prompt: str, headers: dict[str, str]
) -> tuple[Reply, float]:
    """One completion; returns the reply and the tokens the router predicted cached for it."""
    before = await predicted_total(session, gw)
    body = {"prompt": prompt, "max_tokens": 2}
    reply = await send(session, gw.url, "/v1/completions", body, headers=headers)
    assert reply.complete, reply
    return reply, await predicted_total(session, gw) - before


@pytest.mark.parametrize("isolation", [True, False])
async def test_two_tenants_with_identical_prompts_are_strangers(
    make_cluster: ClusterFactory,
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
    isolation: bool,
) -> None:
    """One replica, so tenant B lands where A's prompt is cached: only the salt keeps them apart.
    Without isolation (the control) B is served from A's cache."""
    cluster = await make_cluster(1)
    tenancy = TenancyConfig(isolation=isolation, cache_salt_secret=SECRET)
    gw = await make_gateway(cluster.urls, tenancy=tenancy, **STEADY)
    prompt = words(400)
    first, _ = await complete(session, gw, prompt, team("team-a"))
    again, predicted_again = await complete(session, gw, prompt, team("team-a"))
    assert first.usage is not None and first.usage["prompt_tokens_details"]["cached_tokens"] == 0
    assert again.usage is not None and again.usage["prompt_tokens_details"]["cached_tokens"] > 300
    assert predicted_again > 300  # A's own turn: predicted and found
    other, predicted_other = await complete(session, gw, prompt, team("team-b"))
    assert other.usage is not None
    cached_other = other.usage["prompt_tokens_details"]["cached_tokens"]
    if isolation:
        assert predicted_other == 0 and cached_other == 0
    else:
        assert predicted_other > 300 and cached_other > 300


async def test_a_tenants_conversation_sticks_and_a_stranger_starts_cold(
    gateway_of: GatewayOf, session: aiohttp.ClientSession
) -> None:
    gw = await gateway_of(4, tenancy=ISOLATED, **STEADY)

    async def chat(
        tenant: str, messages: list[dict[str, str]]
    ) -> tuple[Reply, float, list[dict[str, str]]]:
        before = await predicted_total(session, gw)
        body: dict[str, Any] = {"messages": messages, "max_tokens": 3}
        reply = await send(session, gw.url, "/v1/chat/completions", body, headers=team(tenant))
        assert reply.complete, reply
        after = messages + [{"role": "assistant", "content": reply.text}]
        return reply, await predicted_total(session, gw) - before, after

    def turn(i: int) -> dict[str, str]:
        return {"role": "user", "content": f"turn {i}: " + words(120)}

    history: list[dict[str, str]] = [{"role": "system", "content": words(200)}]
    replicas = []
    for i in range(4):
        reply, predicted, history = await chat("team-a", history + [turn(i)])
        replicas.append(reply.headers["x-prefixroute-replica"])
        if i:
            assert predicted > 0
            assert reply.usage is not None
            assert reply.usage["prompt_tokens_details"]["cached_tokens"] > 0
    assert len(set(replicas)) == 1  # every turn went where the conversation was cached

    stranger: list[dict[str, str]] = [{"role": "system", "content": words(200)}]
    reply, predicted, stranger = await chat("team-b", stranger + [turn(0)])
    assert predicted == 0
    assert reply.usage is not None and reply.usage["prompt_tokens_details"]["cached_tokens"] == 0
    b_replica = reply.headers["x-prefixroute-replica"]
    reply, predicted, _ = await chat("team-b", stranger + [turn(1)])
    assert predicted > 0 and reply.headers["x-prefixroute-replica"] == b_replica


async def test_shareable_prefix_is_shared_and_the_rest_is_not(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    system = words(300)
    tenancy = TenancyConfig(
        isolation=True, cache_salt_secret=SECRET, shareable_prefixes=(f"system: {system}\n",)
    )
    cluster = await make_cluster(1)
    gw = await make_gateway(cluster.urls, tenancy=tenancy, **STEADY)
    shared = [{"role": "system", "content": system}]
    for tenant, question in (("team-a", "first question"), ("team-b", "second question")):
        body = {"messages": shared + [{"role": "user", "content": question}], "max_tokens": 2}
        reply = await send(session, gw.url, "/v1/chat/completions", body, headers=team(tenant))
        assert reply.complete and reply.usage is not None
    assert reply.usage["prompt_tokens_details"]["cached_tokens"] > 250  # B reused A's prompt
    # A private system prompt is not shared.
    private = [{"role": "system", "content": words(299)}]
    for tenant in ("team-a", "team-b"):
        body = {"messages": private + [{"role": "user", "content": "q"}], "max_tokens": 2}
        reply = await send(session, gw.url, "/v1/chat/completions", body, headers=team(tenant))
    assert reply.usage is not None and reply.usage["prompt_tokens_details"]["cached_tokens"] == 0


async def test_the_gateway_owns_cache_salt(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession, make_fake: FakeFactory
) -> None:
    fake = await make_fake()
    tenancy = isolated(
        shareable_prefixes=("public:",),
        tenants=(TenantSpec("team-c", cache_salt="configured-salt"),),
    )
    gw = await make_gateway([fake.url], tenancy=tenancy, **STEADY)
    sent = []
    for tenant, prompt, salt in [
        ("team-a", "hello", None),
        ("team-a", "hello", "client-chosen"),
        ("team-b", "hello", None),
        ("team-c", "hello", None),
        ("team-a", "public: hello", "client-chosen"),
    ]:
        body: dict[str, Any] = {"prompt": prompt, "model": "emulated"}
        if salt:
            body["cache_salt"] = salt
        reply = await send(session, gw.url, "/v1/completions", body, headers=team(tenant))
        assert reply.status == 200
        sent.append(json.loads(fake.seen[-1].body))
    salts = [b.get("cache_salt") for b in sent]
    assert salts[0] == salts[1] and len(salts[0]) == 43  # 256-bit base64url, client's replaced
    assert salts[2] != salts[0] and salts[3] == "configured-salt"
    assert "cache_salt" not in sent[4]  # shared: no salt at all
    assert sent[0]["prompt"] == "hello" and sent[0]["model"] == "emulated"


async def test_api_keys(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession, make_fake: FakeFactory
) -> None:
    fake = await make_fake()
    tenancy = isolated(
        tenants=(
            TenantSpec("team-a", (hash_api_key(KEY_A),)),
            TenantSpec("team-b", (hash_api_key(KEY_B),)),
        ),
    )
    gw = await make_gateway([fake.url], tenancy=tenancy, **STEADY)
    body = {"prompt": "hello"}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY_A}):
        reply = await send(session, gw.url, "/v1/completions", body, headers=headers)
        assert reply.status == 401 and reply.error is not None
        assert reply.error["code"] == "invalid_api_key"
    async with session.get(gw.url + "/v1/models") as resp:
        assert resp.status == 401  # every /v1 path needs a key
    async with session.get(gw.url + "/health") as resp:
        assert resp.status == 200  # probes do not
    assert not completions(fake)

    salts = []
    for headers in (
        {"Authorization": f"Bearer {KEY_A}"},
        {"Authorization": f"Bearer {KEY_A}", "x-tenant-id": "team-b"},  # header ignored
        {"Authorization": f"Bearer {KEY_B}"},
    ):
        reply = await send(session, gw.url, "/v1/completions", body, headers=headers)
        assert reply.status == 200
        assert "Authorization" not in fake.seen[-1].headers  # the key was for the gateway
        salts.append(json.loads(fake.seen[-1].body)["cache_salt"])
    assert salts[0] == salts[1] != salts[2]


async def test_anthropics_x_api_key_header_is_a_key_too_and_reaches_no_replica(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession, make_fake: FakeFactory
) -> None:
    """Anthropic's SDKs (and Claude Code with ANTHROPIC_API_KEY) send ``x-api-key: <key>``, not
    a bearer token (gateway/_tenants.py): it names the tenant (here: its isolation salt), a
    wrong one is a 401, a bearer token wins over it, and the replica never sees the client's
    key in either header."""
    fake = await make_fake()
    tenancy = isolated(tenants=(TenantSpec("team-a", (hash_api_key(KEY_A),)),
                                TenantSpec("team-b", (hash_api_key(KEY_B),))))  # fmt: skip
    gw = await make_gateway([fake.url], tenancy=tenancy, **STEADY)
    body = {"model": "emulated", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
    reply = await send(session, gw.url, "/v1/messages", body, headers={"x-api-key": "wrong"})
    assert reply.status == 401 and reply.error is not None
    assert reply.error["type"] == "authentication_error"  # in Anthropic's shape (_errors)

    def calls() -> list[Seen]:
        return [seen for seen in fake.seen if seen.path == "/v1/messages"]

    assert not calls()
    salts = []
    for headers in ({"Authorization": f"Bearer {KEY_B}"}, {"x-api-key": KEY_B},
                    {"Authorization": f"Bearer {KEY_A}", "x-api-key": KEY_B}):  # fmt: skip
        reply = await send(session, gw.url, "/v1/messages", body, headers=headers)
        assert reply.status == 200, reply
        sent = calls()[-1].headers
        assert "x-api-key" not in sent and "Authorization" not in sent  # the keys were ours
        salts.append(json.loads(calls()[-1].body)["cache_salt"])
    assert salts[0] == salts[1] != salts[2]  # team-b, team-b, team-a


async def test_upstream_key_replaces_the_clients(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession, make_fake: FakeFactory
) -> None:
    fake = await make_fake()
    tenancy = TenancyConfig(tenants=(TenantSpec("team-a", (hash_api_key(KEY_A),)),))
    gw = await make_gateway([fake.url], tenancy=tenancy, upstream_api_key="replica-key", **STEADY)
    headers = {"Authorization": f"Bearer {KEY_A}"}
    reply = await send(session, gw.url, "/v1/completions", {"prompt": "x"}, headers=headers)
    assert reply.status == 200
    assert fake.seen[-1].headers["Authorization"] == "Bearer replica-key"
    assert "cache_salt" not in json.loads(fake.seen[-1].body)  # isolation is off


def completions(fake: FakeReplica) -> list[Seen]:
    return [s for s in fake.seen if s.path.startswith("/v1/")]


def rejected(reply: Reply, limit: str) -> None:
    assert reply.status == 429, reply
    assert reply.error is not None and reply.error["limit"] == limit
    assert reply.error["type"] == "rate_limit_error"
    assert int(reply.headers["Retry-After"]) >= 1


async def test_request_rate_and_prompt_token_limits(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    cluster = await make_cluster(1)
    tenancy = TenancyConfig(
        default_limits=TenantLimits(requests_per_second=0.5, burst=2),
        tenants=(TenantSpec("small", limits=TenantLimits(prompt_tokens_per_minute=60)),),
    )
    gw = await make_gateway(cluster.urls, tenancy=tenancy, **STEADY)
    body = {"prompt": "hello there", "max_tokens": 1}
    for _ in range(2):
        assert (await send(session, gw.url, "/v1/completions", body, headers=team("a"))).complete
    rejected(
        await send(session, gw.url, "/v1/completions", body, headers=team("a")),
        "requests_per_second",
    )
    # Another tenant has its own bucket.
    assert (await send(session, gw.url, "/v1/completions", body, headers=team("b"))).complete
    # 60 prompt tokens a minute: a ~100-token prompt goes through on a full bucket, then waits.
    big = {"prompt": words(80), "max_tokens": 1}
    assert (await send(session, gw.url, "/v1/completions", big, headers=team("small"))).complete
    reply = await send(session, gw.url, "/v1/completions", big, headers=team("small"))
    rejected(reply, "prompt_tokens_per_minute")
    assert int(reply.headers["Retry-After"]) > 60
    async with session.get(gw.url + "/metrics") as resp:
        text = await resp.text()
    assert 'prefixroute_tenant_rejections_total{limit="requests_per_second"} 1.0' in text
    assert 'prefixroute_tenant_rejections_total{limit="prompt_tokens_per_minute"} 1.0' in text


async def test_in_flight_cap(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession, make_fake: FakeFactory
) -> None:
    release = asyncio.Event()
    fake = await make_fake(handler=held_until(release))
    tenancy = TenancyConfig(default_limits=TenantLimits(max_in_flight=1))
    gw = await make_gateway([fake.url], tenancy=tenancy, **STEADY)
    first = asyncio.create_task(
        send(session, gw.url, "/v1/completions", {"prompt": "x"}, headers=team("a"))
    )
    await until(lambda: bool(completions(fake)))  # the first is held at the replica
    second = await send(session, gw.url, "/v1/completions", {"prompt": "x"}, headers=team("a"))
    rejected(second, "max_in_flight")
    other = asyncio.create_task(
        send(session, gw.url, "/v1/completions", {"prompt": "x"}, headers=team("b"))
    )
    await until(lambda: len(completions(fake)) >= 2)
    release.set()
    assert (await first).status == 200 and (await other).status == 200
    reply = await send(session, gw.url, "/v1/completions", {"prompt": "x"}, headers=team("a"))
    assert reply.status == 200  # the slot came back


async def test_bad_tenant_header_is_400(
    gateway_of: GatewayOf, session: aiohttp.ClientSession
) -> None:
    gw = await gateway_of(1, **STEADY)
    for bad in ("", "a b", "x" * 65, "-lead", "é"):
        reply = await send(session, gw.url, "/v1/completions", {"prompt": "x"}, headers=team(bad))
        assert reply.status == 400, bad


async def test_admin_sets_and_resets_limits(
    gateway_of: GatewayOf, session: aiohttp.ClientSession
) -> None:
    gw = await gateway_of(1, admin_token=TOKEN, **STEADY)
    api = gw.url + "/admin/tenants"
    body = {"prompt": "x", "max_tokens": 1}
    async with session.put(api + "/team-a/limits", json={"requests_per_second": 1}) as resp:
        assert resp.status == 401
    async with session.put(
        api + "/team-a/limits", json={"requests_per_second": 0.1, "burst": 1}, headers=ADMIN
    ) as resp:
        assert resp.status == 200
        tenant = (await resp.json())["tenant"]
    assert tenant["limits"]["requests_per_second"] == 0.1 and tenant["overridden"]
    assert (await send(session, gw.url, "/v1/completions", body, headers=team("team-a"))).complete
    rejected(
        await send(session, gw.url, "/v1/completions", body, headers=team("team-a")),
        "requests_per_second",
    )
    async with session.get(api, headers=ADMIN) as resp:
        listed = await resp.json()
    assert [t["name"] for t in listed["tenants"]] == ["team-a"]
    assert listed["tenants"][0]["requests_available"] < 1
    for bad in ({"requests_per_second": -1}, {"rps": 1}, [1]):
        async with session.put(api + "/team-a/limits", json=bad, headers=ADMIN) as resp:
            assert resp.status == 400, bad
    # 1e400 is valid JSON and parses to inf: it was taken, then every request was a 500
    infinite = '{"requests_per_second": 1e400}'
    async with session.put(api + "/team-a/limits", data=infinite, headers=ADMIN) as resp:
        assert resp.status == 400
    # and an integer of 401 digits, past any float: was a 500 and a traceback
    huge = '{"burst": 1' + "0" * 400 + "}"
    async with session.put(api + "/team-a/limits", data=huge, headers=ADMIN) as resp:
        assert resp.status == 400
    async with session.put(api + "/bad name/limits", json={}, headers=ADMIN) as resp:
        assert resp.status == 400
    async with session.delete(api + "/team-a/limits", headers=ADMIN) as resp:
        assert (await resp.json())["tenant"]["limits"]["requests_per_second"] is None
    assert (await send(session, gw.url, "/v1/completions", body, headers=team("team-a"))).complete


async def test_admin_on_its_own_listener(
    gateway_of: GatewayOf, session: aiohttp.ClientSession
) -> None:
    gw = await gateway_of(1, admin_token=TOKEN, admin_port=0, **STEADY)
    assert gw.admin_url != gw.url
    async with session.get(gw.url + "/admin/replicas", headers=ADMIN) as resp:
        assert resp.status == 404  # not on the public listener
    async with session.get(gw.admin_url + "/admin/replicas", headers=ADMIN) as resp:
        assert resp.status == 200 and len((await resp.json())["replicas"]) == 1
        assert resp.headers["x-request-id"]
    async with session.get(gw.admin_url + "/admin/tenants") as resp:
        assert resp.status == 401
    async with session.post(gw.admin_url + "/v1/completions", json={"prompt": "x"}) as resp:
        assert resp.status == 404  # and no traffic on the admin one
    reply = await send(session, gw.url, "/v1/completions", {"prompt": "x", "max_tokens": 1})
    assert reply.complete


def test_isolation_reads_the_key_and_edits_the_parsed_body() -> None:
    """The shareable check reads the routing text the key already holds (never the body
    again), so it must run before a tokenizer turns that text into token ids."""
    tenancy = TenancyConfig(
        isolation=True, cache_salt_secret=SECRET, shareable_prefixes=("system: public\n",)
    )
    tenants = Tenants(tenancy, registry=CollectorRegistry())
    scope = TenantScope(tenants.get("team-a", 0.0), tenants)
    seed, salt = scope.tenant.seed, scope.tenant.salt
    chat = {"messages": [{"role": "system", "content": "public"}], "cache_salt": "mine"}
    key = scope.isolate_key(Endpoint.CHAT, key_of(Endpoint.CHAT, chat), chat)
    assert (key.tenant, key.seed) == ("team-a", None) and "cache_salt" not in chat  # shared
    # The same text in the body but not in the key: the key decides, the body is not re-read.
    private = scope.isolate_key(Endpoint.CHAT, RouteKey(None, [1, 2]), chat)
    assert (private.seed, chat["cache_salt"]) == (seed, salt)
    other: dict[str, object] = {"input": "x"}  # another /v1 call: no key space, no salt
    assert scope.isolate_key(Endpoint.OTHER, EMPTY_KEY, other).seed is None
    assert other == {"input": "x"}
    no_isolation = Tenants(TenancyConfig(), registry=CollectorRegistry())
    plain: dict[str, object] = {"prompt": "p"}
    open_scope = TenantScope(no_isolation.get("team-b", 0.0), no_isolation)
    key = open_scope.isolate_key(Endpoint.COMPLETIONS, RouteKey("p", None), plain)
    assert (key.tenant, key.seed, plain) == ("team-b", None, {"prompt": "p"})


async def test_the_prompt_budget_is_set_right_by_the_replicas_count(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """Charged on the router's estimate before routing, then set right by the answer's
    ``usage.prompt_tokens``: a prompt the router mis-counted does not keep its tenant out (one
    long prompt at a ratio learned on short chats once did for an hour)."""

    async def counts_3000(request: web.Request) -> web.StreamResponse:
        return web.Response(body=completion_body(prompt=3_000), content_type="application/json")

    fake = await make_fake(handler=counts_3000)
    limits = TenantLimits(prompt_tokens_per_minute=6_000)  # refilled at 100 a second
    tenancy = TenancyConfig(tenants=(TenantSpec("t", limits=limits),))
    gw = await make_gateway([fake.url], tenancy=tenancy, **STEADY)
    limiter = gw.app[TENANTS].get("t", time.monotonic()).limiter
    bucket = limiter.prompt_tokens
    assert bucket is not None
    body = {"prompt": "x" * 16_000, "max_tokens": 1}  # about 4,000 tokens at 4 characters each
    reply = await send(session, gw.url, "/v1/completions", body, headers=team("t"))
    assert reply.status == 200
    # Set right once the answer went out: 6,000 less the replica's 3,000, not less the
    # estimate's 4,000 (refilled meanwhile at 100 a second).
    async with asyncio.timeout(5):
        while not bucket.level >= 2_900:
            await asyncio.sleep(0.01)
    bucket.refill(time.monotonic())
    assert bucket.level < 3_500
