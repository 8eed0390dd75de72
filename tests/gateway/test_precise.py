"""Precise mode end to end: emulated replicas publish KV events; the gateway follows them.

Each replica publishes its cache changes in vLLM's wire format; the gateway subscribes (in either
direction), keys requests by the replicas' own token ids (``EmulatedTokenizer``) and routes on what
the events say. Emulated replicas hash blocks with another seed than the gateway, so nothing
depends on the engine's hashes, only on the token ids the events carry.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from polling import until

from prefixroute.core import ConfigError, ReplicaId
from prefixroute.emulate import EmulatedReplica, EmulatedTokenizer, EmulatorConfig
from prefixroute.gateway import Gateway, GatewayConfig, load_toml
from prefixroute.sim.replica import ReplicaConfig

from .helpers import (
    TURNS,
    ClusterFactory,
    GatewayFactory,
    Reply,
    article_chat,
    chat_turn,
    reset_until_live,
    send,
)

BS = 16  # the replicas' KV block size, tokens


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def replica_config(**kw: Any) -> EmulatorConfig:
    engine = ReplicaConfig(block_size=BS, kv_capacity_blocks=4096)
    return EmulatorConfig(engine, time_scale=kw.pop("time_scale", 0.01), hash_seed=777, **kw)


async def precise_cluster(
    make_cluster: ClusterFactory,
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
    n: int,
    gateway_binds: bool,
    time_scale: float = 0.01,
    positional: bool = False,
    **settings: Any,
) -> tuple[list[EmulatedReplica], Gateway]:
    """``n`` replicas and a precise gateway whose event streams are connected and in step;
    ``positional``: the replicas send each event as an array, as SGLang does."""
    if gateway_binds:  # the replicas connect to ports the gateway binds
        ports = [free_port() for _ in range(n)]
        replicas = []
        for p in ports:
            config = replica_config(
                kv_events=f"connect:tcp://127.0.0.1:{p}",
                time_scale=time_scale,
                kv_events_positional=positional,
            )
            replicas += (await make_cluster(1, config)).replicas
        specs = [f"{r.url}=bind:tcp://127.0.0.1:{p}" for r, p in zip(replicas, ports, strict=True)]
    else:  # the replicas bind; the gateway connects
        config = replica_config(
            kv_events="bind:tcp://127.0.0.1:*",
            time_scale=time_scale,
            kv_events_positional=positional,
        )
        replicas = (await make_cluster(n, config)).replicas
        specs = [f"{r.url}=connect:{r.kv_events_address}" for r in replicas]
    gw = await make_gateway(
        [r.url for r in replicas],
        kv_events=tuple(specs),
        kv_block_size=BS,
        tokenizer_object=EmulatedTokenizer(),
        **settings,
    )
    await reset_until_live(session, (r.url for r in replicas), lambda rid: [gw.event_streams[rid]])
    return replicas, gw


def batches(gw: Gateway) -> int:
    return sum(s.stats.batches for s in gw.event_streams.values())


async def heard_conversation(
    session: aiohttp.ClientSession, gws: Sequence[Gateway]
) -> tuple[list[Reply], list[dict[str, str]]]:
    """The article's conversation as chat, turn ``i`` through ``gws[i % len(gws)]`` (round
    robin), each turn answered whole and heard by every one of ``gws`` (the replicas' events
    for its blocks came) before the next. Returns the replies and the history."""

    async def turn(i: int, body: dict[str, Any]) -> tuple[Reply, str]:
        before = [batches(gw) for gw in gws]
        answered = await chat_turn(session, gws[i % len(gws)].url, body)
        for g, b in zip(gws, before, strict=True):  # every gateway hears the turn's blocks
            await until(lambda g=g, b=b: batches(g) > b)
        return answered

    return await article_chat(turn)


@pytest.mark.parametrize("gateway_binds", [False, True], ids=["replicas-bind", "gateway-binds"])
async def test_the_conversation_follows_the_engines_events(
    make_cluster: ClusterFactory,
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
    gateway_binds: bool,
) -> None:
    """Speculative entries live 1 ms here, so every match comes from the replicas' events: the
    predicted cached tokens equal what the replicas then report, turn after turn."""
    _, gw = await precise_cluster(
        make_cluster, make_gateway, session, 3, gateway_binds, speculative_ttl_s=0.001
    )
    replies, _ = await heard_conversation(session, [gw])
    assert len({r.headers["x-prefixroute-replica"] for r in replies}) == 1
    cached = [r.usage["prompt_tokens_details"]["cached_tokens"] for r in replies if r.usage]
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])
    predicted = [int(r.headers["x-prefixroute-predicted-cached-tokens"]) for r in replies]
    assert predicted == cached
    text = await metrics(session, gw.url)
    assert metric(text, "prefixroute_cache_predictions_total", outcome="exact") == len(TURNS)
    assert metric(text, "prefixroute_predicted_cached_tokens_total") == sum(cached)
    assert metric(text, "prefixroute_actual_cached_tokens_total") == sum(cached)
    assert metric(text, "prefixroute_kv_event_gaps_total") == 0
    assert metric(text, "prefixroute_kv_events_total", type="BlockStored") >= len(TURNS)
    assert metric(text, "prefixroute_tokenize_seconds_count") == len(TURNS)
    assert gw.router.index.entries > 0
    assert gw.router.speculative is not None


async def test_an_engine_that_sends_events_as_arrays_is_followed_as_well(
    make_cluster: ClusterFactory,
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
) -> None:
    """SGLang (and vLLM before its events became maps) sends each event as an array: the
    gateway reads those streams as it reads vLLM's, so predictions still equal what the
    replicas report."""
    _, gw = await precise_cluster(
        make_cluster, make_gateway, session, 3, False, positional=True, speculative_ttl_s=0.001
    )
    replies, _ = await heard_conversation(session, [gw])
    assert len({r.headers["x-prefixroute-replica"] for r in replies}) == 1
    cached = [r.usage["prompt_tokens_details"]["cached_tokens"] for r in replies if r.usage]
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])
    assert [int(r.headers["x-prefixroute-predicted-cached-tokens"]) for r in replies] == cached
    text = await metrics(session, gw.url)
    assert metric(text, "prefixroute_kv_event_decode_errors_total") == 0
    assert metric(text, "prefixroute_kv_event_unknown_total") == 0


async def test_a_burst_sharing_a_prefix_lands_on_one_replica_before_any_event(
    make_cluster: ClusterFactory,
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
) -> None:
    """Real time (prefill takes ~0.1 s), so the burst is routed before the first events come
    back: only the speculative entries keep it together. With them off, it scatters."""
    system = " ".join(f"sys{i}" for i in range(1000))

    async def burst(ttl: float) -> set[str]:
        _, gw = await precise_cluster(
            make_cluster, make_gateway, session, 3, False, time_scale=1.0,
            policy="prefix_affinity", speculative_ttl_s=ttl,
        )  # fmt: skip
        before = batches(gw)
        bodies = [
            {"model": "emulated", "prompt": f"{system} user{u} asks", "max_tokens": 1}
            for u in range(8)
        ]
        replies = await asyncio.gather(
            *(send(session, gw.url, "/v1/completions", b) for b in bodies)
        )
        await until(lambda: batches(gw) > before)  # the events do come, after the routing
        assert all(r.complete for r in replies)
        return {r.headers["x-prefixroute-replica"] for r in replies}

    assert len(await burst(ttl=2.0)) == 1
    assert len(await burst(ttl=1e-6)) > 1


async def test_precise_mode_needs_a_tokenizer_and_known_replicas() -> None:
    url = "http://127.0.0.1:9"
    spec = f"{url}=connect:tcp://127.0.0.1:9"
    with pytest.raises(ConfigError, match="tokenizer"):
        Gateway(GatewayConfig(replicas=(url,), kv_events=(spec,)))
    with pytest.raises(ConfigError, match="not a configured replica"):
        Gateway(
            GatewayConfig(replicas=(url,), kv_events=("http://other:1=bind:tcp://127.0.0.1:*",)),
            tokenizer=EmulatedTokenizer(),
        )
    with pytest.raises(ConfigError):
        GatewayConfig(replicas=(url,), kv_events=("no-equals-sign",))
    with pytest.raises(ConfigError):
        GatewayConfig(replicas=(url,), kv_events=(f"{url}=listen:tcp://x:1",))
    with pytest.raises(ConfigError):
        GatewayConfig(speculative_ttl_s=0)


async def metrics(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/metrics") as resp:
        return await resp.text()


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``.

    Fails when no sample matches: a metric that was renamed or never exported must not read as
    0 and pass every ``== 0`` check.
    """
    total = 0.0
    found = False
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        series, _, label_text = head.partition("{")
        if series != name:
            continue
        if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            total += float(value)
            found = True
    assert found, f"no sample of {name} with labels {labels} in /metrics"
    return total


def unset(text: str, family: str) -> bool:
    """True when the labelled metric ``family`` is exported but has no sample yet (a labelled
    counter shows no series until a label set is first counted). False when it is not
    exported at all, so a renamed family fails the check instead of passing it."""
    types = (f"# TYPE {family} ", f"# TYPE {family}_total ")
    declared = any(line.startswith(types) for line in text.splitlines())
    assert declared, f"{family} is not exported in /metrics"
    series = (f"{family}{{", f"{family}_total{{")
    return not any(line.startswith(series) for line in text.splitlines())


def test_precise_settings_from_toml_and_flags(tmp_path: Path) -> None:
    import argparse

    from prefixroute.commands.serve import add_parser, config_from_args

    path = tmp_path / "gw.toml"
    path.write_text(
        'replicas = ["http://a:1", "http://b:1"]\n'
        'tokenizer = "/models/m"\n'
        "kv_block_size = 32\n"
        'kv_events = ["http://a:1=bind:tcp://0.0.0.0:5601"]\n'
    )
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(
        [
            "serve", "--config", str(path), "--speculative-ttl", "0.5",
            "--kv-events", "http://b:1=connect:tcp://b:5602,replay=tcp://b:5702",
        ]
    )  # fmt: skip
    config = config_from_args(args)
    assert config.precise and config.tokenizer == "/models/m" and config.kv_block_size == 32
    assert config.speculative_ttl_s == 0.5
    endpoints = config.kv_event_endpoints()
    assert list(endpoints) == ["http://a:1", "http://b:1"]
    assert endpoints["http://b:1"].replay == "tcp://b:5702"
    assert load_toml(path)["kv_events"] == ("http://a:1=bind:tcp://0.0.0.0:5601",)


async def test_a_template_follows_each_replica_however_it_joins(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """``kv_events_each``: every replica publishes on one port of its own host, as vLLM's
    default (``tcp://*:5557``) does on each pod; here three loopback addresses. The gateway
    follows the two it starts with and a third added through the admin API, and stops
    following one removed through it."""
    port = free_port()
    replicas = []
    for host in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
        config = dataclasses.replace(
            replica_config(kv_events=f"bind:tcp://{host}:{port}"), host=host
        )
        replicas += (await make_cluster(1, config)).replicas
    first, second, later = (r.url for r in replicas)
    token = "s3cret-admin-token"
    auth = {"Authorization": f"Bearer {token}"}
    gw = await make_gateway(
        [first, second], kv_events_each=f"connect:tcp://{{host}}:{port}", admin_token=token,
        kv_block_size=BS, tokenizer_object=EmulatedTokenizer(),
    )  # fmt: skip
    assert {str(gw.event_streams[ReplicaId(u)].endpoint) for u in (first, second)} == {
        f"connect:tcp://127.0.0.2:{port}", f"connect:tcp://127.0.0.3:{port}"
    }  # fmt: skip
    async with session.post(gw.url + "/admin/replicas", json={"url": later}, headers=auth) as resp:
        assert resp.status == 201
    assert str(gw.event_streams[ReplicaId(later)].endpoint) == f"connect:tcp://127.0.0.4:{port}"
    await reset_until_live(session, (first, second, later), lambda rid: [gw.event_streams[rid]])
    async with session.delete(
        gw.url + "/admin/replicas/" + quote(second, safe=""), headers=auth
    ) as resp:
        assert resp.status == 200
    assert ReplicaId(second) not in gw.event_streams
    assert set(gw.event_streams) == {ReplicaId(first), ReplicaId(later)}


def test_a_template_that_names_no_host_is_refused() -> None:
    with pytest.raises(ConfigError, match="names no \\{host\\}"):
        GatewayConfig(kv_events_each="connect:tcp://10.0.0.1:5557")
    with pytest.raises(ConfigError):
        GatewayConfig(kv_events_each="tcp://{host}:5557")  # neither bind: nor connect:


async def test_a_template_follows_a_replica_at_an_ipv6_address(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """A pod network may be IPv6: ``{host}`` becomes ``[::1]``, and both ends turn on ZMQ's
    IPv6 option, which is off by default (a bracketed address is refused without it)."""
    port = free_port()
    config = dataclasses.replace(replica_config(kv_events=f"bind:tcp://[::1]:{port}"), host="::1")
    replica = (await make_cluster(1, config)).replicas[0]
    assert replica.url.startswith("http://[::1]:")
    gw = await make_gateway(
        [replica.url], kv_events_each=f"connect:tcp://{{host}}:{port}", kv_block_size=BS,
        tokenizer_object=EmulatedTokenizer(),
    )  # fmt: skip
    assert str(gw.event_streams[ReplicaId(replica.url)].endpoint) == f"connect:tcp://[::1]:{port}"
    await reset_until_live(session, [replica.url], lambda rid: [gw.event_streams[rid]])


async def test_two_replicas_that_would_follow_one_stream_are_refused(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """Two replicas on one host and a template of one port (data-parallel ranks behind their
    own URLs, say): both streams would read rank 0's events, each replica taking the other's
    blocks for its own, with no word (an outside audit, 2026-12-07). Refused at start, and a
    replica that joins later onto a stream already followed is served without one."""
    port = free_port()
    template = f"connect:tcp://{{host}}:{port}"
    with pytest.raises(ConfigError, match="would follow the same KV-event stream"):
        await make_gateway(["http://127.0.0.5:8000", "http://127.0.0.5:8001"],
                           kv_events_each=template, kv_block_size=BS,
                           tokenizer_object=EmulatedTokenizer())  # fmt: skip
    token = "s3cret-admin-token"
    gw = await make_gateway(["http://127.0.0.5:8000"], kv_events_each=template, kv_block_size=BS,
                            tokenizer_object=EmulatedTokenizer(), admin_token=token)  # fmt: skip
    auth = {"Authorization": f"Bearer {token}"}
    async with session.post(
        gw.url + "/admin/replicas", json={"url": "http://127.0.0.5:8001"}, headers=auth
    ) as resp:
        assert resp.status == 201
    assert set(gw.event_streams) == {ReplicaId("http://127.0.0.5:8000")}
