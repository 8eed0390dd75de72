"""The gateway against llm-d-inference-sim as another project wrote it
(``benchmarks/foreign_replica_d.py``, re-implemented from that simulator's docs and source by a
helper that had not read this repository): its own tokenizer and chat rendering, a block cache
looked up when a worker takes the request, each request's first token after
``prefill-overhead + uncached x prefill-time-per-token`` with no wait on another's prefill, and
``cached_tokens`` in its usage. A conversation must stay where its prefix is cached and be served
from that cache, and the router must learn the replica's prefill rate from its streams."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from .helpers import STEADY, GatewayFactory, wait_answering

REPLICA = Path(__file__).resolve().parents[2] / "benchmarks" / "foreign_replica_d.py"
TRUE_RATE = 5_000.0  # its prefill rate, tokens/s (200 us a token)
MODEL = "sim-model"


async def _started(count: int) -> tuple[list[str], list[subprocess.Popen[bytes]]]:
    urls, procs = [], []
    for i in range(count):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        args = ["--port", str(port), "--model", MODEL, "--seed", str(i),
                "--prefill-time-per-token", f"{1e6 / TRUE_RATE:.0f}us", "--prefill-overhead",
                "5ms", "--inter-token-latency", "2ms", "--max-num-seqs", "8",
                "--max-model-len", "16384", "--kv-cache-size", "2048"]  # fmt: skip
        quiet = subprocess.DEVNULL
        procs.append(subprocess.Popen([sys.executable, str(REPLICA), *args], stdout=quiet,
                                      stderr=quiet))  # fmt: skip
        urls.append(f"http://127.0.0.1:{port}")
    for url in urls:
        await wait_answering(url)
    return urls, procs


@pytest.fixture
async def replicas() -> AsyncIterator[list[str]]:
    urls, procs = await _started(2)
    try:
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


async def _chat(
    session: aiohttp.ClientSession, url: str, messages: list[dict[str, str]]
) -> tuple[str, int]:
    """(the replica that served it, its cached tokens), streamed."""
    body = {"model": MODEL, "messages": messages, "stream": True, "max_tokens": 4,
            "stream_options": {"include_usage": True}}  # fmt: skip
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        raw = await resp.text()
    usage = [line for line in raw.splitlines() if '"usage"' in line and '"choices":[]' in line]
    cached = int(usage[-1].split('"cached_tokens":')[1].split("}")[0].split(",")[0])
    return resp.headers["x-prefixroute-replica"], cached


async def test_a_conversation_stays_where_it_is_cached_and_the_rate_is_learned(
    replicas: list[str], make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    gw = await make_gateway(replicas, **STEADY)
    rng = random.Random(0)
    history = [{"role": "system", "content": " ".join(f"s{i}" for i in range(400))}]
    served, cached = [], []
    for turn in range(4):
        words = " ".join(f"q{rng.randrange(10**6)}" for _ in range(150))
        history.append({"role": "user", "content": f"turn {turn}: {words}"})
        replica, hit = await _chat(session, gw.url, history)
        served.append(replica)
        cached.append(hit)
        history.append({"role": "assistant", "content": f"answer {turn}"})
    assert len(set(served)) == 1, served  # every turn where the first was cached
    assert cached[0] == 0 and all(c > 400 for c in cached[1:]), cached
    for i in range(24):  # fresh prompts: 500-1,000 words, each its own prefill (about 12 each)
        words = " ".join(f"x{rng.randrange(10**6)}" for _ in range(rng.randrange(500, 1000)))
        await _chat(session, gw.url, [{"role": "user", "content": f"{i} {words}"}])
    rates = [gw.router.replica_load(gw.registry.find(u).id).speed for u in replicas]
    learned = [s.prefill_tokens_per_s for s in rates if s.prefill_observations >= 4]
    assert learned, [s.prefill_observations for s in rates]
    # Within 2x of the truth (the prior is 10,000 tokens/s).
    assert all(TRUE_RATE / 2 <= r <= TRUE_RATE * 2 for r in learned), learned
