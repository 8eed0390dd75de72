"""Precise mode in the picker: emulated replicas publish KV events, the picker follows them.

The same settings as ``serve`` (``kv_events``, ``tokenizer``, ``kv_block_size``,
``speculative_ttl_s``) and the same wiring: the picker keys requests on the replicas' token ids
(``EmulatedTokenizer``), and the router's index holds only what the events report. Envoy is
played over gRPC (``grpc_envoy``); each picked request really goes to the replica.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from gateway.helpers import FAST_GATEWAY, STEADY, TURNS, article_chat, reset_until_live
from gateway.test_precise import BS, free_port, replica_config
from polling import until

from prefixroute.cli import build_parser
from prefixroute.commands.epp import config_from_args
from prefixroute.core import ConfigError, ReplicaId
from prefixroute.emulate import EmulatedCluster, EmulatedTokenizer, start_replicas
from prefixroute.epp import EndpointPicker, EppConfig

from .conftest import PickerStarter
from .grpc_envoy import Passed, through

CHAT = "/v1/chat/completions"


@pytest.fixture
async def publishing() -> AsyncIterator[EmulatedCluster]:
    """Three emulated replicas that bind and publish their KV events."""
    c = await start_replicas(3, replica_config(kv_events="bind:tcp://127.0.0.1:*"))
    yield c
    await c.stop()


def batches(epp: EndpointPicker) -> int:
    return sum(s.stats.batches for s in epp.event_streams.values())


def total(epp: EndpointPicker, name: str, **labels: str) -> float:
    """The sum over replicas of the picker's own /metrics family ``name`` with ``labels``;
    fails when no sample matches (a renamed or unexported metric must not read as 0)."""
    found = [
        s.value
        for family in epp.metrics.registry.collect()
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert found, f"no sample of {name} {labels}"
    return sum(found)


async def precise_picker(
    cluster: EmulatedCluster,
    start_picker: PickerStarter,
    session: aiohttp.ClientSession,
    **settings: Any,
) -> EndpointPicker:
    """A precise picker whose event streams are connected and in step with the replicas."""
    specs = tuple(f"{r.url}=connect:{r.kv_events_address}" for r in cluster.replicas)
    routing = dataclasses.replace(
        FAST_GATEWAY, replicas=tuple(cluster.urls), kv_events=specs, kv_block_size=BS,
        **{**STEADY, **settings},
    )  # fmt: skip
    epp = await start_picker(EppConfig(routing, grpc_port=0, http_port=None), EmulatedTokenizer())
    await reset_until_live(session, cluster.urls, lambda rid: [epp.event_streams[rid]])
    return epp


async def test_the_conversation_follows_the_engines_events(
    publishing: EmulatedCluster, start_picker: PickerStarter, session: aiohttp.ClientSession
) -> None:
    """Speculative entries live 1 ms, so every match comes from the replicas' events: the
    predicted cached tokens equal what the replicas then report, turn after turn."""
    epp = await precise_picker(publishing, start_picker, session, speculative_ttl_s=0.001)

    async def turn(_: int, body: dict[str, Any]) -> tuple[Passed, str]:
        before = batches(epp)
        reply = await through(epp, session, CHAT, body)
        await until(lambda: batches(epp) > before)  # the turn's blocks are reported
        return reply, reply.body["choices"][0]["message"]["content"]

    passed, _ = await article_chat(turn)
    assert len({p.endpoint for p in passed}) == 1
    cached = [p.cached for p in passed]
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])
    assert [p.predicted for p in passed] == cached
    assert total(epp, "prefixroute_kv_events_total", type="BlockStored") >= len(TURNS)
    assert total(epp, "prefixroute_kv_event_gaps_total") == 0
    assert total(epp, "prefixroute_tokenize_seconds_count") == len(TURNS)
    assert epp.router.speculative is not None and not epp.router.insert_on_route


async def test_precise_mode_needs_a_tokenizer() -> None:
    routing = dataclasses.replace(
        FAST_GATEWAY,
        replicas=("http://127.0.0.1:9",),
        kv_events=("http://127.0.0.1:9=connect:tcp://127.0.0.1:9",),
    )
    with pytest.raises(ConfigError, match="tokenizer"):
        EndpointPicker(EppConfig(routing))


def test_precise_settings_are_serves_flags() -> None:
    args = build_parser().parse_args([
        "epp", "--endpoint", "10.0.0.1:8000", "--tokenizer", "/models/tok",
        "--kv-events", "http://10.0.0.1:8000=connect:tcp://10.0.0.1:5557",
        "--kv-block-size", "32", "--speculative-ttl", "0.5", "--fallbacks", "2",
    ])  # fmt: skip
    config = config_from_args(args)
    assert config.routing.precise and config.routing.tokenizer == "/models/tok"
    assert config.routing.kv_block_size == 32 and config.routing.speculative_ttl_s == 0.5
    assert config.fallbacks == 2


async def test_discovered_endpoints_are_followed_by_the_template(
    start_picker: PickerStarter, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """``--kv-events-each``: endpoints the file brings later get their event stream as they
    join, and lose it as they leave (as pods would: one port, each on its own address)."""
    port = free_port()
    cluster = []
    for host in ("127.0.0.2", "127.0.0.3"):
        config = replica_config(kv_events=f"bind:tcp://{host}:{port}")
        cluster.append(await start_replicas(1, dataclasses.replace(config, host=host)))
    try:
        first, later = (c.urls[0] for c in cluster)
        listed = tmp_path / "endpoints"
        listed.write_text(first.removeprefix("http://") + "\n")
        routing = dataclasses.replace(
            FAST_GATEWAY, kv_events_each=f"connect:tcp://{{host}}:{port}", kv_block_size=BS
        )
        config = EppConfig(routing, grpc_port=0, http_port=None, endpoints_file=str(listed))
        epp = await start_picker(config, EmulatedTokenizer())
        assert set(epp.event_streams) == {ReplicaId(first)}
        listed.write_text(first.removeprefix("http://") + "\n" + later.removeprefix("http://"))
        os.utime(listed, (1, 1))  # a new mtime, however coarse the clock
        await until(lambda: ReplicaId(later) in epp.event_streams, timeout_s=5)
        await reset_until_live(session, [first, later], lambda rid: [epp.event_streams[rid]])
        listed.write_text(later.removeprefix("http://") + "\n")
        os.utime(listed, (2, 2))
        await until(lambda: set(epp.event_streams) == {ReplicaId(later)}, timeout_s=5)
    finally:
        for c in cluster:
            await c.stop()
