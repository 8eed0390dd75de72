"""x-request-id: the client's or a new one, to the replica and back, errors and streams too."""

from __future__ import annotations

import asyncio
import re

import aiohttp
from polling import until

from .fakes import Seen, held_until
from .helpers import STEADY, FakeFactory, GatewayFactory, GatewayOf, send

HEX32 = re.compile(r"[0-9a-f]{32}")


def upstream_id(seen: Seen) -> str:
    return {k.lower(): v for k, v in seen.headers.items()}["x-request-id"]


async def test_client_id_goes_to_the_replica_and_back(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession, make_fake: FakeFactory
) -> None:
    fake = await make_fake()
    gw = await make_gateway([fake.url], **STEADY)
    headers = {"x-request-id": "client-42.a:b"}
    reply = await send(session, gw.url, "/v1/completions", {"prompt": "x"}, headers=headers)
    assert reply.headers["X-Request-ID"] == "client-42.a:b"
    assert upstream_id(fake.seen[-1]) == "client-42.a:b"

    reply = await send(session, gw.url, "/v1/completions", {"prompt": "x"})
    made = reply.headers["X-Request-ID"]
    assert HEX32.fullmatch(made) and upstream_id(fake.seen[-1]) == made

    for bad in ("has space", "x" * 129, "semi;colon"):
        reply = await send(
            session, gw.url, "/v1/completions", {"prompt": "x"}, headers={"x-request-id": bad}
        )
        assert HEX32.fullmatch(reply.headers["X-Request-ID"]), bad


async def test_errors_and_streams_carry_it(
    gateway_of: GatewayOf, session: aiohttp.ClientSession
) -> None:
    gw = await gateway_of(1, **STEADY)
    headers = {"x-request-id": "req-1"}
    for body in ({"prompt": "x", "model": "nope"}, {"prompt": 3}):
        reply = await send(session, gw.url, "/v1/completions", body, headers=headers)
        assert reply.status in (400, 404) and reply.headers["X-Request-ID"] == "req-1"
    async with session.post(gw.url + "/v1/completions", data=b"{", headers=headers) as resp:
        assert resp.status == 400 and resp.headers["X-Request-ID"] == "req-1"
    async with session.get(gw.url + "/nowhere", headers=headers) as resp:
        assert resp.status == 404 and resp.headers["X-Request-ID"] == "req-1"
    body = {"prompt": "a b c", "max_tokens": 3, "stream": True}
    reply = await send(session, gw.url, "/v1/completions", body, headers=headers)
    assert reply.complete and reply.headers["X-Request-ID"] == "req-1"


async def test_a_live_id_is_not_reused(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession, make_fake: FakeFactory
) -> None:
    """Two requests in flight never share an id upstream: the second gets a fresh one."""
    release = asyncio.Event()
    fake = await make_fake(handler=held_until(release))
    gw = await make_gateway([fake.url], **STEADY)
    headers = {"x-request-id": "same"}
    tasks = [
        asyncio.create_task(
            send(session, gw.url, "/v1/completions", {"prompt": "x"}, headers=headers)
        )
        for _ in range(2)
    ]
    await until(lambda: len([s for s in fake.seen if s.path.startswith("/v1/")]) >= 2)
    release.set()
    ids = sorted(r.headers["X-Request-ID"] for r in await asyncio.gather(*tasks))
    assert ids[1] == "same" and HEX32.fullmatch(ids[0])
    upstream = {upstream_id(s) for s in fake.seen if s.path.startswith("/v1/")}
    assert upstream == set(ids)
