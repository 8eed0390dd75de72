"""Whose fault a failure is: client garbage never takes replicas out; a failing replica does go.

The rules are the proxy's module docstring: a failure the same request repeats on a second
replica is the request's; one the retry does not repeat is the first replica's; a refused
connection is always the replica's; one request marks at most one replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from prefixroute.gateway import Gateway, ReplicaStatus

from .fakes import BadChunkReplica, FakeReplica, Handler, completion_body, one_event_stream
from .helpers import FakeFactory, GatewayFactory

POISON = "poison-pill"
GZIPPED = {"Content-Encoding": "gzip"}


async def _poisoned(request: web.Request) -> web.StreamResponse:
    """A replica that crashes (500) on one prompt and serves every other."""
    body = await request.read()
    if POISON.encode() in body:
        return web.json_response({"error": {"message": "engine crashed"}}, status=500)
    return web.Response(body=completion_body(), content_type="application/json")


async def _fleet(make_fake: FakeFactory, n: int) -> list[FakeReplica]:
    """``n`` replicas that crash on POISON, stopped when the test ends."""
    return [await make_fake(handler=_poisoned) for _ in range(n)]


@pytest.fixture
async def behind(
    make_fake: FakeFactory, make_gateway: GatewayFactory
) -> tuple[FakeReplica, Gateway]:
    """One replica (it crashes on POISON) and a gateway in front of it."""
    fake = await make_fake(handler=_poisoned)
    return fake, await make_gateway([fake.url])


@contextlib.asynccontextmanager
async def _post_bytes(
    session: aiohttp.ClientSession, gw: Gateway, raw: bytes, headers: dict[str, str] | None = None
) -> AsyncIterator[aiohttp.ClientResponse]:
    """``raw`` as the body of a JSON completion request to the gateway, with ``headers``."""
    sent = {"Content-Type": "application/json", **(headers or {})}
    async with session.post(gw.url + "/v1/completions", data=raw, headers=sent) as r:
        yield r


def _healthy(gw: object) -> int:
    return sum(1 for r in gw.registry if r.status is ReplicaStatus.HEALTHY)  # type: ignore[attr-defined]


async def test_poison_requests_take_no_replica_out(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """100 requests that crash every replica: each is answered with an error, none of the four
    replicas is ejected, and a canary between them is always served."""
    fakes = await _fleet(make_fake, 4)
    # No probe rounds during the run: a probe that times out while the test process stalls
    # (CI, once: all four at once) is a failure of its own, not a poison request's.
    gw = await make_gateway([f.url for f in fakes], failure_threshold=3, health_interval_s=60)
    statuses = []
    for i in range(100):
        body = {"prompt": f"{POISON} {i}", "max_tokens": 1}
        async with session.post(gw.url + "/v1/completions", json=body) as resp:
            statuses.append(resp.status)
            assert resp.content_type == "application/json"
        if i % 10 == 0:
            canary = {"prompt": "canary", "max_tokens": 1}
            async with session.post(gw.url + "/v1/completions", json=canary) as resp:
                assert resp.status == 200
        assert _healthy(gw) == 4, f"a replica was taken out after poison request {i}"
    assert all(s >= 500 for s in statuses)
    assert sum(r.total_failures for r in gw.registry) == 0
    # Each poison was tried on two replicas, then judged the request's own.
    metrics = await (await session.get(gw.url + "/metrics")).text()
    assert 'prefixroute_request_faults_total{kind="status"} 100.0' in metrics


async def test_a_replica_that_fails_what_its_peers_serve_is_taken_out(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """The other side of the rule: a replica answering 500 to everything while its peers
    serve the same requests is marked on each retry that succeeds, and ejected."""
    good = await _fleet(make_fake, 2)
    bad = await make_fake(failing=True)  # /health answers 500 too; start it healthy below
    gw = await make_gateway(
        [f.url for f in good] + [bad.url], policy="round_robin", health_interval_s=60
    )
    record = gw.registry.find(bad.url)
    record.healthy, record.failures = True, 0  # it failed its first probe; let it in
    for i in range(12):
        async with session.post(
            gw.url + "/v1/completions", json={"prompt": f"p{i}", "max_tokens": 1}
        ) as resp:
            assert resp.status == 200  # retried onto a good replica
    assert record.status is ReplicaStatus.UNHEALTHY
    assert all(gw.registry.find(f.url).total_failures == 0 for f in good)


async def test_gzip_body_is_forwarded_decoded_without_its_header(
    behind: tuple[FakeReplica, Gateway], session: aiohttp.ClientSession
) -> None:
    fake, gw = behind
    raw = gzip.compress(json.dumps({"prompt": "zipped", "max_tokens": 1}).encode())
    async with _post_bytes(session, gw, raw, GZIPPED) as r:
        assert r.status == 200
    seen = fake.seen[-1]
    assert "Content-Encoding" not in seen.headers
    assert json.loads(seen.body) == {"prompt": "zipped", "max_tokens": 1}


async def test_bodies_that_are_not_utf8_json_are_refused_before_any_replica(
    behind: tuple[FakeReplica, Gateway], session: aiohttp.ClientSession
) -> None:
    fake, gw = behind
    bad = {
        "latin-1": '{"prompt": "caf\xe9"}'.encode("latin-1"),
        "utf-16": '{"prompt": "hi"}'.encode("utf-16"),
        "lone surrogate": b'{"prompt": "\\ud800 x"}',
        "NaN": b'{"prompt": "x", "temperature": NaN}',
        "-Infinity": b'{"prompt": "x", "temperature": -Infinity}',
        "overflow": b'{"prompt": "x", "temperature": 1e999999}',  # would go out as Infinity
    }
    for what, raw in bad.items():
        async with _post_bytes(session, gw, raw) as r:
            assert r.status == 400, what
            error = (await r.json())["error"]
            assert error["type"] == "invalid_request_error", what
    assert [s for s in fake.seen if s.path.startswith("/v1/")] == []
    # Valid non-ASCII text is fine, and reaches the replica as UTF-8.
    body = {"prompt": "café ☕ 𝄞", "max_tokens": 1}
    async with session.post(gw.url + "/v1/completions", json=body) as r:
        assert r.status == 200
    assert json.loads(fake.seen[-1].body.decode("utf-8")) == body


async def test_duplicate_keys_reach_the_replica_as_the_gateway_read_them(
    behind: tuple[FakeReplica, Gateway], session: aiohttp.ClientSession
) -> None:
    """The gateway routes and admits on the last duplicate; the replica must not read another."""
    fake, gw = behind
    raw = b'{"prompt": "first", "prompt": "second", "max_tokens": 1}'
    async with _post_bytes(session, gw, raw) as r:
        assert r.status == 200
    assert fake.seen[-1].body.count(b'"prompt"') == 1
    assert json.loads(fake.seen[-1].body)["prompt"] == "second"


async def test_one_request_marks_at_most_one_replica(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """A stream that gets 500 on one replica, then breaks mid-stream on the next: the second
    replica is marked (only a replica breaks a started stream), and the first, whose failure
    the retry did not repeat, is not marked as well: one request marks one replica."""

    async def broken(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(b'data: {"choices":[{"text":"a"}]}\n\n')
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.abort()
        return out

    async def crash(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"message": "boom"}}, status=500)

    a, b = await make_fake(handler=crash), await make_fake(handler=broken)
    gw = await make_gateway([a.url, b.url], policy="round_robin", health_interval_s=60)
    body = {"prompt": "x", "max_tokens": 1, "stream": True}
    async with session.post(gw.url + "/v1/completions", json=body) as r:
        text = await r.text()
    assert r.status == 200 and '"error"' in text and "[DONE]" in text
    marked = [rec.url for rec in gw.registry if rec.total_failures]
    assert marked == [b.url], [(rec.url, rec.total_failures) for rec in gw.registry]


async def test_stream_without_a_first_event_in_time_is_retried_elsewhere(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """A frozen replica (headers sent, no event): the stream moves to another replica once
    the first-byte deadline passes, long before the read timeout."""
    release = asyncio.Event()

    async def frozen(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await release.wait()
        return out

    a, b = await make_fake(handler=frozen), await make_fake(handler=one_event_stream)
    try:
        gw = await make_gateway(
            [a.url, b.url], policy="round_robin", read_timeout_s=30.0,
            first_byte_floor_s=0.3, first_byte_cap_s=0.5, health_interval_s=60,
        )  # fmt: skip
        for _ in range(2):  # round robin: one of the two starts on the frozen replica
            t0 = time.monotonic()
            body = {"prompt": "x", "max_tokens": 1, "stream": True}
            async with session.post(gw.url + "/v1/completions", json=body) as r:
                text = await r.text()
            assert r.status == 200 and "[DONE]" in text and '"ok"' in text
            assert time.monotonic() - t0 < 3.0
        assert gw.registry.find(a.url).total_failures == 1
        assert gw.registry.find(b.url).total_failures == 0
    finally:
        release.set()


async def test_keep_alive_comments_are_not_a_start(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """SSE comments (``: ping``) that a server sends while a request waits are not its first
    event: a replica that pings and then breaks is retried elsewhere (the client sees a clean
    stream), and one that only ever pings meets the first-byte deadline, not the read timeout
    that every ping restarted. The comments that came before a first event still reach the
    client."""

    async def ping_then_break(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(b": keep-alive\n\n")
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.abort()
        return out

    async def ping_forever(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        while True:
            await out.write(b": ping\r\n\r\n")
            await asyncio.sleep(0.05)

    async def ping_then_answer(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(b": ping\n\n")
        await asyncio.sleep(0.02)
        await out.write(b'data: {"choices":[{"text":"ok"}]}\n\ndata: [DONE]\n\n')
        await out.write_eof()
        return out

    body = {"prompt": "x", "max_tokens": 1, "stream": True}
    for failing in (ping_then_break, ping_forever):
        a, b = await make_fake(handler=failing), await make_fake(handler=one_event_stream)
        gw = await make_gateway(
            [a.url, b.url], policy="round_robin", read_timeout_s=30.0,
            first_byte_floor_s=0.3, first_byte_cap_s=0.5, health_interval_s=60,
        )  # fmt: skip
        for _ in range(2):  # round robin: one of the two starts on the failing replica
            t0 = time.monotonic()
            async with session.post(gw.url + "/v1/completions", json=body) as r:
                text = await r.text()
            assert r.status == 200 and '"ok"' in text and "[DONE]" in text, failing.__name__
            assert '"error"' not in text, failing.__name__
            assert time.monotonic() - t0 < 3.0, failing.__name__
        assert gw.registry.find(b.url).total_failures == 0
    c = await make_fake(handler=ping_then_answer)
    gw = await make_gateway([c.url])
    async with session.post(gw.url + "/v1/completions", json=body) as r:
        assert await r.read() == b': ping\n\ndata: {"choices":[{"text":"ok"}]}\n\ndata: [DONE]\n\n'


async def test_a_malformed_chunk_from_a_replica_fails_the_answer_instead_of_hanging(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """aiohttp's C parser drops the connection on a bad chunk-size line without ending the
    body's reader, and the read timeout never fires: the client waited forever. The gateway's
    watch (gateway/_relay.py) fails the answer within about a second: a stream ends with an
    error event and [DONE], a plain answer is a 502."""
    event = b'data: {"choices":[{"text":"a"}]}\n\n'
    stream = BadChunkReplica(event, "text/event-stream")
    plain = BadChunkReplica(b'{"choices": [', "application/json")
    for replica, body in ((stream, {"stream": True}), (plain, {})):
        await replica.start()
        try:
            gw = await make_gateway([replica.url], read_timeout_s=30.0, health_interval_s=60)
            t0 = time.monotonic()
            async with asyncio.timeout(10):
                async with session.post(gw.url + "/v1/completions",
                                        json={"prompt": "x", "max_tokens": 2, **body}) as r:
                    text = await r.text()  # fmt: skip
            assert time.monotonic() - t0 < 5.0
            if body:
                assert r.status == 200 and text.startswith(event.decode()), text
                assert '"error"' in text and text.endswith("data: [DONE]\n\n"), text
            else:
                assert r.status == 502, text
            assert gw.router.replica_load(gw.registry.find(replica.url).id).in_flight == 0
        finally:
            await replica.stop()


async def test_plain_request_waiting_on_a_replica_taken_out_moves_at_once(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """A plain answer has no first-byte deadline (it comes whole, after decoding), but a
    request still waiting when its replica is taken out is retried at once."""
    release = asyncio.Event()
    a = FakeReplica(handler=lambda request: release.wait())  # type: ignore[arg-type,return-value]
    b = FakeReplica()
    await a.start()
    await b.start()
    try:
        gw = await make_gateway(
            [a.url, b.url], policy="round_robin", read_timeout_s=30.0, health_interval_s=60
        )
        body = {"prompt": "x", "max_tokens": 1}
        tasks = [asyncio.create_task(session.post(gw.url + "/v1/completions", json=body))]
        tasks.append(asyncio.create_task(session.post(gw.url + "/v1/completions", json=body)))
        await asyncio.sleep(0.3)
        assert sum(t.done() for t in tasks) == 1  # the one on the frozen replica waits
        t0 = time.monotonic()
        gw.registry.record_probe(gw.registry.find(a.url).id, False, time.monotonic())
        for _ in range(gw.config.failure_threshold - 1):
            gw.registry.record_probe(gw.registry.find(a.url).id, False, time.monotonic())
        responses = await asyncio.wait_for(asyncio.gather(*tasks), 2.0)
        assert [r.status for r in responses] == [200, 200]
        assert time.monotonic() - t0 < 1.0
        for r in responses:
            r.release()
    finally:
        release.set()
        await a.stop()
        await b.stop()


async def test_replicas_are_named_by_id_towards_clients(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """By default no internal URL reaches a client: not in the header, not in a 502 body."""
    fake = await make_fake(failing=True)
    gw = await make_gateway([fake.url], expose_replica_urls=False, health_interval_s=60)
    record = gw.registry.find(fake.url)
    record.healthy = True
    async with session.post(gw.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}) as r:
        text = await r.text()
        assert r.headers["x-prefixroute-replica"] == record.name
    assert record.name.startswith("r-") and fake.url not in text
    host_port = fake.url.removeprefix("http://")
    assert host_port not in text and host_port not in str(dict(r.headers))
    fake.failing = False
    fake.handler = None
    await fake.stop()  # now a connection error: the 502 must not name the URL either
    async with session.post(gw.url + "/v1/completions", json={"prompt": "y", "max_tokens": 1}) as r:
        text = await r.text()
        assert r.status in (502, 503)
    assert host_port not in text


def _big_stream(events: int, size: int, ended: asyncio.Event | None = None) -> object:
    """A replica that writes ``events`` events of ``size`` characters at once; ``ended`` is set
    when it has written the last byte."""

    async def handler(request: web.Request) -> web.StreamResponse:
        if not request.path.startswith("/v1/"):  # the health checker's /metrics scrape
            raise web.HTTPNotFound()
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        text = "x" * size
        for _ in range(events):
            await out.write(f'data: {{"choices":[{{"text":"{text}"}}]}}\n\n'.encode())
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        if ended is not None:
            ended.set()
        return out

    return handler


@contextlib.asynccontextmanager
async def _slow_reader(
    url: str, request: dict[str, object] | None = None
) -> AsyncIterator[asyncio.StreamReader]:
    """A client that sends a completion request (by default a stream) and then reads only what
    the test reads."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    sent = {"prompt": "x", "max_tokens": 1, "stream": True} if request is None else request
    body = json.dumps(sent).encode()
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    try:
        await writer.drain()
        yield reader
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def test_a_slow_reader_holds_no_replica_slot_after_the_replica_ended(
    make_fake: FakeFactory,
    make_gateway: GatewayFactory,
) -> None:
    """A 32 MB stream (more than the kernel's socket buffers hold) to a client that reads
    nothing: the replica's in-flight slot is released within 1 s of the replica's end, not
    when the client is done."""
    ended = asyncio.Event()
    fake = await make_fake(handler=_big_stream(8000, 4000, ended))  # type: ignore[arg-type]
    gw = await make_gateway(
        [fake.url], max_in_flight_per_replica=1, client_buffer_bytes=64 * 1024 * 1024
    )
    rid = gw.registry.find(fake.url).id
    async with _slow_reader(gw.url) as reader:
        async with asyncio.timeout(20.0):
            await ended.wait()
        async with asyncio.timeout(1.0):
            while gw.router.loads.get(rid).in_flight:
                await asyncio.sleep(0.01)
        # The slot is free while the client still has not read: another request gets in.
        async with (
            aiohttp.ClientSession() as s,
            s.post(gw.url + "/v1/completions", json={"prompt": "y", "max_tokens": 1}) as r,
        ):
            assert r.status == 200
        # The slow client still gets the whole stream.
        tail = b""
        async with asyncio.timeout(20.0):
            while not tail.endswith(b"0\r\n\r\n"):
                tail = (tail + await reader.read(1 << 20))[-64:]
        assert b"[DONE]" in tail


async def test_a_client_that_stops_reading_is_cut_after_the_write_timeout(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """Past the buffer bound, a client that makes no room for write_timeout_s is cut and
    counted, and its replica slot is free."""
    fake = await make_fake(handler=_big_stream(8000, 4000))  # type: ignore[arg-type]
    gw = await make_gateway([fake.url], client_buffer_bytes=16 * 1024, client_write_timeout_s=0.3)
    rid = gw.registry.find(fake.url).id
    async with _slow_reader(gw.url):
        async with asyncio.timeout(10.0):
            while True:
                metrics = await (await session.get(gw.url + "/metrics")).text()
                if 'prefixroute_cut_streams_total{reason="slow_client"} 1.0' in metrics:
                    break
                await asyncio.sleep(0.05)
        assert gw.router.loads.get(rid).in_flight == 0
        assert gw.registry.find(fake.url).total_failures == 0  # the client's doing


async def test_an_unreadable_body_closes_its_connection_and_says_so(
    behind: tuple[FakeReplica, Gateway], session: aiohttp.ClientSession
) -> None:
    """A body declared gzip that is not: a 400 with ``Connection: close``, so a keep-alive
    client does not send its next request into a connection the gateway is closing."""
    _, gw = behind
    async with _post_bytes(session, gw, b'{"prompt": "not gzip"}', GZIPPED) as r:
        assert r.status == 400
        assert r.headers.get("Connection", "").lower() == "close"
        assert (await r.json())["error"]["type"] == "invalid_request_error"
    for _ in range(3):  # the same session's next requests are served
        async with session.post(
            gw.url + "/v1/completions", json={"prompt": "ok", "max_tokens": 1}
        ) as r:
            assert r.status == 200


SLOW = b"queued-long"  # the prompt of the stream held at its replica (below)


async def _a_stream_waits(
    make_fake: FakeFactory,
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
    others: Handler,
) -> tuple[Gateway, list[FakeReplica], asyncio.Task[aiohttp.ClientResponse], asyncio.Event,
           list[tuple[int, str]]]:  # fmt: skip
    """Two replicas that hold a stream with SLOW's prompt until released and answer every other
    request with ``others``, behind a gateway whose first-byte deadline is 0.3 s. Sends the SLOW
    stream, then 12 other streams 0.1 s apart (1.2 s, 4 deadlines: each replica answers one of
    them every 0.2 s). Returns the gateway, the replicas, the SLOW request's task (not yet
    released), its release, and each other request's status and body."""
    release = asyncio.Event()

    async def holding(request: web.Request) -> web.StreamResponse:
        if SLOW in await request.read():
            await release.wait()  # behind minutes of other work, say
            return await one_event_stream(request)
        return await others(request)

    fakes = [await make_fake(handler=holding), await make_fake(handler=holding)]
    gw = await make_gateway(
        [f.url for f in fakes], policy="round_robin", read_timeout_s=30.0,
        first_byte_floor_s=0.3, first_byte_cap_s=0.3, health_interval_s=60,
    )  # fmt: skip
    body = {"prompt": SLOW.decode(), "max_tokens": 1, "stream": True}
    slow = asyncio.create_task(session.post(gw.url + "/v1/completions", json=body))
    replies = []
    for _ in range(12):
        other = {"prompt": "x", "max_tokens": 1, "stream": True}
        async with session.post(gw.url + "/v1/completions", json=other) as r:
            replies.append((r.status, await r.text()))
        await asyncio.sleep(0.1)
    return gw, fakes, slow, release, replies


async def test_a_replica_still_at_work_keeps_its_slow_stream(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """Past its first-byte deadline, a stream stays on a replica that meanwhile sent other
    requests' first tokens (busy, not stopped: _first_byte's docstring): it is neither moved
    nor counted against the replica, and the deadline's moves are counted."""
    gw, fakes, slow, release, replies = await _a_stream_waits(
        make_fake, make_gateway, session, one_event_stream
    )
    assert all(status == 200 and "[DONE]" in text for status, text in replies)
    release.set()
    async with asyncio.timeout(5):
        resp = await slow
    text = await resp.text()
    assert resp.status == 200 and '"ok"' in text
    sent_to = [f for f in fakes if any(SLOW in s.body for s in f.seen)]
    assert len(sent_to) == 1 and sum(SLOW in s.body for s in sent_to[0].seen) == 1
    home = gw.registry.find(sent_to[0].url).id
    assert resp.headers["x-prefixroute-replica"] == home  # it kept its place there
    assert [rec.total_failures for rec in gw.registry] == [0, 0]
    async with session.get(gw.url + "/metrics") as m:
        metrics = await m.text()
    moved = [
        ln
        for ln in metrics.splitlines()
        if ln.startswith(f'prefixroute_first_byte_extensions_total{{replica="{home}"}}')
    ]
    assert moved and float(moved[0].split()[-1]) >= 2, moved


async def _refused(request: web.Request) -> web.StreamResponse:
    return web.json_response({"error": {"message": "bad request"}}, status=400)


async def _error_event(request: web.Request) -> web.StreamResponse:
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await out.prepare(request)
    await out.write(b'data: {"error": {"message": "engine dead", "code": 500}}\n\n')
    await out.write(b"data: [DONE]\n\n")
    await out.write_eof()
    return out


@pytest.mark.parametrize("others", [_refused, _error_event], ids=["400", "error-event"])
async def test_error_answers_are_no_sign_of_work(
    make_fake: FakeFactory,
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
    others: Handler,
) -> None:
    """A stopped engine's HTTP server may still turn requests away, or answer them with an
    in-band error: neither moves a waiting stream's first-byte deadline on (_first_byte)."""
    _, _, slow, release, _ = await _a_stream_waits(make_fake, make_gateway, session, others)
    done = slow.done()
    release.set()
    resp = await slow
    assert done and resp.status == 504  # timed out on both, long before the release


async def test_a_long_plain_answer_is_not_retried_nor_blamed(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """A plain answer arrives whole when its decoding ends: a replica that answers others
    meanwhile but not this one within ``read_timeout_s`` is at work on a long answer
    (docs/configuration.md, ``_verdict``). The client gets a 504 that names the setting; the
    request is not sent to a second replica (it would take as long there), and no replica is
    marked, so long answers asked of every replica take none out."""
    longs: list[str] = []

    async def slow_on_long(request: web.Request) -> web.StreamResponse:
        if b'"long"' in await request.read():
            longs.append(request.host)
            await asyncio.sleep(1.0)  # past the read timeout below
        return web.Response(body=completion_body(), content_type="application/json")

    a, b = await make_fake(handler=slow_on_long), await make_fake(handler=slow_on_long)
    gw = await make_gateway(
        [a.url, b.url], policy="round_robin", read_timeout_s=0.4, health_interval_s=60
    )
    for _ in range(3):  # each replica once or more: a long answer each time
        long = asyncio.create_task(send_plain(session, gw, {"prompt": "long", "max_tokens": 1}))
        while not long.done():  # others' answers keep coming from both replicas meanwhile
            status, _ = await send_plain(session, gw, {"prompt": "short", "max_tokens": 1})
            assert status == 200
            await asyncio.sleep(0.02)
        status, error = long.result()
        assert status == 504, error
        assert error["error"]["code"] == "upstream_timeout" and "read_timeout_s" in str(error)
    assert len(longs) == 3, longs  # one replica each: none retried
    for fake in (a, b):
        record = gw.registry.find(fake.url)
        assert record.total_failures == 0 and record.healthy
    # Each counts in its replica's error rate (where an outlier among its peers stands out).
    errors = [t for f in (a, b) for t, ok in gw.registry.find(f.url).outcomes if not ok]
    assert len(errors) == 3 and all(isinstance(t, float) for t in errors)
    async with session.get(gw.url + "/metrics") as r:
        metrics = await r.text()
    assert 'prefixroute_retries_total{reason="timeout"}' not in metrics
    assert 'kind="answer_timeout"' in metrics


async def send_plain(
    session: aiohttp.ClientSession, gw: Gateway, body: dict[str, object]
) -> tuple[int, dict[str, Any]]:
    """POST ``body`` to the gateway's completions: its status and parsed JSON answer."""
    async with session.post(gw.url + "/v1/completions", json=body) as r:
        return r.status, await r.json()
