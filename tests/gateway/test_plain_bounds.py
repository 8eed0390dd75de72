"""A plain answer's bounds (gateway/_relay_plain.py's docstring).

From it: a plain answer is read whole; one over ``MAX_PLAIN_BYTES`` is not held, and the client
gets a 502 saying so, blaming no one; one over the client buffer is written with the slow-client
cut, so a client that makes no room for it within the write timeout is cut and counted, as a
stream's is; and a large answer's usage is still read (skipping its choices unparsed). An
outside audit (2026-12-07) held 2.9 GB for four clients that never read 200 MiB answers.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web

from prefixroute.gateway import _relay_plain

from .helpers import FakeFactory, GatewayFactory
from .test_blame import _slow_reader

BIG_TEXT = 4 << 20  # characters of completion text: a 4 MiB answer


async def _big(request: web.Request) -> web.StreamResponse:
    """A plain completion of BIG_TEXT characters with its usage (7 of 9 prompt tokens
    cached), chunked (no Content-Length) when the prompt says so."""
    body = await request.read()
    answer = json.dumps({
        "object": "text_completion",
        "choices": [{"index": 0, "text": "x" * BIG_TEXT, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 1,
                  "prompt_tokens_details": {"cached_tokens": 7}},
    }).encode()  # fmt: skip
    if b"chunked" not in body:
        return web.Response(body=answer, content_type="application/json")
    out = web.StreamResponse(headers={"Content-Type": "application/json"})
    await out.prepare(request)
    for i in range(0, len(answer), 1 << 16):
        await out.write(answer[i : i + (1 << 16)])
    await out.write_eof()
    return out


@pytest.mark.parametrize("prompt", ["plain", "chunked"])
async def test_an_answer_over_the_bound_is_a_502_that_blames_no_one(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch, prompt: str,
) -> None:  # fmt: skip
    monkeypatch.setattr(_relay_plain, "MAX_PLAIN_BYTES", 1 << 20)
    fake = await make_fake(handler=_big)
    gw = await make_gateway([fake.url])
    async with session.post(gw.url + "/v1/completions", json={"prompt": prompt}) as resp:
        assert resp.status == 502
        error = (await resp.json())["error"]
    assert error["code"] == "answer_too_large" and "ask for it as a stream" in error["message"]
    assert gw.registry.find(fake.url).total_failures == 0
    metrics = await (await session.get(gw.url + "/metrics")).text()
    assert 'prefixroute_cut_streams_total{reason="answer_too_large"} 1.0' in metrics
    monkeypatch.setattr(_relay_plain, "MAX_PLAIN_BYTES", 64 << 20)
    async with session.post(gw.url + "/v1/completions", json={"prompt": prompt}) as resp:
        assert resp.status == 200  # the connection it left unread was not reused
        assert len(await resp.read()) > BIG_TEXT


async def test_a_large_answer_arrives_whole_and_its_usage_is_read(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    fake = await make_fake(handler=_big)
    gw = await make_gateway([fake.url], client_buffer_bytes=64 * 1024)
    async with session.post(gw.url + "/v1/completions", json={"prompt": "plain"}) as resp:
        assert resp.status == 200
        answer = await resp.json()
    assert len(answer["choices"][0]["text"]) == BIG_TEXT
    metrics = await (await session.get(gw.url + "/metrics")).text()
    assert "prefixroute_actual_cached_tokens_total" in metrics
    line = next(x for x in metrics.splitlines()
                if x.startswith("prefixroute_actual_cached_tokens_total{"))  # fmt: skip
    assert line.endswith(" 7.0")


async def test_a_client_that_never_reads_a_large_answer_is_cut(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """Before, the whole answer sat in the transport's buffer for as long as the client
    stayed, with no timeout."""
    fake = await make_fake(handler=_big)
    gw = await make_gateway([fake.url], client_buffer_bytes=64 * 1024, client_write_timeout_s=0.3)
    async with _slow_reader(gw.url, {"prompt": "plain", "max_tokens": 1}):  # reads nothing
        async with asyncio.timeout(10.0):
            while True:
                metrics = await (await session.get(gw.url + "/metrics")).text()
                if 'prefixroute_cut_streams_total{reason="slow_client"} 1.0' in metrics:
                    break
                await asyncio.sleep(0.05)
    assert gw.registry.find(fake.url).total_failures == 0  # the client's doing


@pytest.mark.parametrize(
    "obj",
    [
        {"choices": [{"text": "a", "usage": {"prompt_tokens": 99}}],
         "usage": {"prompt_tokens": 9, "completion_tokens": 1}},
        {"id": "resp_1", "object": "response",
         "usage": {"input_tokens": 5, "output_tokens": 2,
                   "input_tokens_details": {"cached_tokens": 3}}},
        {"type": "message", "usage": {"input_tokens": 4, "output_tokens": 1,
                                       "cache_read_input_tokens": 2}},
        {"text": "x", "meta_info": {"prompt_tokens": 4, "completion_tokens": 1,
                                     "cached_tokens": 2}},
        {"usage": None, "choices": []},
        {"id": 7, "object": "response", "usage": {"input_tokens": 1}},
        [{"usage": {"prompt_tokens": 1}}],
    ],
)  # fmt: skip
def test_an_answer_s_usage_reads_as_a_whole_parse_would(obj: object) -> None:
    """The top-level fields alone are parsed; what they say is what a parse of the whole body
    says (usage_of reads nothing else)."""
    from prefixroute.gateway._usage import answer_in_body, usage_of

    body = json.dumps(obj).encode()
    whole = json.loads(body)
    expected: tuple[object, object] = (None, None)
    if isinstance(whole, dict):
        stored = whole.get("id") if whole.get("object") == "response" else None
        expected = (usage_of(whole), stored if isinstance(stored, str) else None)
    assert answer_in_body(body) == expected
