"""What the HTTP benchmarks share: processes to start and wait for, their CPU, percentiles,
and the event loop the servers run on (imported by path: benchmarks are scripts)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Sequence
from typing import Any

import aiohttp


def cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) a process has used, or None off Linux."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(xs: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``xs``, nearest rank."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def spawn(args: list[str]) -> subprocess.Popen[bytes]:
    """``prefixroute ARGS`` in a child process, quiet."""
    cmd = [sys.executable, "-m", "prefixroute.cli", *args]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def wait_ready(session: aiohttp.ClientSession, url: str, timeout_s: float = 30.0) -> None:
    """Return once ``GET url`` answers 200; RuntimeError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            async with session.get(url) as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} did not answer 200")


async def timed(work: Awaitable[Any], pid: int | None) -> tuple[float, float | None]:
    """Await ``work``: its wall seconds, and the CPU seconds process ``pid`` spent meanwhile
    (None without a pid, or off Linux)."""
    cpu0 = cpu_s(pid) if pid else None
    t0 = time.perf_counter()
    await work
    elapsed = time.perf_counter() - t0
    cpu1 = cpu_s(pid) if pid else None
    return elapsed, (cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None)


def stop_all(procs: Sequence[subprocess.Popen[bytes]], timeout_s: float = 10.0) -> None:
    """SIGTERM every process, then wait for each (killing one that outlives ``timeout_s``)."""
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
