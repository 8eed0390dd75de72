"""The gateway's documented defaults, pinned through behaviour (README "Gateway", docs/security.md).

Each test builds the gateway's parts from a default ``GatewayConfig`` (no setting changed) and
checks what the documentation promises:

- a replica is out after 3 consecutive failures, for at least 5 s, and a successful probe brings
  it back from then on; a successful probe does not forgive failures of a healthy replica;
- the approximate index holds at most 16,384 blocks per replica;
- the admin token has at least 8 characters;
- a tenant's request bucket holds one second's worth of requests (at least 1);
- a failed request is retried once: with every replica failing, exactly 2 are tried.
"""

from __future__ import annotations

import asyncio
import dataclasses

import aiohttp
import pytest
from aiohttp import web

from prefixroute.core import ConfigError, ReplicaId
from prefixroute.gateway import Gateway, GatewayConfig, ReplicaStatus
from prefixroute.gateway._errors import RateLimited
from prefixroute.gateway._ratelimit import TenantLimiter
from prefixroute.gateway._tenant_config import TenantLimits

from .fakes import FakeReplica
from .helpers import FAST_GATEWAY, send
from .test_precise import metric

A, B = "http://a:1", "http://b:2"


def default_gateway() -> Gateway:
    """A gateway with every setting at its default (not started: no I/O)."""
    return Gateway(GatewayConfig(replicas=(A, B)))


# --- ejection: 3 failures, at least 5 s -------------------------------------------------------


def test_three_consecutive_failures_take_a_replica_out_for_at_least_5_s() -> None:
    registry = default_gateway().registry
    a = registry.get(ReplicaId(A))
    registry.record_failure(a.id, now=100.0, why="test")
    registry.record_failure(a.id, now=100.0, why="test")
    assert a.status is ReplicaStatus.HEALTHY  # 2 are not enough
    registry.record_failure(a.id, now=100.0, why="test")
    assert a.status is ReplicaStatus.UNHEALTHY
    assert registry.candidates(None) == [ReplicaId(B)]
    registry.record_probe(a.id, ok=True, now=104.999)
    assert a.status is ReplicaStatus.UNHEALTHY  # less than 5 s out
    registry.record_probe(a.id, ok=True, now=105.0)
    assert a.status is ReplicaStatus.HEALTHY  # 5 s: "at least 5 s", then the probe decides
    assert a.failures == 0


def test_a_success_forgives_failures_but_a_successful_probe_does_not() -> None:
    # A replica whose /health answers while its completions fail must still be taken out.
    registry = default_gateway().registry
    a = registry.get(ReplicaId(A))
    registry.record_failure(a.id, now=1.0, why="test")
    registry.record_failure(a.id, now=2.0, why="test")
    registry.record_probe(a.id, ok=True, now=2.5)
    assert a.failures == 2
    registry.record_failure(a.id, now=3.0, why="test")
    assert a.status is ReplicaStatus.UNHEALTHY
    # A request it served, though, resets the count.
    b = registry.get(ReplicaId(B))
    registry.record_failure(b.id, now=1.0, why="test")
    registry.record_failure(b.id, now=2.0, why="test")
    registry.record_success(b.id)
    registry.record_failure(b.id, now=3.0, why="test")
    registry.record_failure(b.id, now=4.0, why="test")
    assert b.status is ReplicaStatus.HEALTHY and b.failures == 2


def test_a_failed_probe_of_an_ejected_replica_keeps_it_out() -> None:
    registry = default_gateway().registry
    a = registry.get(ReplicaId(A))
    for _ in range(3):
        registry.record_failure(a.id, now=0.0, why="test")
    registry.record_probe(a.id, ok=False, now=6.0)
    assert a.status is ReplicaStatus.UNHEALTHY
    registry.record_probe(a.id, ok=True, now=6.0)
    assert a.status is ReplicaStatus.HEALTHY


# --- the index: 16,384 blocks per replica ------------------------------------------------------


def test_the_approximate_index_holds_16384_blocks_per_replica() -> None:
    router = default_gateway().router
    size = router.hasher.block_size
    hashes = router.hasher.hash_tokens(list(range(size * (16_384 + 100))))
    assert len(hashes) == 16_384 + 100
    router.index.insert(ReplicaId(A), hashes[:16_384])
    assert router.index.blocks_of(ReplicaId(A)) == 16_384
    router.index.insert(ReplicaId(A), hashes[16_384:])
    assert router.index.blocks_of(ReplicaId(A)) == 16_384  # the oldest 100 made room
    assert router.index.blocks_of(ReplicaId(B)) == 0


# --- the admin token: at least 8 characters ----------------------------------------------------


def test_the_admin_token_needs_8_characters() -> None:
    with pytest.raises(ConfigError, match="at least 8 characters"):
        GatewayConfig(admin_token="1234567")
    assert GatewayConfig(admin_token="12345678").admin_token == "12345678"


# --- the rate limiter: one second's worth of burst ---------------------------------------------


@pytest.mark.parametrize(("rate", "burst"), [(5.0, 5), (20.0, 20), (0.5, 1)])
def test_the_default_burst_is_one_seconds_worth_at_least_one(rate: float, burst: int) -> None:
    limiter = TenantLimiter("t", TenantLimits(requests_per_second=rate), now=0.0)
    for _ in range(burst):
        limiter.admit(0.0)  # all at once
    with pytest.raises(RateLimited) as info:
        limiter.admit(0.0)
    assert info.value.limit == "requests_per_second"
    limiter.release()
    limiter.admit(1.0 / rate)  # one request's worth of refill later: admitted again


def test_released_requests_never_make_room_beyond_the_in_flight_cap() -> None:
    # Releasing more than was admitted (a request accounted twice) must not open a slot.
    limiter = TenantLimiter("t", TenantLimits(max_in_flight=1), now=0.0)
    limiter.admit(0.0)
    limiter.release()
    limiter.release()
    assert limiter.in_flight == 0
    limiter.admit(0.0)
    with pytest.raises(RateLimited):
        limiter.admit(0.0)


def test_a_lower_burst_caps_the_tokens_carried_over() -> None:
    # Reconfiguring keeps the bucket's level but never above the new burst.
    limiter = TenantLimiter("t", TenantLimits(requests_per_second=1, burst=10), now=0.0)
    limiter.configure(TenantLimits(requests_per_second=1, burst=3), now=0.0)
    for _ in range(3):
        limiter.admit(0.0)
    with pytest.raises(RateLimited):
        limiter.admit(0.0)


# --- the retry: once -------------------------------------------------------------------------


async def test_a_failing_request_tries_exactly_two_of_three_failing_replicas(
    session: aiohttp.ClientSession,
) -> None:
    # Three replicas, each failing in its own way, so that no failure repeats the one before
    # (a repeat ends the retries early: the request's own fault): one answers 503, one drops
    # the connection, one is gone (connection refused). With one retry, any two are tried.
    async def unavailable(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"message": "overloaded"}}, status=503)

    async def drops(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.close()
        await asyncio.sleep(5)
        raise AssertionError("unreachable: the connection is closed")

    fakes = [FakeReplica(handler=unavailable), FakeReplica(handler=drops), FakeReplica()]
    for fake in fakes:
        await fake.start()
    # Every setting that decides retries at its default: only the probe timing is fast.
    config = dataclasses.replace(
        GatewayConfig(),
        replicas=tuple(f.url for f in fakes),
        port=0,
        expose_replica_urls=True,
        health_interval_s=FAST_GATEWAY.health_interval_s,
        health_timeout_s=FAST_GATEWAY.health_timeout_s,
    )
    gw = Gateway(config)
    await gw.start()
    try:
        await fakes[2].stop()  # registered healthy, then gone
        async with asyncio.timeout(10):
            reply = await send(session, gw.url, "/v1/completions", {"prompt": "a b c"})
            assert reply.status >= 500
            async with session.get(gw.url + "/metrics") as resp:
                text = await resp.text()
        failed = metric(text, "prefixroute_upstream_failures_total")
        retried = metric(text, "prefixroute_retries_total")
        assert (failed, retried) == (2, 1)  # the first try and one retry
        lines = [x for x in text.splitlines() if x.startswith("prefixroute_upstream_failures")]
        tried = {f.url for f in fakes if any(f'replica="{f.url}"' in x for x in lines)}
        assert len(tried) == 2  # elsewhere
    finally:
        await gw.stop()
        for fake in fakes:
            await fake.stop()
