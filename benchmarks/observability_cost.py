"""What watching the gateway costs: OpenTelemetry tracing per request, and an open dashboard.

Run: ``.venv/bin/python benchmarks/observability_cost.py`` (about a minute; ``--quick``: a few
seconds). Issue 14's targets: tracing on adds at most 50 µs at p50 per request; the dashboard
open costs the gateway under 2% throughput.

Setup, all on this machine, each server in its own process as in production: one emulated
replica with near-zero prefill and decode time; two gateways in front of it, one plain and one
with ``--otlp-endpoint`` pointing at an OTLP/gRPC receiver (a third process that accepts and
drops spans, so exporting really happens). The client (this process) alternates rounds between
the two gateways so that drift hits both alike.

- **Tracing:** latency p50 / p99 at concurrency 1 through each gateway, and the difference.
- **Dashboard:** requests/s at concurrency 32 through the plain gateway, alternating rounds with
  and without a poller that reads ``/dashboard/state.json`` once a second (what the open page
  does), and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import time

import aiohttp
from _procs import pct, spawn, wait_ready
from gateway_overhead import Samples, _free_port, _round

RECEIVER = """
import sys, time
from concurrent import futures
import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

class Drop(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request, context):
        return trace_service_pb2.ExportTraceServiceResponse()

server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Drop(), server)
server.add_insecure_port("127.0.0.1:" + sys.argv[1])
server.start()
server.wait_for_termination()
"""


async def _poll_dashboard(session: aiohttp.ClientSession, url: str, stop: asyncio.Event) -> int:
    """Reads the fleet page's state once a second, as the open page does; returns the count."""
    polls = 0
    while not stop.is_set():
        async with session.get(url + "/dashboard/state.json") as resp:
            if resp.status != 200:
                raise RuntimeError(f"dashboard state: {resp.status}")
            await resp.read()
        polls += 1
        with contextlib.suppress(TimeoutError):  # a second has passed: poll again
            await asyncio.wait_for(stop.wait(), 1.0)
    return polls


async def _tracing(session: aiohttp.ClientSession, plain: str, traced: str, rounds: int, n: int
                   ) -> None:  # fmt: skip
    off, on = Samples(), Samples()
    for _ in range(rounds):
        await _round(session, plain, n, 1, False, off)
        await _round(session, traced, n, 1, False, on)
    print(f"\n## tracing, concurrency 1, plain requests ({off.count} each, {rounds} rounds)")
    print(f"{'':20}{'off':>10}{'on':>10}{'added µs':>10}{'ratio':>8}")
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        a, b = pct(off.latency, q), pct(on.latency, q)
        print(f"{'latency ' + label + ' (µs)':20}{a * 1e6:10.0f}{b * 1e6:10.0f}"
              f"{(b - a) * 1e6:10.0f}{b / a:8.2f}")  # fmt: skip
    added = (pct(on.latency, 0.5) - pct(off.latency, 0.5)) * 1e6
    print(f"target: p50 added <= 50 µs: {'met' if added <= 50 else 'NOT met'} ({added:.0f} µs)")


async def _dashboard(session: aiohttp.ClientSession, plain: str, rounds: int, n: int) -> None:
    closed, opened = Samples(), Samples()
    polls = 0
    for _ in range(rounds):
        await _round(session, plain, n, 32, False, closed)
        stop = asyncio.Event()
        poller = asyncio.create_task(_poll_dashboard(session, plain, stop))
        await _round(session, plain, n, 32, False, opened)
        stop.set()
        polls += await poller
    ratio = opened.rps / closed.rps
    print(f"\n## dashboard, concurrency 32 ({closed.count} requests each, {rounds} rounds)")
    print(f"requests/s, page closed {closed.rps:8.0f}")
    print(f"requests/s, page open   {opened.rps:8.0f}  ({polls} polls of state.json)")
    print(f"ratio {ratio:.3f}; target: under 2% lost: {'met' if ratio >= 0.98 else 'NOT met'}")


async def _bench(plain: str, traced: str, quick: bool) -> None:
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as s:
        await wait_ready(s, plain + "/health")
        await wait_ready(s, traced + "/health")
        for url in (plain, traced):  # warm up connections and caches
            await _round(s, url, 100, 8, False, Samples())
        rounds = 2 if quick else 6
        await _tracing(s, plain, traced, rounds, 60 if quick else 400)
        await _dashboard(s, plain, rounds, 200 if quick else 1600)


def main(argv: list[str] | None = None) -> None:
    """``argv``: this script's flags (none when ``benchmarks/run.py`` calls it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds, noisy")
    args = parser.parse_args(argv or [])
    rport, pport, tport, oport = (_free_port() for _ in range(4))
    replica_url = f"http://127.0.0.1:{rport}"
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER, str(oport)])
    procs = [
        receiver,
        spawn(["emulate", "--port", str(rport), "--prefill-rate", "1e9", "--decode-step", "0",
                "--max-running", "1024"]),
        spawn(["serve", "--port", str(pport), "--replica", replica_url]),
        spawn(["serve", "--port", str(tport), "--replica", replica_url,
                "--otlp-endpoint", f"http://127.0.0.1:{oport}"]),
    ]  # fmt: skip
    print("# observability cost: tracing on vs off, dashboard open vs closed, same run")
    started = time.perf_counter()
    try:
        plain, traced = f"http://127.0.0.1:{pport}", f"http://127.0.0.1:{tport}"
        asyncio.run(_bench(plain, traced, args.quick))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
    print(f"\n(total {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
