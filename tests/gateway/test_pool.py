"""Pooled connections that the replica closed: resent once more, never a failure (``_pool``).

A replica's server closes a keep-alive connection that stays idle past its timeout (vLLM and
SGLang: 5 s). A POST written on such a connection as it closes fails before any answer, and
aiohttp resends only idempotent requests; one request in eight was answered 502 when requests
came at about the replica's keep-alive interval (2026-12-01). ``ClosingReplica`` makes the race
certain: it closes a connection, unanswered, when a second POST arrives on it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from prefixroute.gateway import Gateway
from prefixroute.gateway._state import STATE

from .fakes import ClosingReplica
from .helpers import GatewayFactory, send

# No probes between the requests, only the first check; and no scraping, whose batch-size ask
# (gateway/_server_info.py) would run beside that check on a pooled connection of its own: the
# pool holds the probe's one connection.
QUIET = {"health_interval_s": 60.0, "scrape_metrics": False}
# Token ids: a text prompt would make a fresh gateway ask the replica's /tokenize first
# (gateway/_token_probe.py), one more POST on the pooled connections these tests count.
BODY = {"model": "emulated", "prompt": [1, 2, 3], "max_tokens": 1}


def _sample(gw: Gateway, name: str, labels: dict[str, str] | None = None) -> float:
    value = gw.app[STATE].metrics.registry.get_sample_value(name, labels or {})
    return 0.0 if value is None else value


def _total(gw: Gateway, family: str) -> float:
    """A counter family's total over all its labels."""
    registry = gw.app[STATE].metrics.registry
    return sum(sample.value for metric in registry.collect() if metric.name == family
               for sample in metric.samples if sample.name == family + "_total")  # fmt: skip


async def _started(reset: bool = False, **kwargs: Any) -> ClosingReplica:
    replica = ClosingReplica(reset=reset, **kwargs)
    await replica.start()
    return replica


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
async def test_a_request_on_a_connection_the_replica_closed_is_sent_again(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession, reset: bool
) -> None:
    replica = await _started(reset)
    try:
        gw = await make_gateway([replica.url], **QUIET)
        statuses = [(await send(session, gw.url, "/v1/completions", BODY)).status
                    for _ in range(6)]  # fmt: skip
    finally:
        await replica.stop()
    assert statuses == [200] * 6
    # Each request after the first went out on the connection the one before had used.
    assert _sample(gw, "prefixroute_upstream_resends_total") == 5
    assert replica.posts == 6 + 5
    assert _total(gw, "prefixroute_upstream_failures") == 0  # the replica is not blamed
    assert _total(gw, "prefixroute_retries") == 0


async def test_a_new_connection_closed_unanswered_is_the_replica_s_failure(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """Only a pooled connection earns a resend: the replica closes every POST here, so the
    request is sent on the probes' pooled connection, then on a new one, and fails."""
    replica = await _started(every_post=True)
    try:
        gw = await make_gateway([replica.url], **QUIET)
        reply = await send(session, gw.url, "/v1/completions", BODY)
    finally:
        await replica.stop()
    assert reply.status == 502
    assert replica.posts == 2
    assert _sample(gw, "prefixroute_upstream_resends_total") == 1


async def test_a_late_close_is_the_replica_s_failure_not_resent(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """A pooled connection closed after the replica seemed to work on the request for longer
    than ``STALE_WITHIN_S`` (1 s) is no stale connection: a replica that crashed or dropped the
    request, which must not be made to repeat it."""
    replica = await _started(delay_s=1.5)
    try:
        gw = await make_gateway([replica.url], **QUIET)
        first = await send(session, gw.url, "/v1/completions", BODY)
        second = await send(session, gw.url, "/v1/completions", BODY)  # the same connection
    finally:
        await replica.stop()
    assert (first.status, second.status) == (200, 502)
    assert replica.posts == 2
    assert _sample(gw, "prefixroute_upstream_resends_total") == 0


async def test_idle_pooled_connections_are_closed_by_the_gateway_first(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """``upstream_idle_timeout_s``: a connection idle longer is not reused, so a request after
    a longer pause opens a new one and no resend is needed."""
    replica = await _started()
    try:
        gw = await make_gateway([replica.url], upstream_idle_timeout_s=0.2, **QUIET)
        await asyncio.sleep(0.4)  # the probes' connection, idle past the timeout
        first = await send(session, gw.url, "/v1/completions", BODY)
        await asyncio.sleep(0.4)
        second = await send(session, gw.url, "/v1/completions", BODY)
    finally:
        await replica.stop()
    assert (first.status, second.status) == (200, 200)
    assert replica.posts == 2
    assert _sample(gw, "prefixroute_upstream_resends_total") == 0
