from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest

from prefixroute.cli import build_parser
from prefixroute.commands.emulate import config_from_args
from prefixroute.core import ConfigError
from prefixroute.emulate import EmulatedCluster, EmulatedReplica, EmulatorConfig, start_replicas


async def test_cluster_starts_on_distinct_ports_and_stops() -> None:
    cluster = await start_replicas(3, EmulatorConfig(time_scale=0.01))
    urls = cluster.urls
    assert len(set(urls)) == 3 and all(u.startswith("http://127.0.0.1:") for u in urls)
    await cluster.stop()
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientConnectorError):
            await s.get(urls[0] + "/health")


async def test_kill_resets_open_connections() -> None:
    replica = EmulatedReplica(EmulatorConfig(time_scale=1.0))
    await replica.start()
    async with aiohttp.ClientSession() as s:
        resp = await s.post(
            replica.url + "/v1/completions", json={"prompt": "a", "max_tokens": 500, "stream": True}
        )
        try:
            await resp.content.readuntil(b"\n\n")
            await replica.kill()
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.content.read()
        finally:
            resp.close()
        assert not replica.running


REQUEST = (
    b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
    b'Content-Length: 29\r\n\r\n{"prompt":"a","max_tokens":1}'
)


async def test_a_request_arriving_as_the_replica_is_killed_gets_no_answer() -> None:
    """kill() is a crash: nothing is answered from then on. A connection made just before it,
    whose request is read while the kill runs, was answered 503 (the stopped engine's error,
    which a proxy passes on instead of retrying elsewhere), at 3 loop iterations between the
    connection and the kill on 2026-12-01; at 2, the connection was left open, never answered
    (a client waited for its timeout). Every gap from 0 to 7 iterations is tried: the client
    must see its connection reset or ended, never an HTTP answer, and never wait."""
    answers = []
    for gap in range(8):
        replica = EmulatedReplica(EmulatorConfig(time_scale=0.01))
        await replica.start()
        port = int(replica.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(REQUEST)
            for _ in range(gap):
                await asyncio.sleep(0)
            await replica.kill()
            sock.settimeout(5)  # a crashed replica's connections end; they do not hang
            try:
                answers.append((gap, sock.recv(64)))
            except ConnectionResetError:
                answers.append((gap, b""))
    assert answers == [(gap, b"") for gap in range(8)]


def test_bad_settings() -> None:
    with pytest.raises(ConfigError):
        EmulatorConfig(time_scale=0)
    with pytest.raises(ConfigError):
        EmulatedCluster(0)
    with pytest.raises(ConfigError):
        _ = EmulatedReplica().url  # not started


def test_command_line_mirrors_the_replica_config() -> None:
    args = build_parser().parse_args(
        ["emulate", "--kv-blocks", "100", "--block-size", "4", "--time-scale", "0.5",
         "--model", "m", "--port", "0", "--prefill-rate", "5000", "--decode-step", "0.01",
         "--step-tokens", "512", "--max-running", "8"]
    )  # fmt: skip
    cfg = config_from_args(args)
    assert (cfg.model, cfg.time_scale, cfg.port) == ("m", 0.5, 0)
    e = cfg.engine
    assert (e.kv_capacity_blocks, e.block_size, e.step_tokens, e.max_running) == (100, 4, 512, 8)
    assert (e.prefill_tokens_per_s, e.decode_step_s) == (5000, 0.01)
