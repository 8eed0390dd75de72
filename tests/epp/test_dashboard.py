"""The endpoint picker's fleet page and who may see its admin surfaces (issue 14: "a live
fleet page at /dashboard on the gateway (and on epp)"; issue 13: "admin listing ... behave as
in serve"): the same page and the same rules as the gateway's, on the picker's HTTP listener.
The admin API itself: ``test_admin.py``."""

from __future__ import annotations

import aiohttp

from .conftest import PickerFactory, side
from .grpc_envoy import through

TOKEN = "picker-admin-token"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
CHAT = "/v1/chat/completions"


async def test_the_page_shows_the_pickers_replicas_and_its_decisions(
    make_picker: PickerFactory, session: aiohttp.ClientSession
) -> None:
    epp = await make_picker()  # loopback listener, no token: loopback clients only
    body = {"model": "emulated", "messages": [{"role": "user", "content": "hi " * 40}]}
    passed = await through(epp, session, CHAT, {**body, "max_tokens": 2})
    async with session.get(side(epp) + "/dashboard/state.json") as resp:
        assert resp.status == 200
        state = await resp.json()
    assert len(state["replicas"]) == 4
    (decision,) = state["decisions"]
    assert decision["path"] == CHAT and decision["status"] == 200
    assert decision["reason"] == passed.headers["x-prefixroute-reason"]
    assert decision["replica"].endswith(passed.endpoint)
    async with session.get(side(epp) + "/dashboard") as resp:
        assert resp.status == 200 and resp.content_type == "text/html"
    async with session.get(side(epp) + "/admin/replicas") as resp:
        assert resp.status == 404  # as serve: without a token there is no admin API
        assert (await resp.json())["error"]["message"] == "Not Found"  # serve's JSON 404


async def test_with_a_token_every_admin_path_needs_it(
    make_picker: PickerFactory, session: aiohttp.ClientSession
) -> None:
    epp = await make_picker(admin_token=TOKEN)
    for path in ("/dashboard/state.json", "/admin/replicas"):
        async with session.get(side(epp) + path) as resp:
            assert resp.status == 401, path
            assert (await resp.json())["error"]["type"] == "authentication_error"
        async with session.get(side(epp) + path, headers=BEARER) as resp:
            assert resp.status == 200, path
    async with session.get(side(epp) + "/metrics") as resp:
        assert resp.status == 200  # Prometheus and probes need no token
    async with session.get(side(epp) + "/health") as resp:
        assert resp.status == 200


async def test_on_a_routable_address_without_a_token_nothing_admin_is_mounted(
    make_picker: PickerFactory, session: aiohttp.ClientSession
) -> None:
    epp = await make_picker(http_host="0.0.0.0")  # noqa: S104 (the case under test)
    for path in ("/dashboard", "/dashboard/state.json", "/admin/replicas"):
        async with session.get(side(epp) + path) as resp:
            assert resp.status == 404, path
    async with session.get(side(epp) + "/metrics") as resp:
        assert resp.status == 200
