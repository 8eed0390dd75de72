"""Tenants in the picker, as in ``serve``: who (API key or tenant header), may they (limits),
and their own key space (isolation, ``cache_salt``), from the same ``[tenancy]`` settings.

A refusal is the gateway's own answer: the picker's ``ImmediateResponse`` is compared with
what a running gateway answers the same request.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from prefixroute.epp import PickShared, PickStream
from prefixroute.gateway import (
    Gateway,
    GatewayConfig,
    TenancyConfig,
    TenantLimits,
    Tenants,
    TenantSpec,
    hash_api_key,
)

from .support import (
    BUFFERED,
    ENDPOINTS,
    pick,
    picked,
    request_body,
    request_headers,
    response_body,
    response_headers,
    shared,
)

SECRET = "0123456789abcdef-tenant-salt-secret"
KEY_A = "pr-" + "a" * 40
KEYS = TenancyConfig(tenants=(TenantSpec("acme", (hash_api_key(KEY_A),)),))


def isolated(**settings: Any) -> TenancyConfig:
    return TenancyConfig(isolation=True, cache_salt_secret=SECRET, **settings)


def completion(text: str) -> bytes:
    return json.dumps({"model": "m", "prompt": text, "max_tokens": 4}).encode()


def refusal(out: list[Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, JSON body, headers) of the picker's ImmediateResponse."""
    assert [r.WhichOneof("response") for r in out] == ["immediate_response"], out
    answer = out[0].immediate_response
    headers = {h.header.key: h.header.raw_value.decode() for h in answer.headers.set_headers}
    return answer.status.code, json.loads(answer.body), headers


def mutation(out: list[Any]) -> tuple[dict[str, str], list[str]]:
    """The request-header changes of a pick: (set, removed)."""
    for resp in out:
        kind = resp.WhichOneof("response")
        if kind in ("request_headers", "request_body"):
            m = getattr(resp, kind).response.header_mutation
            if m.set_headers or m.remove_headers:
                sets = {h.header.key: h.header.raw_value.decode() for h in m.set_headers}
                return sets, list(m.remove_headers)
    return {}, []


def sent_body(out: list[Any]) -> bytes:
    """The body Envoy forwards: the streamed one (full duplex) or the replaced one."""
    for resp in out:
        if resp.WhichOneof("response") == "request_body":
            mut = resp.request_body.response.body_mutation
            return bytes(mut.streamed_response.body or mut.body)
    raise AssertionError(out)


def rejections(s: PickShared, limit: str) -> float:
    value = s.metrics.registry.get_sample_value(
        "prefixroute_tenant_rejections_total", {"limit": limit}
    )
    return value or 0.0


async def gateway_answer(tenancy: TenancyConfig, headers: dict[str, str]) -> tuple[int, Any]:
    """What ``prefixroute serve`` answers the same request (status, JSON body)."""
    body = completion("hello there")
    async with (
        Gateway(GatewayConfig(port=0, tenancy=tenancy)) as gw,
        aiohttp.ClientSession() as session,
        session.post(gw.url + "/v1/completions", data=body, headers=headers) as r,
    ):
        return r.status, await r.json()


@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": "Bearer pr-wrong"}, {"authorization": "Basic " + KEY_A}],
    ids=["no-key", "unknown-key", "not-bearer"],
)
async def test_without_a_valid_key_the_picker_refuses_as_the_gateway_does(
    headers: dict[str, str],
) -> None:
    s = shared(tenancy=KEYS)
    stream = PickStream(s)
    out = await stream.handle(request_headers(extra=headers))  # refused before the body
    status, body, sent = refusal(out)
    assert (status, body) == await gateway_answer(KEYS, headers)
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    assert sent["content-type"].startswith("application/json")  # the gateway's own
    assert await stream.handle(request_body(completion("x"))) == []  # the rest is ignored
    stream.close()
    assert rejections(s, "api_key") == 1
    assert s.router.loads.get(f"http://{ENDPOINTS[0]}").in_flight == 0  # type: ignore[arg-type]


async def test_a_valid_key_names_the_tenant_and_stays_with_the_picker() -> None:
    s = shared(tenancy=KEYS)
    stream = PickStream(s)
    out = await pick(stream, completion("hi"), headers={"authorization": f"Bearer {KEY_A}"})
    assert picked(out)[0] in ENDPOINTS
    assert stream.admission is not None and stream.admission.scope.tenant.name == "acme"
    # The key was for the picker: the replica does not get it (the gateway drops it too).
    assert mutation(out) == ({"x-gateway-destination-endpoint": picked(out)[0]}, ["authorization"])


async def test_an_x_api_key_names_the_tenant_and_neither_key_reaches_the_replica() -> None:
    """Anthropic's header (its SDKs send it) is a key as a bearer token is, in the picker as in
    the gateway; the replica gets neither the client's ``x-api-key`` nor its bearer token."""
    s = shared(tenancy=KEYS)
    for headers in ({"x-api-key": KEY_A}, {"x-api-key": KEY_A, "authorization": "Bearer " + KEY_A}):
        stream = PickStream(s)
        out = await pick(stream, completion("hi"), headers=headers)
        assert stream.admission is not None and stream.admission.scope.tenant.name == "acme"
        assert sorted(mutation(out)[1]) == sorted(headers)
    stream = PickStream(s)
    out = await stream.handle(request_headers(extra={"x-api-key": "pr-wrong"}))
    assert refusal(out)[0] == 401
    s = shared(tenancy=KEYS, upstream_api_key="replica-key-123")
    out = await pick(PickStream(s), completion("hi"), headers={"x-api-key": KEY_A})
    sets, removed = mutation(out)
    assert sets["authorization"] == "Bearer replica-key-123" and removed == ["x-api-key"]


async def test_the_upstream_key_replaces_the_clients() -> None:
    s = shared(tenancy=KEYS, upstream_api_key="replica-key-123")
    out = await pick(PickStream(s), completion("hi"), headers={"authorization": f"Bearer {KEY_A}"})
    sets, removed = mutation(out)
    assert sets["authorization"] == "Bearer replica-key-123" and removed == []


async def test_without_keys_the_tenant_header_names_the_tenant() -> None:
    s = shared()
    stream = PickStream(s)
    await pick(stream, completion("hi"), headers={"x-tenant-id": "team-7"})
    assert stream.admission is not None and stream.admission.scope.tenant.name == "team-7"
    plain = PickStream(s)
    out = await pick(plain, completion("hi"))
    assert plain.admission is not None and plain.admission.scope.tenant.name == "default"
    assert mutation(out) == ({"x-gateway-destination-endpoint": picked(out)[0]}, [])

    bad = {"x-tenant-id": "no spaces allowed"}
    status, body, _ = refusal(await PickStream(s).handle(request_headers(extra=bad)))
    assert (status, body) == await gateway_answer(TenancyConfig(), bad)
    assert status == 400


async def test_a_tenant_in_flight_slot_is_held_until_its_stream_ends() -> None:
    tenancy = TenancyConfig(default_limits=TenantLimits(max_in_flight=1))
    s = shared(tenancy=tenancy)
    first = PickStream(s)
    await pick(first, completion("one"))
    second = PickStream(s)
    status, body, headers = refusal(await second.handle(request_headers()))
    assert status == 429 and body["error"]["limit"] == "max_in_flight"
    assert headers["retry-after"] == "1"
    second.close()  # a refused stream held no slot: closing it frees nothing
    assert rejections(s, "max_in_flight") == 1
    third = PickStream(s)
    assert refusal(await third.handle(request_headers()))[0] == 429
    first.close()  # the answer ended: its slot is free
    assert picked(await pick(PickStream(s), completion("two")))[0] in ENDPOINTS


async def test_the_prompt_token_budget_is_charged_on_the_hashed_prompt() -> None:
    tenancy = TenancyConfig(default_limits=TenantLimits(prompt_tokens_per_minute=100))
    s = shared(tenancy=tenancy)
    long = " ".join(f"w{i}" for i in range(200))  # ~ 200 words: more than the budget
    first = PickStream(s)
    assert picked(await pick(first, completion(long)))[0] in ENDPOINTS  # a full bucket lets it
    first.close()
    status, body, _ = refusal(await pick(PickStream(s), completion(long)))
    assert status == 429 and body["error"]["limit"] == "prompt_tokens_per_minute"
    assert rejections(s, "prompt_tokens_per_minute") == 1


async def test_the_prompt_budget_is_set_right_by_the_replicas_count_as_the_gateways() -> None:
    """Charged on the estimate at the pick, then set right by the answer's usage, as serve
    does (gateway/_ratelimit.py ``settle_prompt``): the second long prompt fits the budget."""
    tenancy = TenancyConfig(default_limits=TenantLimits(prompt_tokens_per_minute=300))
    s = shared(tenancy=tenancy)
    long = " ".join(f"w{i}" for i in range(200))  # ~ 250 tokens at 4 characters each
    first = PickStream(s)
    assert picked(await pick(first, completion(long)))[0] in ENDPOINTS
    usage = {"prompt_tokens": 20, "completion_tokens": 1, "total_tokens": 21}
    answer = json.dumps({"choices": [{"text": "x"}], "usage": usage}).encode()
    await first.handle(response_headers())
    await first.handle(response_body(answer, end_of_stream=True))
    first.close()
    second = PickStream(s)
    assert picked(await pick(second, completion(long)))[0] in ENDPOINTS  # 280 left, not 50
    assert rejections(s, "prompt_tokens_per_minute") == 0


async def test_isolation_keeps_tenants_apart_and_salts_the_body_as_the_gateway() -> None:
    s = shared(tenancy=isolated())
    salt = Tenants(isolated()).get("a", 0.0).salt  # the gateway's salt for tenant "a"
    text = " ".join(f"w{i}" for i in range(300))
    first = PickStream(s)
    out = await pick(first, completion(text), headers={"x-tenant-id": "a"})
    sent = sent_body(out)
    assert json.loads(sent)["cache_salt"] == salt
    assert mutation(out)[0]["content-length"] == str(len(sent))  # the body changed length
    again = PickStream(s)
    await pick(again, completion(text), headers={"x-tenant-id": "a"})
    assert again.decision is not None and again.decision.predicted_cached_tokens > 0
    stranger = PickStream(s)
    out = await pick(stranger, completion(text), headers={"x-tenant-id": "b"})
    assert stranger.decision is not None and stranger.decision.predicted_cached_tokens == 0
    assert json.loads(sent_body(out))["cache_salt"] != salt


async def test_a_shareable_prefix_is_shared_and_sent_without_salt() -> None:
    s = shared(tenancy=isolated(shareable_prefixes=("SYSTEM:",)))
    text = "SYSTEM: " + " ".join(f"w{i}" for i in range(300))
    body = json.dumps({"prompt": text, "max_tokens": 4, "cache_salt": "client's"}).encode()
    out = await pick(PickStream(s), body, headers={"x-tenant-id": "a"})
    assert "cache_salt" not in json.loads(sent_body(out))
    other = PickStream(s)
    await pick(other, body, headers={"x-tenant-id": "b"})
    assert other.decision is not None and other.decision.predicted_cached_tokens > 0


async def test_buffered_mode_replaces_the_body_in_the_body_answer() -> None:
    s = shared(tenancy=isolated())
    stream = PickStream(s)
    first = await stream.handle(request_headers(mode=BUFFERED, extra={"x-tenant-id": "a"}))
    assert [r.WhichOneof("response") for r in first] == ["request_headers"]
    out = await stream.handle(request_body(completion("hello")))
    assert [r.WhichOneof("response") for r in out] == ["request_body"]
    sent = bytes(out[0].request_body.response.body_mutation.body)
    assert "cache_salt" in json.loads(sent)
    assert mutation(out)[0]["content-length"] == str(len(sent))


async def test_without_isolation_the_body_goes_on_as_sent() -> None:
    body = completion("hello")
    out = await pick(PickStream(shared()), body, headers={"x-tenant-id": "a"})
    assert sent_body(out) == body
    assert "content-length" not in mutation(out)[0]
