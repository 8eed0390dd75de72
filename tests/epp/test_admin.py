"""The picker's admin API is ``serve``'s (issue 13: "admin listing, health, metrics and tenants
behave as in serve"): the same handlers on the picker's HTTP listener, the same bearer token,
and what they change is what the picker's ext_proc path then does. Endpoints are the one
difference: the discovery source owns them, so adding or removing one is a 409, while draining
one works (and lasts while the source keeps listing it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
from gateway.helpers import wrong_credentials
from polling import until

from prefixroute.emulate import EmulatedCluster
from prefixroute.epp import EndpointPicker, EppConfig
from prefixroute.gateway import TenancyConfig

from .conftest import PickerFactory, side
from .grpc_envoy import Exchange, through

TOKEN = "picker-admin-token"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
CHAT = "/v1/chat/completions"
EXPLAIN = "/admin/explain/v1/chat/completions"
TEAM_A = {"x-tenant-id": "team-a"}
TEAM_B = {"x-tenant-id": "team-b"}
SYSTEM = "You are a careful assistant who answers in one short line. " * 8


def endpoint_of(url: str) -> str:
    """``http://127.0.0.1:8000`` -> ``127.0.0.1:8000``, as the picker names endpoints."""
    return url.removeprefix("http://")


def chat(question: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return {"model": "emulated", "messages": messages, "max_tokens": 2}


async def call(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    body: Any = None,
    headers: dict[str, str] = BEARER,
) -> tuple[int, Any]:
    """(status, JSON body) of an admin call; every answer, refusals included, is JSON."""
    async with session.request(method, url, json=body, headers=headers) as resp:
        assert resp.content_type == "application/json", await resp.text()
        return resp.status, await resp.json()


def admin_calls(epp: EndpointPicker) -> list[tuple[str, str, Any]]:
    """Every admin route, once: (method, path, body)."""
    ref = quote(next(iter(epp.registry)).url, safe="")
    return [
        ("GET", "/admin/replicas", None),
        ("POST", "/admin/replicas", {"url": "http://127.0.0.1:9"}),
        ("POST", f"/admin/replicas/{ref}/drain", None),
        ("DELETE", f"/admin/replicas/{ref}", None),
        ("GET", "/admin/tenants", None),
        ("GET", "/admin/tenants/team-a", None),
        ("PUT", "/admin/tenants/team-a/limits", {"max_in_flight": 1}),
        ("DELETE", "/admin/tenants/team-a/limits", None),
        ("POST", EXPLAIN, chat("hi")),
        ("POST", "/admin/explain/v1/completions", {"model": "emulated", "prompt": "hi"}),
    ]


def untouched(epp: EndpointPicker) -> bool:
    """Nothing an admin call changes has changed: four endpoints, none draining, no tenant
    with limits of its own."""
    records, tenants = list(epp.registry), epp.tenants
    overridden = [n for n in tenants.names() if tenants.describe(n, 0.0)["overridden"]]
    return len(records) == 4 and not any(r.draining for r in records) and not overridden


async def test_tenant_limits_set_here_change_what_the_picker_admits(
    make_picker: PickerFactory, session: aiohttp.ClientSession
) -> None:
    epp = await make_picker(admin_token=TOKEN)
    api = side(epp) + "/admin/tenants"
    status, body = await call(session, "PUT", api + "/team-a/limits", {"max_in_flight": 1})
    assert status == 200, body
    assert body["tenant"]["limits"]["max_in_flight"] == 1 and body["tenant"]["overridden"]
    held = Exchange(epp)  # team-a's one request in flight: picked, not answered yet
    try:
        await held.pick(CHAT, chat("one"), TEAM_A)
        status, refused = await Exchange(epp).refused(CHAT, TEAM_A)
        assert status == 429 and refused["error"]["limit"] == "max_in_flight"
        other = Exchange(epp)
        await other.pick(CHAT, chat("two"), TEAM_B)  # another tenant's limits are its own
        await other.close()

        status, listed = await call(session, "GET", api)
        assert status == 200
        tenants = {t["name"]: t for t in listed["tenants"]}
        assert set(tenants) == {"team-a", "team-b"}
        assert tenants["team-a"]["in_flight"] == 1 and tenants["team-b"]["in_flight"] == 0
        status, one = await call(session, "GET", api + "/team-a")
        assert status == 200 and one["tenant"]["limits"]["max_in_flight"] == 1

        status, body = await call(session, "DELETE", api + "/team-a/limits")
        assert status == 200 and body["tenant"]["limits"]["max_in_flight"] is None
        assert not body["tenant"]["overridden"]
        again = Exchange(epp)  # the first is still in flight: the limit is gone
        await again.pick(CHAT, chat("three"), TEAM_A)
        await again.close()
    finally:
        await held.close()


async def test_a_rate_set_here_refuses_the_next_request_until_it_is_reset(
    make_picker: PickerFactory, session: aiohttp.ClientSession
) -> None:
    epp = await make_picker(admin_token=TOKEN)
    limits = side(epp) + "/admin/tenants/team-a/limits"
    status, _ = await call(session, "PUT", limits, {"requests_per_second": 0.1, "burst": 1})
    assert status == 200
    assert (await through(epp, session, CHAT, chat("one"), TEAM_A)).endpoint  # the burst
    status, refused = await Exchange(epp).refused(CHAT, TEAM_A)
    assert status == 429 and refused["error"]["limit"] == "requests_per_second"
    async with session.get(side(epp) + "/metrics") as resp:  # the gateway's metric, as serve
        assert 'prefixroute_tenant_rejections_total{limit="requests_per_second"} 1.0' in (
            await resp.text()
        )
    status, _ = await call(session, "DELETE", limits)
    assert status == 200
    assert (await through(epp, session, CHAT, chat("two"), TEAM_A)).endpoint


async def test_a_wrong_or_missing_token_is_a_json_401_that_changes_nothing(
    make_picker: PickerFactory, session: aiohttp.ClientSession
) -> None:
    epp = await make_picker(admin_token=TOKEN)
    for headers in wrong_credentials(TOKEN):  # Basic with the token too: bearer only, as serve
        for method, path, body in admin_calls(epp):
            status, answer = await call(session, method, side(epp) + path, body, headers)
            assert status == 401, (method, path, headers)
            assert answer["error"]["type"] == "authentication_error"
    assert untouched(epp)
    await Exchange(epp).pick(CHAT, chat("hi"), TEAM_A)  # and the picker picks as before


async def test_without_a_token_there_is_no_admin_api(
    make_picker: PickerFactory, session: aiohttp.ClientSession
) -> None:
    epp = await make_picker()  # a loopback listener and a loopback client: still nothing
    for method, path, body in admin_calls(epp):
        status, answer = await call(session, method, side(epp) + path, body)
        assert status == 404, (method, path)
        assert answer["error"]["message"] == "Not Found"  # serve's JSON 404
    assert untouched(epp)


async def test_bad_calls_are_4xx_with_a_json_body(
    make_picker: PickerFactory, session: aiohttp.ClientSession
) -> None:
    epp = await make_picker(admin_token=TOKEN)
    base = side(epp)
    limits = base + "/admin/tenants/team-a/limits"
    for bad in ({"max_in_flight": -1}, {"rps": 1}, [1], "not an object"):
        assert (await call(session, "PUT", limits, bad))[0] == 400, bad
    async with session.put(limits, data=b"{not json", headers=BEARER) as resp:
        assert resp.status == 400 and "error" in await resp.json()
    assert (await call(session, "GET", base + "/admin/tenants/bad%20name"))[0] == 400
    missing = quote("http://127.0.0.1:9", safe="")
    assert (await call(session, "POST", f"{base}/admin/replicas/{missing}/drain"))[0] == 404
    assert (await call(session, "GET", base + "/admin/nothing-here"))[0] == 404
    assert (await call(session, "POST", base + EXPLAIN, {**chat("hi"), "model": "nope"}))[0] == 404
    assert untouched(epp)


async def test_explain_says_where_the_next_pick_goes_without_picking(
    make_picker: PickerFactory, session: aiohttp.ClientSession
) -> None:
    epp = await make_picker(admin_token=TOKEN)
    first = await through(epp, session, CHAT, chat("What is a KV cache?"))
    router, fleet = epp.router, epp.shared.fleet
    assert fleet is not None  # the page is mounted: decisions are recorded
    before = (router.index_blocks(), router.index_entries(), len(fleet.decisions))
    status, why = await call(session, "POST", side(epp) + EXPLAIN, chat("And prefix caching?"))
    assert status == 200, why
    assert endpoint_of(why["url"]) == first.endpoint and why["reason"] == "prefix_match"
    assert len(why["candidates"]) == 4 and sum(c["chosen"] for c in why["candidates"]) == 1
    # Nothing was routed, recorded or held.
    assert (router.index_blocks(), router.index_entries(), len(fleet.decisions)) == before
    assert all(router.replica_load(r).in_flight == 0 for r in router.replicas)
    real = await through(epp, session, CHAT, chat("And prefix caching?"))
    assert real.endpoint == first.endpoint


async def test_explain_keys_a_tenant_as_the_picker_does(
    make_picker: PickerFactory, session: aiohttp.ClientSession
) -> None:
    tenancy = TenancyConfig(isolation=True, cache_salt_secret="s" * 32)
    epp = await make_picker(admin_token=TOKEN, tenancy=tenancy)
    await through(epp, session, CHAT, chat("q1"), TEAM_A)
    url = side(epp) + EXPLAIN
    _, as_a = await call(session, "POST", url + "?tenant=team-a", chat("q2"))
    _, as_b = await call(session, "POST", url + "?tenant=team-b", chat("q2"))
    assert max(c["matched_blocks"] for c in as_a["candidates"]) > 0
    assert max(c["matched_blocks"] for c in as_b["candidates"]) == 0  # a stranger's key space
    status, body = await call(session, "POST", url + "?tenant=no%20spaces", chat("q2"))
    assert status == 400 and "tenant name" in body["error"]["message"]


async def test_endpoints_are_the_discovery_sources_but_draining_works(
    make_picker: PickerFactory, session: aiohttp.ClientSession
) -> None:
    epp = await make_picker(admin_token=TOKEN)
    api = side(epp) + "/admin/replicas"
    status, listed = await call(session, "GET", api)
    assert status == 200 and len(listed["replicas"]) == 4  # serve's listing, serve's shape
    drained, kept = listed["replicas"][0]["url"], listed["replicas"][1]["url"]
    status, body = await call(session, "POST", api, {"url": "http://127.0.0.1:9"})
    assert status == 409 and "--endpoint list" in body["error"]["message"]
    status, body = await call(session, "DELETE", f"{api}/{quote(kept, safe='')}")
    assert status == 409 and body["error"]["code"] == "conflict"
    assert len(epp.registry) == 4

    status, body = await call(session, "POST", f"{api}/{quote(drained, safe='')}/drain")
    assert status == 200 and body["replica"]["status"] == "draining"
    for i in range(6):
        passed = await through(epp, session, CHAT, chat(f"question {i}"))
        assert passed.endpoint != endpoint_of(drained)
    async with session.get(side(epp) + "/health") as resp:
        assert (await resp.json())["healthy_endpoints"] == 3


async def test_with_an_endpoints_file_a_drain_outlasts_its_reread(
    make_picker: PickerFactory,
    cluster: EmulatedCluster,
    session: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    path = tmp_path / "endpoints"
    path.write_text("\n".join(endpoint_of(u) for u in cluster.urls) + "\n")
    epp = await make_picker(admin_token=TOKEN, epp={"endpoints_file": str(path)})
    api = side(epp) + "/admin/replicas"
    status, body = await call(session, "POST", api, {"url": "http://127.0.0.1:9"})
    assert status == 409 and str(path) in body["error"]["message"]
    drained = cluster.urls[0]
    assert (await call(session, "POST", f"{api}/{quote(drained, safe='')}/drain"))[0] == 200
    path.write_text("\n".join(endpoint_of(u) for u in cluster.urls[:3]) + "\n")
    os.utime(path, (1e9, 1e9))  # a new modification time, whatever the clock's resolution
    await until(lambda: len(epp.registry) == 3)  # re-read
    status, listed = await call(session, "GET", api)
    assert {r["url"]: r["status"] for r in listed["replicas"]}[drained] == "draining"


def test_the_refusal_names_the_source_in_use() -> None:
    """The 409's message names where the endpoints come from: the Kubernetes pods when the
    command watches them (it says so), else the endpoints file, else the --endpoint list."""
    pods = "Kubernetes discovery (pods app=vllm in inference)"
    picker = EndpointPicker(EppConfig())
    picker.discovery = pods
    watched = picker.membership()
    assert pods in watched and "--endpoint" not in watched
    listed = EndpointPicker(EppConfig()).membership()
    assert "--endpoint list" in listed and "Kubernetes" not in listed
    filed = EndpointPicker(EppConfig(endpoints_file="/etc/endpoints")).membership()
    assert "/etc/endpoints" in filed and "Kubernetes" not in filed


async def test_health_says_how_the_sync_stands_as_serve_does(
    make_picker: PickerFactory, session: aiohttp.ClientSession
) -> None:
    epp = await make_picker(sync_redis="redis://127.0.0.1:1")  # nobody there
    async with session.get(side(epp) + "/health") as resp:
        assert resp.status == 200  # picks on its own view meanwhile
        body = await resp.json()
    assert body == {"healthy_endpoints": 4, "sync": {"connected": False, "instances": 0}}
