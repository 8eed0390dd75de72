"""The gateway is a proxy, not a browser: what one replica answer says never rides along on
another client's request, and a replica's redirect is the client's to follow.

- A replica's ``Set-Cookie`` reaches the client that asked (relayed), but the gateway keeps no
  cookie jar: a later request, from anyone, carries only the cookies its own client sent.
  (aiohttp's default session jar would store cookies from host names such as ``localhost`` or
  a Kubernetes Service name, and send them on every later request to that replica.)
- A replica's 3xx is relayed with its ``Location``, not followed by the gateway.
"""

from __future__ import annotations

import aiohttp
from aiohttp import web

from .fakes import completion_body
from .helpers import FakeFactory, GatewayFactory, send


async def _sets_a_cookie(request: web.Request) -> web.StreamResponse:
    resp = web.Response(body=completion_body(), content_type="application/json")
    resp.headers["Set-Cookie"] = "session=alice-secret; Path=/"
    return resp


async def test_a_replica_cookie_never_reaches_another_client(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    fake = await make_fake(handler=_sets_a_cookie)
    # By host name, as in a cluster: aiohttp's default jar ignores only IP-address hosts.
    replica = fake.url.replace("127.0.0.1", "localhost")
    gw = await make_gateway([replica])
    first = await send(session, gw.url, "/v1/completions", {"prompt": "alice"})
    assert first.status == 200
    assert "alice-secret" in first.headers.get("Set-Cookie", "")  # relayed to its client
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as bob:
        second = await send(bob, gw.url, "/v1/completions", {"prompt": "bob"})
    assert second.status == 200
    assert [s for s in fake.seen if "alice-secret" in s.headers.get("Cookie", "")] == []


async def _redirects(request: web.Request) -> web.StreamResponse:
    if request.path == "/elsewhere":
        return web.Response(body=completion_body(), content_type="application/json")
    raise web.HTTPTemporaryRedirect("/elsewhere")


async def test_a_replica_redirect_is_relayed_not_followed(
    make_fake: FakeFactory, make_gateway: GatewayFactory
) -> None:
    fake = await make_fake(handler=_redirects)
    gw = await make_gateway([fake.url])
    async with aiohttp.ClientSession() as client, client.post(
        gw.url + "/v1/completions", json={"prompt": "x"}, allow_redirects=False
    ) as resp:
        assert resp.status == 307
        assert resp.headers["Location"] == "/elsewhere"
    # The gateway did not follow (the health checker's GETs of /metrics are its own).
    assert [s.path for s in fake.seen if s.method == "POST"] == ["/v1/completions"]
