"""Several gateway instances behind a round-robin balancer: cache hit rate and TTFT with and
without sharing decisions through Redis (``--sync-redis``). About three minutes.

``.venv/bin/python benchmarks/multi_instance.py [--precise] [--seed N] [--sessions N]``

Setup, all on 127.0.0.1: four emulated replicas; one or three gateways in front of them (the
default policy and settings, seed included, as a user would deploy identical instances); and in
front of those a minimal round-robin HTTP balancer that sends each request to the next instance
in turn, as nginx's default upstream or a Kubernetes Service (without session affinity) would.
Consecutive turns of a conversation therefore reach different instances. The client is the
``prefixroute bench`` replayer on the multi-turn workload, pointed at the balancer in every row,
so each row pays the same extra hop.

``--precise``: the engines publish KV events and every instance follows all of them, with the
emulated replicas' tokenizer on the gateways (token-exact keys); the rows are one instance, three
without Redis and three with it (speculative entries and load shared). Otherwise the sharing
rows run with and without counting the other instances' requests in each load view
(``RouteSync.share_load``), so the last two rows say what sharing load adds to sharing index
entries. Hit rate = cached prompt tokens / prompt tokens, both as the emulated replicas report
them in each response's usage. TTFT is the replayer's, through the front and the gateways, in
workload time (the emulated replicas run at ``--time-scale``). The baseline is one instance
behind the same balancer. The sharing rows need ``redis-server`` on the PATH (started here on a
free port, no persistence).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import math
import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass

import aiohttp
import numpy as np
from aiohttp import web

from prefixroute.bench import ReplayConfig, replay
from prefixroute.core import ReplicaId
from prefixroute.emulate import EmulatedTokenizer, EmulatorConfig, start_replicas
from prefixroute.events import StreamState
from prefixroute.gateway import Gateway, GatewayConfig
from prefixroute.sim import ReplicaConfig, Workload, make_workload
from prefixroute.sync import RouteSync

REPLICAS = 4
KV_TOKENS = 131_072  # per emulated replica, as `prefixroute bench`


class RoundRobinFront:
    """A balancer with no affinity: request i goes to upstream i mod n; bodies stream through."""

    def __init__(self, upstreams: list[str]) -> None:
        self.upstreams = itertools.cycle(upstreams)
        self.session: aiohttp.ClientSession | None = None
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
        )
        app = web.Application()
        app.router.add_post("/v1/{tail:.+}", self.forward)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def forward(self, request: web.Request) -> web.StreamResponse:
        assert self.session is not None
        body = await request.read()
        upstream = next(self.upstreams) + request.path
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with self.session.post(upstream, data=body, headers=headers) as resp:
            out = web.StreamResponse(status=resp.status)
            for name, value in resp.headers.items():
                if name.lower().startswith("x-prefixroute") or name.lower() == "content-type":
                    out.headers[name] = value
            await out.prepare(request)
            async for chunk in resp.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        if self.session is not None:
            await self.session.close()


class RedisProcess:
    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server not found (Debian: apt-get install -y redis-server)")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.dir = tempfile.TemporaryDirectory()
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir.name],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.dir.cleanup()


async def sync_connected(url: str) -> bool:
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
        return "prefixroute_sync_connected 1.0" in await resp.text()


async def events_live(urls: list[str], gateways: list[Gateway]) -> None:
    """Reset each replica until every instance's stream from it is live (connected, in step)."""
    async with aiohttp.ClientSession() as http:
        for url in urls:
            rid = ReplicaId(url)
            while any(gw.event_streams[rid].state is not StreamState.LIVE for gw in gateways):
                async with http.post(url + "/reset_prefix_cache") as resp:
                    await resp.read()
                await asyncio.sleep(0.01)


@dataclass(frozen=True, slots=True)
class Row:
    hit_rate: float  # cached / prompt tokens, as the replicas reported them
    ttft_p50_ms: float  # workload milliseconds (wall time / time scale)
    ttft_p99_ms: float
    requests: int
    errors: int


async def run_row(
    workload: Workload, instances: int, sync: str | None, time_scale: float, precise: bool
) -> Row:
    """One setup: ``instances`` gateways behind the round-robin front."""
    bs = workload.block_size
    engine = ReplicaConfig(kv_capacity_blocks=KV_TOKENS // bs, block_size=bs)
    events = "bind:tcp://127.0.0.1:*" if precise else None  # each engine binds its publisher
    async with AsyncExitStack() as stack:
        cluster = await start_replicas(
            REPLICAS, EmulatorConfig(engine, time_scale=time_scale, kv_events=events)
        )
        stack.push_async_callback(cluster.stop)
        gateways = []
        for _ in range(instances):
            cfg = GatewayConfig(port=0, replicas=tuple(cluster.urls), sync_redis=sync)
            tokenizer = None
            if precise:  # every instance connects to every engine's events
                specs = tuple(f"{r.url}=connect:{r.kv_events_address}" for r in cluster.replicas)
                cfg = dataclasses.replace(cfg, kv_events=specs, kv_block_size=bs)
                tokenizer = EmulatedTokenizer()
            gateways.append(await stack.enter_async_context(Gateway(cfg, tokenizer=tokenizer)))
        if sync is not None:  # every instance subscribed before the first request
            while not all([await sync_connected(gw.url) for gw in gateways]):
                await asyncio.sleep(0.01)
        if precise:
            await events_live(cluster.urls, gateways)
        front = RoundRobinFront([gw.url for gw in gateways])
        await front.start()
        stack.push_async_callback(front.stop)
        result = await replay(workload, ReplayConfig(front.url, time_scale=time_scale), "row")
    records = result.run.records
    done = [r for r in records if r.finish_s is not None]
    prompt = sum(r.prompt_tokens for r in done)
    cached = sum(r.cached_tokens for r in done)
    ttft = [r.ttft_s for r in done if r.ttft_s is not None]
    p50, p99 = np.percentile(np.asarray(ttft) * 1000.0, [50, 99]) if ttft else (math.nan,) * 2
    return Row(cached / max(1, prompt), float(p50), float(p99), len(records), len(result.errors))


async def main_async(args: argparse.Namespace) -> None:
    overrides = {"sessions": str(args.sessions), "think_mean_s": str(args.think_s)}
    workload = make_workload("multi-turn", args.seed, overrides)
    redis = RedisProcess()
    try:
        if args.precise:  # the index from the engines' events; Redis adds speculative + load
            rows = [
                ("1 instance, precise (baseline)", 1, None, True),
                ("3 instances, precise, no Redis", 3, None, True),
                ("3 instances, precise, Redis (speculative entries and load)", 3, redis.url, True),
            ]
        else:
            rows = [
                ("1 instance (baseline)", 1, None, True),
                ("3 instances, no sharing", 3, None, True),
                ("3 instances, Redis sharing of index entries only", 3, redis.url, False),
                ("3 instances, Redis sharing (index and load)", 3, redis.url, True),
            ]
        mode = "precise mode" if args.precise else "approximate mode"
        print(f"multi-turn: {workload.num_requests} requests in {args.sessions} conversations, "
              f"{REPLICAS} emulated replicas, time scale {args.time_scale}, {mode}")  # fmt: skip
        print("| setup | hit rate | vs 1 instance (points) | TTFT p50 ms | TTFT p99 ms "
              "| requests | errors | wall s |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")
        base: float | None = None
        for label, n, sync, share_load in rows:
            t = time.perf_counter()
            RouteSync.share_load = share_load  # the ablation: the same sync, load not counted
            row = await run_row(workload, n, sync, args.time_scale, args.precise)
            base = row.hit_rate if base is None else base
            print(f"| {label} | {row.hit_rate:.1%} | {(row.hit_rate - base) * 100:+.1f} | "
                  f"{row.ttft_p50_ms:.0f} | {row.ttft_p99_ms:.0f} | {row.requests} | "
                  f"{row.errors} | {time.perf_counter() - t:.0f} |", flush=True)  # fmt: skip
    finally:
        redis.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=120, help="conversations (default 120)")
    p.add_argument("--think-s", type=float, default=5.0, help="mean think time, workload s")
    p.add_argument("--time-scale", type=float, default=0.2, help="wall s per workload s")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--precise", action="store_true", help="precise mode: engines publish KV events"
    )
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
