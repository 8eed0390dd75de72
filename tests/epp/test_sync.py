"""Several pickers, one view: two ``epp`` instances (and a gateway) share decisions and load
through a real ``redis-server`` (``--sync-redis``), with no Envoy (``grpc_envoy`` plays it).

Without ``redis-server`` these skip, unless ``PREFIXROUTE_REDIS_REQUIRED=1``: then they fail.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from gateway.helpers import FAST_GATEWAY, STEADY, question
from gateway.redis_server import RedisServer
from heard import Heard
from polling import until

from prefixroute.core import DEFAULT_POLICY, ReplicaId
from prefixroute.emulate import EmulatedCluster
from prefixroute.epp import EndpointPicker, EppConfig, PickStream, replica_of
from prefixroute.gateway import Gateway

from .conftest import PickerStarter
from .grpc_envoy import Exchange, Passed, through

CHAT = "/v1/chat/completions"
PickerFactory = Callable[..., Any]


@pytest.fixture
def make_picker(cluster: EmulatedCluster, start_picker: PickerStarter) -> PickerFactory:
    async def make(sync_redis: str | None, seed: int = 0) -> EndpointPicker:
        routing = dataclasses.replace(
            FAST_GATEWAY, replicas=tuple(cluster.urls), policy=DEFAULT_POLICY, seed=seed,
            sync_redis=sync_redis, **STEADY,
        )  # fmt: skip
        return await start_picker(EppConfig(routing, grpc_port=0, http_port=None))

    return make


def applied(epp: EndpointPicker) -> float:
    """The other instances' decisions this picker applied (its own /metrics family)."""
    return epp.metrics.registry.get_sample_value("prefixroute_sync_applied_total") or 0.0


def settled(epp: EndpointPicker) -> bool:
    """No other instance's request still counted in this picker's load view: their ends (the
    sync's progress messages, published after their decisions) have arrived too."""
    remote = epp.metrics.registry.get_sample_value("prefixroute_sync_remote_in_flight")
    return remote == 0.0


async def connected(*epps: EndpointPicker) -> None:
    await until(lambda: all(e.sync is not None and e.sync.connected for e in epps))


async def conversation(
    session: aiohttp.ClientSession, epps: list[EndpointPicker], name: str, turns: int = 4
) -> list[Passed]:
    """Turn i picked by ``epps[i % len]``, as a balancer in front of the pickers would; with
    sync on, each turn waits until the others applied the previous decision and heard its end
    (the user's think time, in production): still counted in flight on its replica, the
    previous turn may rightly send the next to an idle one. Each turn is a chat whose history
    is every earlier turn."""
    messages: list[dict[str, str]] = []
    out: list[Passed] = []
    for turn in range(turns):
        messages.append(question(name, turn))
        epp = epps[turn % len(epps)]
        others = [e for e in epps if e is not epp and e.sync is not None]
        before = [applied(e) for e in others]
        body = {"model": "emulated", "messages": messages, "max_tokens": 4}
        passed = await through(epp, session, CHAT, body)
        out.append(passed)
        answer = passed.body["choices"][0]["message"]["content"]
        messages.append({"role": "assistant", "content": answer})
        pairs = list(zip(others, before, strict=True))
        await until(lambda pairs=pairs: all(applied(e) > b and settled(e) for e, b in pairs))
    return out


async def test_turns_alternating_between_two_pickers_stay_on_one_replica(
    redis_server: RedisServer, make_picker: PickerFactory, session: aiohttp.ClientSession
) -> None:
    a, b = await make_picker(redis_server.url, seed=0), await make_picker(redis_server.url, seed=1)
    await connected(a, b)
    replies = await conversation(session, [a, b], "one")
    assert len({r.endpoint for r in replies}) == 1
    assert replies[0].predicted == 0 and all(r.predicted > 0 for r in replies[1:])
    assert replies[0].cached == 0 and all(r.cached > 0 for r in replies[1:])  # the replica's word
    assert {r.headers["x-prefixroute-reason"] for r in replies[1:]} == {"prefix_match"}
    assert applied(a) == applied(b) == 2  # each applied the other's two turns


async def test_without_sync_the_second_picker_knows_nothing(
    make_picker: PickerFactory, session: aiohttp.ClientSession
) -> None:
    a, b = await make_picker(None, seed=0), await make_picker(None, seed=1)
    replies = await conversation(session, [a, b], "two", turns=2)
    assert [r.predicted for r in replies] == [0, 0]  # b sees the conversation first


async def test_a_decision_at_one_picker_is_load_at_the_other_until_it_ends(
    redis_server: RedisServer, make_picker: PickerFactory
) -> None:
    a, b = await make_picker(redis_server.url), await make_picker(redis_server.url)
    await connected(a, b)
    ex = Exchange(a)
    try:
        body = {"model": "emulated", "prompt": "long prompt " * 200, "max_tokens": 16}
        replica = replica_of(await ex.pick("/v1/completions", body))
        assert a.router.replica_load(replica).in_flight == 1  # a's own
        await until(lambda: b.router.replica_load(replica).in_flight == 1)
        assert b.router.replica_load(replica).queued_prefill_tokens > 0  # not yet prefilled
        usage = {"prompt_tokens": 600, "completion_tokens": 16, "total_tokens": 616}
        await ex.answer(200, "application/json", json.dumps({"usage": usage}).encode())
    finally:
        await ex.close()
    await until(lambda: b.router.replica_load(replica).in_flight == 0)
    assert a.router.replica_load(replica).in_flight == 0
    others = [ReplicaId(u) for u in a.router.replicas if u != replica]
    assert all(b.router.replica_load(r).in_flight == 0 for r in others)


async def test_a_gateway_and_a_picker_on_one_channel_share_the_conversation(
    redis_server: RedisServer,  # first: up until every picker and gateway has stopped
    make_picker: PickerFactory,
    cluster: EmulatedCluster,
    session: aiohttp.ClientSession,
) -> None:
    epp = await make_picker(redis_server.url)
    config = dataclasses.replace(
        FAST_GATEWAY, replicas=tuple(cluster.urls), policy=DEFAULT_POLICY,
        sync_redis=redis_server.url, **STEADY,
    )  # fmt: skip
    async with Gateway(config) as gw:
        await connected(epp)
        for _ in range(1000):  # the gateway subscribed too (its /metrics says so)
            async with session.get(gw.url + "/metrics") as resp:
                if "\nprefixroute_sync_connected 1.0" in await resp.text():
                    break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("the gateway never subscribed")
        first = {"model": "emulated", "prompt": "shared prefix " * 150, "max_tokens": 4}
        async with session.post(gw.url + "/v1/completions", json=first) as resp:
            assert resp.status == 200
            home = resp.headers["x-prefixroute-replica"]
        # the user's think time: the decision and the first answer's end have both arrived
        await until(lambda: applied(epp) == 1 and settled(epp))
        second = {**first, "prompt": first["prompt"] + "and a follow-up " * 20}
        passed = await through(epp, session, "/v1/completions", second)
    assert replica_of(passed.endpoint) == replica_of(home)
    assert passed.predicted > 0 and passed.cached > 0


def test_sync_settings_from_flags_and_the_config_file(tmp_path: Path) -> None:
    from prefixroute.commands.epp import add_parser, config_from_args

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    toml = tmp_path / "epp.toml"
    toml.write_text('sync_redis = "redis://file:6379/0"\nsync_channel = "pickers"\n')
    args = parser.parse_args(["epp", "--endpoint", "10.0.0.1:8000", "--config", str(toml)])
    routing = config_from_args(args).routing
    assert (routing.sync_redis, routing.sync_channel, routing.sync_history) == (
        "redis://file:6379/0", "pickers", 4096,
    )  # fmt: skip
    args = parser.parse_args(
        ["epp", "--config", str(toml), "--sync-redis", "redis://flag:1/0", "--sync-history", "7"]
    )
    routing = config_from_args(args).routing
    assert (routing.sync_redis, routing.sync_channel, routing.sync_history) == (
        "redis://flag:1/0", "pickers", 7,
    )  # fmt: skip
    assert EndpointPicker(EppConfig(routing)).sync is not None
    assert EndpointPicker(EppConfig()).sync is None


async def test_a_stream_tells_the_sync_its_decision_first_token_and_end_once() -> None:
    from .support import pick, response_body, response_headers, shared

    s = shared()
    s.state.sync = recorder = Heard()  # type: ignore[assignment]
    stream = PickStream(s)
    body = {"model": "m", "prompt": "w " * 100, "max_tokens": 4, "stream": True}
    await pick(stream, json.dumps(body).encode())
    assert recorder.heard == [("routed", stream.rid)]
    await stream.handle(response_headers(content_type="text/event-stream"))
    await stream.handle(response_body(b'data: {"choices":[{"text":"a"}]}\n\n'))
    await stream.handle(response_body(b'data: {"choices":[{"text":"b"}]}\n\n'))
    assert recorder.heard[1:] == [("first_token", stream.rid)]
    await stream.handle(response_body(b"data: [DONE]\n\n", end_of_stream=True))
    stream.close()
    assert recorder.heard[2:] == [("completed", stream.rid)]

    cut = PickStream(s)  # a stream cut before its answer ends at close, once
    await pick(cut, json.dumps(body).encode())
    cut.close()
    cut.close()
    assert recorder.heard[3:] == [("routed", cut.rid), ("completed", cut.rid)]

    refused = PickStream(s)  # nothing routed: nothing to tell
    await pick(refused, b"{not json")
    refused.close()
    assert len(recorder.heard) == 5

    full = PickStream(s)  # turned away (a 429): withdrawn, then ended, at the others too
    await pick(full, json.dumps(body).encode())
    await full.handle(response_headers(429, "application/json", end_of_stream=True))
    assert recorder.heard[5:] == [("routed", full.rid), ("withdrawn", full.rid),
                                  ("completed", full.rid)]  # fmt: skip
