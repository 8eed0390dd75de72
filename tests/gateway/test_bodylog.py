"""Logs carry no prompt or completion text, at any level, unless --log-bodies says so."""

from __future__ import annotations

import json
import logging

import aiohttp
import pytest
from aiohttp import web

from .helpers import STEADY, FakeFactory, GatewayFactory, send

PROMPT = "PROMPT-TEXT-7f3a"
COMPLETION = "COMPLETION-TEXT-91bc"


async def answer(request: web.Request) -> web.StreamResponse:
    body = {"choices": [{"index": 0, "text": COMPLETION}], "usage": None}
    return web.Response(body=json.dumps(body).encode(), content_type="application/json")


@pytest.mark.parametrize("log_bodies", [False, True])
async def test_bodies_reach_the_log_only_with_the_flag(
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
    log_bodies: bool,
    make_fake: FakeFactory,
) -> None:
    fake = await make_fake(handler=answer)
    gw = await make_gateway([fake.url], log_bodies=log_bodies, **STEADY)
    caplog.set_level(logging.DEBUG, logger="prefixroute")
    headers = {"x-request-id": "rid-77"}
    for path, body in (
        ("/v1/completions", {"prompt": PROMPT}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}]}),
        ("/v1/completions", {"prompt": PROMPT, "model": "unknown-model"}),
        ("/v1/completions", {"prompt": [PROMPT, 3]}),
    ):
        await send(session, gw.url, path, body, headers=headers)
    logged = caplog.text
    assert (PROMPT in logged) is log_bodies
    assert (COMPLETION in logged) is log_bodies
    if log_bodies:
        assert "rid-77 request body" in logged
