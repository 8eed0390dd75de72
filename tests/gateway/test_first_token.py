"""The first token is the first event with output in it: a server that opens a chat stream with
a role-only chunk before it has prefilled anything must not make its first tokens look instant
to the speed model (``gateway._sse``)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp import web

from .helpers import FakeFactory, GatewayFactory

PREFILL_S = 0.3
ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'


async def _role_first(request: web.Request) -> web.StreamResponse:
    """Opens the stream with the role at once, then 'prefills' for PREFILL_S."""
    if request.method != "POST":
        return web.json_response({"data": [{"id": "m"}]})
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await out.prepare(request)
    await out.write(ROLE)
    await asyncio.sleep(PREFILL_S)
    await out.write(b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n')
    await out.write(b"data: [DONE]\n\n")
    return out


async def test_a_role_only_opening_chunk_is_not_the_first_token(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    fake = await make_fake(handler=_role_first)
    gw = await make_gateway([fake.url])
    seen: list[float] = []
    first_token = gw.router.first_token

    def noted(request_id: str, now: float, measured: bool = True) -> None:
        seen.append(now)
        first_token(request_id, now, measured)

    gw.router.first_token = noted  # type: ignore[method-assign]
    body = {"messages": [{"role": "user", "content": "hello"}], "stream": True}
    sent = time.monotonic()
    async with session.post(gw.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        await resp.read()
    assert len(seen) == 1 and seen[0] - sent >= PREFILL_S
