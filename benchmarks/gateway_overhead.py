"""Gateway overhead: the same client, in the same run, against one replica directly and through
the gateway. Run: ``.venv/bin/python benchmarks/gateway_overhead.py`` (about a minute).

Setup: one emulated replica with near-zero prefill and decode time (so the replica itself adds
almost nothing), and the gateway in front of it, each in its own process on uvloop, as they run
in production (``prefixroute emulate`` / ``prefixroute serve``). The client runs in this process
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
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

import aiohttp

ROUNDS = 4  # alternating direct / gateway rounds per configuration
REQUESTS = {1: 400, 32: 1600}  # requests per round, by concurrency
OUTPUT_TOKENS = 8
HEAD = " ".join(f"shared{i}" for i in range(60))  # ~500 characters every prompt starts with


def _cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) a process has used, or None off Linux."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(args: list[str]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "prefixroute.cli", *args]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def _wait_ready(session: aiohttp.ClientSession, url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            async with session.get(url + "/health") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} did not become ready")


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

    cpu0 = _cpu_s(pid) if pid else None
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(conc)))
    out.elapsed += time.perf_counter() - t0
    out.count += n
    cpu1 = _cpu_s(pid) if pid else None
    if cpu0 is not None and cpu1 is not None:
        out.cpu_s += cpu1 - cpu0


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
            d, g = _pct(xs_d, q), _pct(xs_g, q)
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


async def _bench(replica_url: str, gateway_url: str, rpid: int, gpid: int) -> None:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await _wait_ready(session, replica_url)
        await _wait_ready(session, gateway_url)
        for url in (replica_url, gateway_url):  # warm up connections, JIT-free but cache-warm
            await _round(session, url, 200, 8, True, Samples())
            await _round(session, url, 200, 8, False, Samples())
        for stream in (False, True):
            for conc in (1, 32):
                direct, gw = Samples(), Samples()
                for _ in range(ROUNDS):
                    n = REQUESTS[conc]
                    await _round(session, replica_url, n, conc, stream, direct, rpid)
                    await _round(session, gateway_url, n, conc, stream, gw, gpid)
                _report("stream" if stream else "plain", conc, direct, gw)


def main() -> None:
    rport, gport = _free_port(), _free_port()
    replica_url = f"http://127.0.0.1:{rport}"
    gateway_url = f"http://127.0.0.1:{gport}"
    replica = _spawn(
        ["emulate", "--port", str(rport), "--prefill-rate", "1e9", "--decode-step", "0",
         "--max-running", "1024"]
    )  # fmt: skip
    gateway = _spawn(["serve", "--port", str(gport), "--replica", replica_url])
    print("# gateway overhead: one near-zero-latency emulated replica, direct vs through gateway")
    print(f"# replica {replica_url}, gateway {gateway_url} (default policy), client in-process")
    started = time.perf_counter()
    try:
        try:
            import uvloop
        except ImportError:
            asyncio.run(_bench(replica_url, gateway_url, replica.pid, gateway.pid))
        else:
            uvloop.run(_bench(replica_url, gateway_url, replica.pid, gateway.pid))
    finally:
        for proc in (gateway, replica):
            proc.send_signal(signal.SIGTERM)
        for proc in (gateway, replica):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    cores = os.cpu_count()
    print(f"\n(total {time.perf_counter() - started:.0f} s on {cores} cores, 3 processes)")


if __name__ == "__main__":
    main()
