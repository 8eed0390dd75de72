"""The gateway's HTTP surface: forwarding, errors, limits, models, health, shutdown."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from prefixroute.gateway import Gateway

from .fakes import FakeReplica, completion_body, held_until
from .helpers import (
    FAST_GATEWAY,
    FAST_REPLICA,
    ClusterFactory,
    FakeFactory,
    GatewayFactory,
    GatewayOf,
    send,
    words,
)


async def test_headers_and_body_forwarded_untouched(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession, make_fake: FakeFactory
) -> None:
    fake = await make_fake()
    gw = await make_gateway([fake.url])
    raw = b'{"prompt":  "hello world",\n "max_tokens": 3}'
    headers = {
        "Authorization": "Bearer sk-client",
        "Content-Type": "application/json",
        "X-Custom": "kept",
        "Connection": "keep-alive, X-Hop",
        "X-Hop": "dropped",
        "TE": "trailers",
    }
    async with session.post(gw.url + "/v1/completions?trace=1", data=raw, headers=headers) as resp:
        body = await resp.read()
        assert resp.status == 200
        assert resp.headers["x-prefixroute-replica"] == fake.url
        assert resp.headers["x-prefixroute-reason"] == "only_candidate"
    assert body == completion_body()  # relayed byte for byte
    seen = fake.seen[-1]
    # The replica gets what the gateway parsed, re-encoded (compact UTF-8 JSON).
    assert seen.body == b'{"prompt":"hello world","max_tokens":3}'
    assert seen.path == "/v1/completions?trace=1"
    assert seen.headers["Authorization"] == "Bearer sk-client"
    assert seen.headers["X-Custom"] == "kept"
    assert "X-Hop" not in seen.headers and "TE" not in seen.headers


async def test_stream_relayed_byte_for_byte(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    events = [b'data: {"choices":[{"text":"a"}]}\n\n', b'data: {"choi', b'ces":[]}\n\n']
    events.append(b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1,')
    events.append(
        b'"total_tokens":6,"prompt_tokens_details":{"cached_tokens":4}}}\n\ndata: [DONE]\n\n'
    )

    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for e in events:
            await resp.write(e)
            await asyncio.sleep(0.005)
        await resp.write_eof()
        return resp

    fake = FakeReplica(handler=stream)
    await fake.start()
    try:
        gw = await make_gateway([fake.url])
        async with session.post(gw.url + "/v1/completions", json={"prompt": "x"}) as resp:
            assert resp.status == 200
            assert await resp.read() == b"".join(events)
        async with session.get(gw.url + "/metrics") as resp:
            text = await resp.text()
        assert f'prefixroute_actual_cached_tokens_total{{replica="{fake.url}"}} 4.0' in text
    finally:
        await fake.stop()


async def test_malformed_json_is_400(gateway_of: GatewayOf, session: aiohttp.ClientSession) -> None:
    gw = await gateway_of(1)
    for path in ("/v1/completions", "/v1/chat/completions"):
        async with session.post(gw.url + path, data=b"{not json") as resp:
            assert resp.status == 400
            body = await resp.json()
        assert body["error"]["code"] == "invalid_json"
        assert set(body["error"]) >= {"message", "type", "code"}
    r = await send(session, gw.url, "/v1/chat/completions", {"messages": "nope"})
    assert r.status == 400 and r.error is not None


async def test_oversized_body_is_413(gateway_of: GatewayOf, session: aiohttp.ClientSession) -> None:
    gw = await gateway_of(1, max_body_bytes=1000)
    r = await send(session, gw.url, "/v1/completions", {"prompt": words(500)})
    assert r.status == 413
    assert r.error is not None and r.error["code"] == "request_too_large"

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"x" * 500  # no Content-Length: the limit applies while reading

    async with session.post(gw.url + "/v1/completions", data=chunks()) as resp:
        assert resp.status == 413
        assert (await resp.json())["error"]["code"] == "request_too_large"


async def test_unknown_model_is_404_and_models_are_merged(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    a, b = FakeReplica(models=("m1",)), FakeReplica(models=("m1", "m2"))
    await a.start()
    await b.start()
    try:
        gw = await make_gateway([a.url, b.url])
        r = await send(session, gw.url, "/v1/completions", {"model": "nope", "prompt": "x"})
        assert r.status == 404
        assert r.error is not None and r.error["code"] == "model_not_found"
        for _ in range(3):  # only b serves m2
            r = await send(session, gw.url, "/v1/completions", {"model": "m2", "prompt": "x"})
            assert r.headers["x-prefixroute-replica"] == b.url
        async with session.get(gw.url + "/v1/models") as resp:
            models = await resp.json()
        assert sorted(c["id"] for c in models["data"]) == ["m1", "m2"]
    finally:
        await a.stop()
        await b.stop()


async def test_other_v1_calls_pass_through(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession, make_fake: FakeFactory
) -> None:
    fake = await make_fake()
    gw = await make_gateway([fake.url])
    async with session.post(gw.url + "/v1/embeddings", json={"input": "hi"}) as resp:
        assert resp.status == 200
    assert fake.seen[-1].path == "/v1/embeddings"
    assert json.loads(fake.seen[-1].body) == {"input": "hi"}


async def test_unknown_path_is_json_404(
    gateway_of: GatewayOf, session: aiohttp.ClientSession
) -> None:
    gw = await gateway_of(1)
    async with session.get(gw.url + "/nothing") as resp:
        assert resp.status == 404
        assert "error" in await resp.json()


async def test_health(make_gateway: GatewayFactory, session: aiohttp.ClientSession) -> None:
    gw = await make_gateway([])
    async with session.get(gw.url + "/health") as resp:
        assert resp.status == 503  # no replica: not ready
    r = await send(session, gw.url, "/v1/completions", {"prompt": "x"})
    assert r.status == 503 and r.headers["Retry-After"] == "1"


async def test_in_flight_caps(make_gateway: GatewayFactory, session: aiohttp.ClientSession) -> None:
    release = asyncio.Event()
    fake = FakeReplica(handler=held_until(release))
    await fake.start()
    try:
        total = await make_gateway([fake.url], max_in_flight=1)
        per_replica = await make_gateway([fake.url], max_in_flight_per_replica=1)
        for gw, status in ((total, 429), (per_replica, 503)):
            held = asyncio.create_task(send(session, gw.url, "/v1/completions", {"prompt": "x"}))
            await asyncio.sleep(0.1)
            r = await send(session, gw.url, "/v1/completions", {"prompt": "y"})
            assert r.status == status, r
            assert r.headers["Retry-After"] == "1"
            release.set()
            assert (await held).complete
            release.clear()
    finally:
        release.set()
        await fake.stop()


async def test_graceful_shutdown_drains_in_flight(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    slow = dataclasses.replace(FAST_REPLICA, time_scale=0.5)  # ~0.3 s per request
    cluster = await make_cluster(1, slow)
    gw = Gateway(dataclasses.replace(FAST_GATEWAY, replicas=tuple(cluster.urls)))
    await gw.start()
    body = {"prompt": "a b", "max_tokens": 40}
    reqs = [
        asyncio.create_task(send(session, gw.url, "/v1/completions", {**body, "stream": s}))
        for s in (False, True)
    ]
    await asyncio.sleep(0.1)
    async with asyncio.timeout(10):
        await gw.stop()
        replies = await asyncio.gather(*reqs)
    assert all(r.complete for r in replies), replies


async def test_a_known_path_with_a_wrong_method_is_a_405_naming_the_methods(
    gateway_of: GatewayOf, session: aiohttp.ClientSession
) -> None:
    """"Not Found" for ``GET /v1/chat/completions`` sent users looking for a wrong base URL;
    a path no route has is still a 404."""
    gw = await gateway_of(1)
    for method, path, allow in (
        ("GET", "/v1/chat/completions", "POST"),
        ("PUT", "/v1/completions", "POST"),
        ("POST", "/health", "GET,HEAD"),
        ("DELETE", "/v1/models", "GET,HEAD"),
    ):
        async with session.request(method, gw.url + path) as resp:
            assert resp.status == 405, (method, path)
            assert resp.headers["Allow"] == allow
            assert (await resp.json())["error"]["message"] == "Method Not Allowed"
    async with session.get(gw.url + "/v1/nothing/here") as resp:
        assert resp.status == 404 and "Allow" not in resp.headers


async def test_a_prompt_body_a_web_page_could_send_cross_site_is_refused(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """A page may POST text/plain, a form or multipart to any origin without a CORS preflight:
    such a body read as JSON let any page a user opened send requests through the user's
    browser. Refused (415) before any replica; JSON, and types no page sends unasked, pass."""
    fake = await make_fake()
    gw = await make_gateway([fake.url])
    body = json.dumps({"model": "emulated", "prompt": "hi", "max_tokens": 1}).encode()
    for ctype in ("text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                  "multipart/form-data; boundary=x"):  # fmt: skip
        headers = {"Content-Type": ctype}
        async with session.post(gw.url + "/v1/completions", data=body, headers=headers) as r:
            assert r.status == 415, ctype
            error = (await r.json())["error"]
        assert error["code"] == "unsupported_media_type"
        assert error["message"].startswith("the request body must be JSON"), error
    assert [s for s in fake.seen if s.path.startswith("/v1/")] == []
    for ctype in ("application/json", "Application/JSON; charset=utf-8", "application/x-ndjson"):
        headers = {"Content-Type": ctype}
        async with session.post(gw.url + "/v1/completions", data=body, headers=headers) as r:
            assert r.status == 200, ctype
