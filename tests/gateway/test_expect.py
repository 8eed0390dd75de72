"""The Expect header: 100-continue works; anything else is a JSON 417, even undecodable bytes."""

from __future__ import annotations

import asyncio

import aiohttp

from .helpers import STEADY, GatewayOf


async def test_expect_continue_and_unknown_expectations(
    gateway_of: GatewayOf, session: aiohttp.ClientSession
) -> None:
    gw = await gateway_of(1, **STEADY)
    body = {"prompt": "a b c", "max_tokens": 1}
    async with session.post(gw.url + "/v1/completions", json=body, expect100=True) as resp:
        assert resp.status == 200
    host, port = gw.url.removeprefix("http://").split(":")
    for path in (b"/v1/completions", b"/nowhere"):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nExpect: \x80\r\nx-request-id: e-1\r\n"
            b"Content-Length: 2\r\nConnection: close\r\n\r\n{}"
        )
        answer = await reader.read()
        writer.close()
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 417"), answer[:200]
        assert b"x-request-id: e-1" in head.lower()
        assert b'"type":"invalid_request_error"' in payload
