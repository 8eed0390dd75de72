"""The fleet page over HTTP: who may see it, where it is mounted, and what state.json reports.

The page in a real browser: ``test_dashboard_browser.py``.
"""

from __future__ import annotations

import base64
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import make_mocked_request

from prefixroute.gateway import GatewayConfig, TenancyConfig, TenantSpec, hash_api_key
from prefixroute.gateway._dashboard import (
    basic_password,
    is_loopback,
    mounted_on_main,
    state_json,
)
from prefixroute.gateway._fleetview import DecisionEntry, DecisionLog, History

from .helpers import ClusterFactory, GatewayFactory, GatewayOf, basic, send, wrong_credentials

TOKEN = "dashboard-admin-token"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
PATHS = ("/dashboard", "/dashboard/app.js", "/dashboard/app.css", "/dashboard/state.json")


async def _chat(session: aiohttp.ClientSession, url: str, text: str, **extra: Any) -> None:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 4, **extra}
    reply = await send(session, url, "/v1/chat/completions", body)
    assert reply.status == 200, reply


async def test_every_dashboard_path_needs_the_admin_token(
    gateway_of: GatewayOf, session: aiohttp.ClientSession
) -> None:
    gw = await gateway_of(1, admin_token=TOKEN)
    for path in PATHS:
        for headers in wrong_credentials(TOKEN):
            async with session.get(gw.url + path, headers=headers) as resp:
                assert resp.status == 401, (path, headers)
                assert (await resp.json())["error"]["type"] == "authentication_error"
                challenge = resp.headers["WWW-Authenticate"]
                # The page and its assets make a browser ask; the JSON asks for a bearer token.
                assert challenge.startswith("Bearer" if path.endswith(".json") else "Basic")
                assert resp.headers["Cache-Control"] == "no-store"
        for headers in (BEARER, basic("admin", TOKEN), basic("", TOKEN)):
            async with session.get(gw.url + path, headers=headers) as resp:
                assert resp.status == 200, (path, headers)
                assert resp.headers["X-Content-Type-Options"] == "nosniff"
                assert "frame-ancestors 'none'" in resp.headers["Content-Security-Policy"]


async def test_the_page_and_its_assets_are_served_from_the_package(
    gateway_of: GatewayOf, session: aiohttp.ClientSession
) -> None:
    gw = await gateway_of(1, admin_token=TOKEN)
    kinds = {"/dashboard": "text/html", "/dashboard/app.js": "text/javascript",
             "/dashboard/app.css": "text/css"}  # fmt: skip
    for path, ctype in kinds.items():
        async with session.get(gw.url + path, headers=BEARER) as resp:
            assert resp.content_type == ctype
            text = await resp.text()
            assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")  # no CDN
    async with session.get(gw.url + "/dashboard", headers=BEARER) as resp:
        page = await resp.text()
    assert 'src="dashboard/app.js"' in page and 'href="dashboard/app.css"' in page


async def test_without_a_token_only_a_loopback_gateway_serves_it(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    cluster = await make_cluster(1)
    local = await make_gateway(cluster.urls)  # 127.0.0.1, no token
    async with session.get(local.url + "/dashboard/state.json") as resp:
        assert resp.status == 200
    # Bound to every address, with no token: not mounted at all.
    assert not mounted_on_main(GatewayConfig(host="0.0.0.0"))
    assert not mounted_on_main(GatewayConfig(host="10.1.2.3"))
    assert mounted_on_main(GatewayConfig(host="127.0.0.1"))
    assert mounted_on_main(GatewayConfig(host="0.0.0.0", admin_token=TOKEN))
    # With an admin listener, the page lives there, as /admin/* does.
    assert not mounted_on_main(GatewayConfig(admin_token=TOKEN, admin_port=0))


async def test_a_token_less_page_refuses_a_remote_peer(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory
) -> None:
    """Belt and braces: a peer that is not loopback is refused even on a loopback listener."""
    cluster = await make_cluster(1)
    gw = await make_gateway(cluster.urls)

    class Transport:  # what aiohttp asks a transport for the peer
        def get_extra_info(self, name: str, default: object = None) -> object:
            return ("10.0.0.7", 40000) if name == "peername" else default

    request = make_mocked_request("GET", "/dashboard/state.json", app=gw.app,
                                  transport=Transport())  # fmt: skip
    resp = await state_json(request)
    assert resp.status == 403


def test_loopback_and_basic_parsing() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert is_loopback("127.8.9.10") and is_loopback("[::1]")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1") and not is_loopback(None)
    assert not is_loopback("example.com")
    assert basic_password("Basic " + base64.b64encode(b"u:p:q").decode()) == "p:q"
    assert basic_password("basic " + base64.b64encode(b"u:pw").decode()) == "pw"
    assert basic_password("Basic " + base64.b64encode(b"no-colon").decode()) is None
    assert basic_password("Bearer abc") is None
    assert basic_password("Basic " + base64.b64encode(b"\xff:\xfe").decode()) is None


async def test_admin_listener_serves_the_page_and_the_main_one_does_not(
    gateway_of: GatewayOf, session: aiohttp.ClientSession
) -> None:
    gw = await gateway_of(1, admin_token=TOKEN, admin_port=0)
    await _chat(session, gw.url, "hello " * 20)
    async with session.get(gw.url + "/dashboard/state.json", headers=BEARER) as resp:
        assert resp.status == 404
    async with session.get(gw.admin_url + "/dashboard/state.json", headers=BEARER) as resp:
        assert resp.status == 200
        doc = await resp.json()
    assert doc["totals"]["requests"] == 1  # the main app's decisions, shared
    assert len(doc["decisions"]) == 1
    async with session.get(gw.admin_url + "/dashboard/state.json") as resp:
        assert resp.status == 401


async def test_tenant_keys_do_not_guard_the_page_the_admin_token_does(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    cluster = await make_cluster(1)
    tenancy = TenancyConfig(
        tenants=(TenantSpec("team", api_key_sha256=(hash_api_key("pr-team-key"),)),),
    )
    gw = await make_gateway(cluster.urls, admin_token=TOKEN, tenancy=tenancy)
    async with session.get(gw.url + "/v1/models") as resp:
        assert resp.status == 401  # keys are on: the API wants one
    async with session.get(gw.url + "/dashboard/state.json", headers=BEARER) as resp:
        assert resp.status == 200
    async with session.get(
        gw.url + "/dashboard", headers={"Authorization": "Bearer pr-team-key"}
    ) as resp:
        assert resp.status == 401  # a client key is not the admin token


async def test_state_reports_load_speed_hits_index_and_decisions(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    cluster = await make_cluster(2)
    gw = await make_gateway(cluster.urls, admin_token=TOKEN)
    text = "the shared system prompt " * 10
    for i in range(3):
        # a stream asks for its usage (send); stream_options without one is a 400 (vLLM's)
        await _chat(session, gw.url, text + f"question {i}", stream=i == 1)
    async with session.get(gw.url + "/dashboard/state.json", headers=BEARER) as resp:
        doc = await resp.json()
    assert doc["version"] == 1 and doc["policy"] == gw.config.policy
    assert doc["mode"] == "approximate"
    by_id = {r["id"]: r for r in doc["replicas"]}
    assert set(by_id) == set(cluster.urls)
    served = [r for r in doc["replicas"] if r["requests"]]
    assert sum(r["requests"] for r in doc["replicas"]) == doc["totals"]["requests"] == 3
    for r in doc["replicas"]:
        assert r["status"] == "healthy" and r["in_flight"] == 0
        assert r["index_blocks"] == gw.router.index.blocks_of(r["id"])
        assert r["index_capacity_blocks"] == gw.router.index.capacity_of(r["id"])
        assert r["speed"] == gw.router.loads.get(r["id"]).speed_report()
    assert sum(r["index_blocks"] for r in served) > 0
    # Hit rates: the Prometheus counters, per replica, with the prompt tokens as denominator.
    async with session.get(gw.url + "/metrics") as resp:
        metrics = await resp.text()
    for r in served:
        for name, key in (("predicted_cached_tokens", "predicted_cached"),
                          ("actual_cached_tokens", "actual_cached"),
                          ("prompt_tokens", "prompt_tokens")):  # fmt: skip
            line = f'prefixroute_{name}_total{{replica="{r["id"]}"}} {float(r[key])}'
            assert line in metrics, line
    assert doc["totals"]["prompt_tokens"] > doc["totals"]["actual_cached"] > 0
    assert doc["totals"]["predicted_cached"] > 0
    # Decisions: newest first, each with its replica, reason and the predicted cached tokens.
    decisions = doc["decisions"]
    assert len(decisions) == 3
    assert [d["time"] for d in decisions] == sorted((d["time"] for d in decisions), reverse=True)
    assert decisions[-1]["predicted_cached"] == 0  # the first request found nothing cached
    assert all(d["predicted_cached"] > 0 and d["reason"] == "prefix_match" for d in decisions[:2])
    assert {d["replica"] for d in decisions} <= set(cluster.urls)
    assert all(d["status"] == 200 and d["path"] == "/v1/chat/completions" for d in decisions)
    assert len(doc["history"]) == 1


async def test_history_is_sampled_on_read_and_since_filters_it(
    gateway_of: GatewayOf, session: aiohttp.ClientSession
) -> None:
    gw = await gateway_of(1, admin_token=TOKEN)
    url = gw.url + "/dashboard/state.json"
    async with session.get(url, headers=BEARER) as resp:
        first = await resp.json()
    async with session.get(url, headers=BEARER) as resp:  # within a second: no new sample
        again = await resp.json()
    assert len(first["history"]) == len(again["history"]) == 1
    async with session.get(url, params={"since": str(first["time"])}, headers=BEARER) as resp:
        assert (await resp.json())["history"] == []
    for bad in ("yesterday", "nan", "inf"):
        async with session.get(url, params={"since": bad}, headers=BEARER) as resp:
            assert resp.status == 400


def test_history_keeps_one_sample_a_second_and_a_bounded_number() -> None:
    history = History(capacity=3, every_s=1.0)
    for t in (0.0, 0.5, 1.0, 1.2, 2.0, 3.0, 4.5):
        history.offer({"time": t, "replicas": {}})
    assert [s["time"] for s in history.since(None)] == [2.0, 3.0, 4.5]
    assert [s["time"] for s in history.since(2.0)] == [3.0, 4.5]


def test_decision_log_is_a_bounded_ring_newest_first() -> None:
    log = DecisionLog(capacity=3)
    for i in range(5):
        log.record(DecisionEntry(float(i), f"r{i}", "prefix_match", 200, i, "/v1/completions"))
    assert len(log) == 3
    assert [d.replica for d in log.recent()] == ["r4", "r3", "r2"]


@pytest.mark.parametrize("status", [200, 503])
async def test_failed_requests_show_their_status(
    status: int,
    make_cluster: ClusterFactory,
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
) -> None:
    cluster = await make_cluster(1)
    gw = await make_gateway(cluster.urls, admin_token=TOKEN, max_in_flight_per_replica=1)
    if status == 503:  # every replica at its cap: the gateway answers 503 before routing
        gw.router.loads.get(next(iter(gw.registry)).id).in_flight = 1
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    reply = await send(session, gw.url, "/v1/chat/completions", body)
    assert reply.status == status
    async with session.get(gw.url + "/dashboard/state.json", headers=BEARER) as resp:
        doc = await resp.json()
    # A request refused before any decision has no replica to show: it is not listed.
    assert len(doc["decisions"]) == (1 if status == 200 else 0)
    assert doc["totals"]["requests"] == 1
