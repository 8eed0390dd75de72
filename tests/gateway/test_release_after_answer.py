"""An answer's end is accounted after its bytes went out (gateway/_accounting.py ``Release``).

From ``Release.after_answer``: a client does not wait for what the router learns from its answer;
the end's time is taken when the answer ended, the router's work waits for the loop's next turn.
From ``Release.__call__``: a failed attempt is ended at once, since the request may be routed
again under the same id.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import aiohttp

from prefixroute.core import Router, make_policy
from prefixroute.emulate import EmulatorConfig
from prefixroute.gateway import _accounting
from prefixroute.gateway._accounting import Release
from prefixroute.sim.replica import ReplicaConfig

from .helpers import ClusterFactory, GatewayFactory, words
from .test_precise import metric, metrics


def _router() -> Router:
    router = Router(make_policy("least_loaded"))
    router.add_replica("r0")
    return router


async def test_an_answer_is_ended_on_the_next_loop_turn_at_the_time_it_ended(
    monkeypatch: Any,
) -> None:
    router = _router()
    router.route(router.view("a", tokens=list(range(64)), output_tokens=2), 0.0)
    ended: list[float] = []
    real_end = _accounting.end

    def spy(*args: Any) -> None:
        ended.append(args[3])
        real_end(*args)

    monkeypatch.setattr(_accounting, "end", spy)
    release = Release(router, None, "a", plain=False)
    t0 = time.monotonic()
    release.after_answer(None)
    t1 = time.monotonic()
    assert ended == [] and router.replica_load("r0").in_flight == 1  # not yet
    time.sleep(0.05)  # the loop is busy for a while before its next turn
    await asyncio.sleep(0)
    assert router.replica_load("r0").in_flight == 0
    assert len(ended) == 1 and t0 <= ended[0] <= t1  # the answer's time, not the turn's
    release(None)  # the `finally` call after it does nothing
    await asyncio.sleep(0)
    assert len(ended) == 1


async def test_a_failed_attempt_is_ended_at_once_so_a_retry_under_its_id_stays_counted() -> None:
    router = _router()
    view = router.view("a", tokens=list(range(64)), output_tokens=2)
    router.route(view, 0.0)
    Release(router, None, "a", plain=False)(None)  # the attempt failed
    assert router.replica_load("r0").in_flight == 0
    router.route(view, 0.1)  # the retry, same id
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert router.replica_load("r0").in_flight == 1  # the first attempt's end did not end it


def _fetch(url: str, body: dict[str, Any], seen: list[float]) -> None:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()
    seen.append(time.monotonic())


async def _client_thread(
    fetch: Callable[[str, dict[str, Any], list[float]], None], url: str, body: dict[str, Any]
) -> list[float]:
    """``fetch`` on a thread of its own (a client the gateway's loop cannot hold up), waited
    for without blocking the loop; returns the times it saw."""
    seen: list[float] = []
    client = threading.Thread(target=fetch, args=(url + "/v1/completions", body, seen))
    client.start()
    while client.is_alive():
        await asyncio.sleep(0.01)
    return seen


async def test_the_client_has_its_answer_before_the_router_has_learned_from_it(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory
) -> None:
    """The router's end of the request is made slow (it holds the gateway's loop 0.5 s): a
    client on its own thread still has the whole answer, plain or streamed, before it is over."""
    cluster = await make_cluster(1, EmulatorConfig(ReplicaConfig(block_size=16)))
    gw = await make_gateway(cluster.urls)
    complete = gw.router.complete
    learned: list[float] = []

    def slow_complete(*args: Any, **kwargs: Any) -> None:
        complete(*args, **kwargs)
        time.sleep(0.5)
        learned.append(time.monotonic())

    gw.router.complete = slow_complete  # type: ignore[method-assign]
    for stream in (False, True):
        body = {"prompt": words(100), "max_tokens": 4, "stream": stream}
        seen = await _client_thread(_fetch, gw.url, body)
        assert len(seen) == 1 and len(learned) == 1, (stream, seen, learned)
        assert seen[0] < learned[0] - 0.3, (stream, learned[0] - seen[0])
        learned.clear()


async def test_a_plain_answers_usage_is_read_after_the_client_has_it(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, monkeypatch: Any
) -> None:
    """``RelayResult.read_usage``: the body's usage is parsed once the answer went out (made
    slow here: 0.5 s of the gateway's loop); the router and the metrics still learn from it."""
    from prefixroute.gateway import _relay

    cluster = await make_cluster(1, EmulatorConfig(ReplicaConfig(block_size=16)))
    gw = await make_gateway(cluster.urls)
    parsed: list[float] = []
    real = _relay.answer_in_body

    def slow_usage(body: bytes) -> Any:
        time.sleep(0.5)
        parsed.append(time.monotonic())
        return real(body)

    monkeypatch.setattr(_relay, "answer_in_body", slow_usage)
    reports = gw.router.usage_reports
    seen = await _client_thread(_fetch, gw.url, {"prompt": words(100), "max_tokens": 4})
    while not parsed:
        await asyncio.sleep(0.01)
    assert len(seen) == 1 and len(parsed) == 1
    assert seen[0] < parsed[0] - 0.3, parsed[0] - seen[0]
    await asyncio.sleep(0.01)
    assert gw.router.usage_reports == reports + 1  # the replica's usage reached the router
    async with aiohttp.ClientSession() as session:
        text = await metrics(session, gw.url)
    # ... and the metrics counted its cached tokens (none: a first request), not it missing.
    assert metric(text, "prefixroute_actual_cached_tokens_total") == 0
    assert metric(text, "prefixroute_usage_missing_total") == 0


def _first_line(url: str, body: dict[str, Any], seen: list[float]) -> None:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        while not resp.readline().startswith(b"data:"):  # the first event's data line
            pass
        seen.append(time.monotonic())
        resp.read()


async def test_a_streams_first_token_reaches_the_client_before_the_router_learns_from_it(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory
) -> None:
    """``Proxy._first_token``: the first token is timed when its event is relayed, and the
    router's work on it (made slow here: 0.5 s of the gateway's loop) runs after the client
    has the event; the router still hears it (the request stops counting as prefilling)."""
    cluster = await make_cluster(1, EmulatorConfig(ReplicaConfig(block_size=16)))
    gw = await make_gateway(cluster.urls)
    real = gw.router.first_token
    heard: list[tuple[float, float]] = []

    def slow_first_token(rid: str, now: float, measured: bool = True) -> None:
        time.sleep(0.5)
        real(rid, now, measured)
        heard.append((now, time.monotonic()))

    gw.router.first_token = slow_first_token  # type: ignore[method-assign]
    body = {"prompt": words(100), "max_tokens": 4, "stream": True}
    seen = await _client_thread(_first_line, gw.url, body)
    assert len(seen) == 1 and len(heard) == 1
    timed, done = heard[0]
    assert seen[0] < done - 0.3, done - seen[0]  # the client had it well before
    assert timed <= seen[0]  # timed when relayed, not when the router got to it
