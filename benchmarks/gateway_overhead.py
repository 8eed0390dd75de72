"""Gateway overhead: the same client, in the same run, against one replica directly and through
the gateway. Run: ``.venv/bin/python benchmarks/gateway_overhead.py`` (about a minute).

Setup: one emulated replica with near-zero prefill and decode time (so the replica itself adds
almost nothing), and the gateway in front of it, each in its own process on uvloop, as they run
in production (``prefixroute emulate`` / ``prefixroute serve``). The emulated replica's steps
are timer events, which end on the event loop's millisecond ticks: at concurrency 1 its answers
come about 1 ms after the request whether it arrived directly or 0.3 ms later through the
gateway, so the added latency hides in that wait. The concurrency-1 rounds are therefore also
run against an *instant* replica (this file, ``--instant-replica PORT``: canned vLLM-shaped
answers, no timers) with a second gateway in front of it; those rows measure what the gateway
adds, and are what the concurrency-1 targets are read from. The client runs in this process
and sends the same requests to both, alternating direct and gateway rounds so that drift hits
both alike. Prompts are ~1,000 characters with a shared head, so the router hashes and matches.

Printed per mode (plain JSON / SSE stream) and concurrency (1 and 32): end-to-end latency
p50/p99 and first-byte latency p50/p99 for direct and gateway, the added milliseconds and the
ratio, and requests per second with the gateway/direct ratio. Issue 3's targets: at
concurrency 1, p50 added under 0.5 ms and p99 added under 2 ms; first streamed byte not delayed.
At concurrency 32 one client process may be the bottleneck; the direct run shows its ceiling.

On Linux it also prints the CPU time each server process spent per request (from /proc): a
figure that does not depend on how many cores the machine has. A proxy does a server's and a
client's work per request, so about twice the replica's HTTP handling is the floor to expect.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from _procs import pct, spawn, stop_all, timed, wait_ready

from prefixroute.gateway import run_on_uvloop

ROUNDS = 4  # alternating direct / gateway rounds per configuration
REQUESTS = {1: 400, 32: 1600}  # requests per round, by concurrency
OUTPUT_TOKENS = 8
HEAD = " ".join(f"shared{i}" for i in range(60))  # ~500 characters every prompt starts with


@dataclass
class Samples:
    latency: list[float] = field(default_factory=list)  # end to end, seconds
    first_byte: list[float] = field(default_factory=list)  # first body chunk, seconds
    elapsed: float = 0.0  # wall time of all rounds, seconds
    count: int = 0
    cpu_s: float = 0.0  # CPU of the process that answered the client (replica or gateway), s

    @property
    def rps(self) -> float:
        return self.count / self.elapsed if self.elapsed else 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _one(
    session: aiohttp.ClientSession, url: str, i: int, stream: bool, out: Samples
) -> None:
    body = {
        "model": "emulated",
        "prompt": f"{HEAD} request {i} " + " ".join(f"u{i}x{k}" for k in range(50)),
        "max_tokens": OUTPUT_TOKENS,
        "stream": stream,
    }
    t0 = time.perf_counter()
    async with session.post(url + "/v1/completions", json=body) as resp:
        first = await resp.content.readany()
        t1 = time.perf_counter()
        rest = await resp.read() if not resp.content.at_eof() else b""
        t2 = time.perf_counter()
        if resp.status != 200 or not first:
            raise RuntimeError(f"request failed: {resp.status} {first[:200]!r}")
        if stream and not (first + rest).endswith(b"data: [DONE]\n\n"):
            raise RuntimeError("incomplete stream")
    out.latency.append(t2 - t0)
    out.first_byte.append(t1 - t0)


async def _round(
    session: aiohttp.ClientSession,
    url: str,
    n: int,
    conc: int,
    stream: bool,
    out: Samples,
    pid: int | None = None,
) -> None:
    counter = iter(range(n))

    async def worker() -> None:
        for i in counter:
            await _one(session, url, i, stream, out)

    elapsed, cpu = await timed(asyncio.gather(*(worker() for _ in range(conc))), pid)
    out.elapsed += elapsed
    out.count += n
    if cpu is not None:
        out.cpu_s += cpu


def _ms(x: float) -> str:
    return f"{x * 1e3:7.3f}"


def _report(mode: str, conc: int, direct: Samples, gw: Samples) -> None:
    print(f"\n## {mode}, concurrency {conc} ({direct.count} requests each, {ROUNDS} rounds)")
    print(f"{'':24}{'direct':>10}{'gateway':>10}{'added':>10}{'ratio':>8}")
    for name, xs_d, xs_g in (
        ("latency", direct.latency, gw.latency),
        ("first byte", direct.first_byte, gw.first_byte),
    ):
        for q, label in ((0.5, "p50"), (0.99, "p99")):
            d, g = pct(xs_d, q), pct(xs_g, q)
            row = f"{name} {label} (ms)"
            print(f"{row:24}{_ms(d):>10}{_ms(g):>10}{_ms(g - d):>10}{g / d:8.2f}")
    mean_d, mean_g = statistics.fmean(direct.latency), statistics.fmean(gw.latency)
    print(f"{'latency mean (ms)':24}{_ms(mean_d):>10}{_ms(mean_g):>10}{_ms(mean_g - mean_d):>10}"
          f"{mean_g / mean_d:8.2f}")  # fmt: skip
    print(f"{'requests/s':24}{direct.rps:10.0f}{gw.rps:10.0f}{'':>10}{gw.rps / direct.rps:8.2f}")
    if direct.cpu_s and gw.cpu_s:
        d_us, g_us = direct.cpu_s / direct.count * 1e6, gw.cpu_s / gw.count * 1e6
        print(f"{'server CPU/request (us)':24}{d_us:10.0f}{g_us:10.0f}{'':>10}{g_us / d_us:8.2f}")
        print("  (direct: the replica's CPU; gateway: the gateway process's own CPU)")


@dataclass
class Pair:
    """A replica and the gateway in front of it (base URLs and process ids)."""

    replica_url: str
    gateway_url: str
    rpid: int
    gpid: int
    label: str = ""  # appended to each section's title


async def _bench(pairs: list[tuple[Pair, tuple[int, ...]]]) -> None:
    """For each pair, the concurrencies it is measured at."""
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for pair, _ in pairs:
            await wait_ready(session, pair.replica_url + "/health")
            await wait_ready(session, pair.gateway_url + "/health")
            for url in (pair.replica_url, pair.gateway_url):  # warm up connections and caches
                await _round(session, url, 200, 8, True, Samples())
                await _round(session, url, 200, 8, False, Samples())
        for pair, concurrencies in pairs:
            for stream in (False, True):
                for conc in concurrencies:
                    direct, gw = Samples(), Samples()
                    for _ in range(ROUNDS):
                        n = REQUESTS[conc]
                        await _round(session, pair.replica_url, n, conc, stream, direct, pair.rpid)
                        await _round(session, pair.gateway_url, n, conc, stream, gw, pair.gpid)
                    _report(("stream" if stream else "plain") + pair.label, conc, direct, gw)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--instant-replica":
        run_on_uvloop(_instant_replica(int(sys.argv[2])))
        return
    rport, gport, iport, igport = (_free_port() for _ in range(4))
    replica_url = f"http://127.0.0.1:{rport}"
    gateway_url = f"http://127.0.0.1:{gport}"
    instant_url, instant_gw_url = f"http://127.0.0.1:{iport}", f"http://127.0.0.1:{igport}"
    replica = spawn(
        ["emulate", "--port", str(rport), "--prefill-rate", "1e9", "--decode-step", "0",
         "--max-running", "1024"]
    )  # fmt: skip
    gateway = spawn(["serve", "--port", str(gport), "--replica", replica_url])
    instant = subprocess.Popen(
        [sys.executable, __file__, "--instant-replica", str(iport)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    instant_gw = spawn(["serve", "--port", str(igport), "--replica", instant_url])
    print("# gateway overhead: one near-zero-latency emulated replica, direct vs through gateway")
    print(f"# replica {replica_url}, gateway {gateway_url} (default policy), client in-process")
    print(f"# concurrency 1 also against an instant replica {instant_url} (no timer ticks)")
    started = time.perf_counter()
    procs = (gateway, replica, instant_gw, instant)
    try:
        emulated = Pair(replica_url, gateway_url, replica.pid, gateway.pid)
        canned = Pair(instant_url, instant_gw_url, instant.pid, instant_gw.pid, ", instant replica")
        run_on_uvloop(_bench([(emulated, (1, 32)), (canned, (1,))]))
    finally:
        stop_all(procs)
    cores = os.cpu_count()
    print(f"\n(total {time.perf_counter() - started:.0f} s on {cores} cores, 5 processes)")


_WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit")
_INSTANT_TOKENS = [" " + word for word in _WORDS]


def _instant_completion(prompt_tokens: int) -> dict[str, Any]:
    text = "".join(_INSTANT_TOKENS[:OUTPUT_TOKENS])
    details = {"cached_tokens": 0}
    return {
        "id": "cmpl-instant", "object": "text_completion", "created": 0, "model": "emulated",
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length",
                     "stop_reason": None, "prompt_logprobs": None}],
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + OUTPUT_TOKENS,
                  "completion_tokens": OUTPUT_TOKENS, "prompt_tokens_details": details},
    }  # fmt: skip


async def _instant_replica(port: int) -> None:
    """A replica that answers at once with vLLM-shaped bodies (the emulated one's, canned):
    what is left of a round trip to it is HTTP and JSON, no step timers."""
    from aiohttp import web

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt_tokens = len(str(body.get("prompt", "")).split())
        done = _instant_completion(prompt_tokens)
        if not body.get("stream"):
            return web.json_response(done)
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for token in _INSTANT_TOKENS[:OUTPUT_TOKENS]:
            chunk = {**done, "choices": [{"index": 0, "text": token, "logprobs": None,
                                          "finish_reason": None, "stop_reason": None}]}  # fmt: skip
            del chunk["usage"]
            await out.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        usage_chunk = {**done, "choices": []}
        await out.write(b"data: " + json.dumps(usage_chunk).encode() + b"\n\ndata: [DONE]\n\n")
        await out.write_eof()
        return out

    async def models(request: web.Request) -> web.Response:
        card = {"id": "emulated", "object": "model", "owned_by": "prefixroute", "root": "emulated"}
        return web.json_response({"object": "list", "data": [card]})

    async def health(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()


if __name__ == "__main__":
    main()
