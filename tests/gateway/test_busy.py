"""A replica that answers 429 is full, not failing (``gateway._upstream_answers``), as is
SGLang's 503 "The request queue is full." (its ``--max-queued-requests`` overflow; in-band as
a stream's first event after a 200). The request goes to another replica, the busy one is not
blamed, and with nowhere else to go the answer reaches the client as it came."""

from __future__ import annotations

import aiohttp
import pytest

from prefixroute.gateway import Gateway
from prefixroute.gateway._state import STATE

from .fakes import FakeReplica, Handler, one_event_stream, queue_full, sglang_queue_full
from .helpers import FakeFactory, GatewayFactory


def _posts(fake: FakeReplica) -> int:
    return len([s for s in fake.seen if s.method == "POST"])


def _counter(gw: Gateway, name: str, **labels: str) -> float:
    registry = gw.app[STATE].metrics.registry
    return sum(
        s.value for m in registry.collect() for s in m.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )  # fmt: skip


async def _complete(
    session: aiohttp.ClientSession, gw: Gateway, i: int, stream: bool = True
) -> aiohttp.ClientResponse:
    body = {"prompt": f"question {i} " + "word " * 50, "max_tokens": 1, "stream": stream}
    async with session.post(gw.url + "/v1/completions", json=body) as resp:
        await resp.read()
        return resp


@pytest.mark.parametrize(
    "full, stream",
    [(queue_full, True), (sglang_queue_full, True), (sglang_queue_full, False)],
    ids=["429", "sglang stream", "sglang plain"],
)
async def test_a_busy_replicas_requests_go_to_another_and_it_is_not_blamed(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession,
    full: Handler, stream: bool,
) -> None:  # fmt: skip
    busy = await make_fake(handler=full)
    free = await make_fake(handler=one_event_stream if stream else None)
    gw = await make_gateway([busy.url, free.url], policy="round_robin")  # each tried in turn
    statuses = [(await _complete(session, gw, i, stream)).status for i in range(12)]
    assert statuses == [200] * 12
    assert _posts(busy) >= 1  # it was tried, and each such request moved on
    assert _posts(free) == 12
    assert _counter(gw, "prefixroute_retries_total", reason="busy") == _posts(busy)
    failures = _counter(gw, "prefixroute_upstream_failures_total", replica=busy.url, kind="busy")
    assert failures == _posts(busy)
    record = gw.registry.find(busy.url)
    assert record.healthy and record.total_failures == 0  # a full replica is a healthy one


async def test_with_every_replica_busy_the_client_gets_the_429_once_each_was_asked(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    fakes = [await make_fake(handler=queue_full) for _ in range(3)]
    gw = await make_gateway([f.url for f in fakes])
    resp = await _complete(session, gw, 0)
    assert resp.status == 429 and resp.headers["Retry-After"] == "0"
    assert [_posts(f) for f in fakes] == [1, 1, 1]  # each asked once, none twice
    assert all(gw.registry.find(f.url).healthy for f in fakes)


async def test_with_every_sglang_replica_full_the_stream_reaches_the_client_as_it_came(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    fakes = [await make_fake(handler=sglang_queue_full) for _ in range(2)]
    gw = await make_gateway([f.url for f in fakes])
    body = {"prompt": "a question", "max_tokens": 1, "stream": True}
    async with session.post(gw.url + "/v1/completions", json=body) as resp:
        raw = await resp.text()
    assert resp.status == 200 and "The request queue is full." in raw and "[DONE]" in raw
    assert [_posts(f) for f in fakes] == [1, 1]  # the first moved on; the last relayed
    assert all(gw.registry.find(f.url).total_failures == 0 for f in fakes)


async def test_a_lone_full_sglang_replica_is_not_taken_out(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """Its 503s go to the client as they came (nowhere else to go), and blame it no more than
    a 429 does: three of them had taken it out (the review of 2026-12-07)."""
    full = await make_fake(handler=sglang_queue_full)
    gw = await make_gateway([full.url])
    for i in range(6):
        assert (await _complete(session, gw, i, stream=False)).status == 503
    record = gw.registry.find(full.url)
    assert record.healthy and record.total_failures == 0
    assert _counter(gw, "prefixroute_upstream_failures_total", replica=full.url, kind="busy") == 6
