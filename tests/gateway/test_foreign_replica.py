"""The gateway against a replica written by others (``benchmarks/foreign_replica.py``: written
without reading this repository, from vLLM's and SGLang's outside behaviour). It opens each
chat stream with a role-only chunk before it prefills, tokenizes the workload its own way, and
reports usage only when asked. The router must still learn its prefill rate from chat streams
(issue 11: learned speeds). Before the first token was the first event with output, every
replica like it was learned at the speed model's bound, 200,000 tokens/s."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from .helpers import GatewayFactory, wait_answering

REPLICA = Path(__file__).resolve().parents[2] / "benchmarks" / "foreign_replica.py"
TRUE_RATE = 5_000.0  # its prefill rate, tokens/s


@pytest.fixture
async def foreign() -> AsyncIterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["--port", str(port), "--prefill-tps", str(TRUE_RATE), "--decode-ms", "5"]
    proc = subprocess.Popen([sys.executable, str(REPLICA), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_answering(url, tries=200)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_the_prefill_rate_is_learned_from_chat_streams(
    foreign: str, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    gw = await make_gateway([foreign])
    rng = random.Random(0)
    for i in range(12):  # each prompt new: 500-1,000 words, about 1,000-2,000 of its tokens
        words = " ".join(f"x{rng.randrange(10**6)}" for _ in range(rng.randrange(500, 1000)))
        body = {"messages": [{"role": "user", "content": f"{i} {words}"}], "stream": True,
                "max_tokens": 2}  # fmt: skip
        async with session.post(gw.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            await resp.read()
    speed = gw.router.replica_load(gw.registry.find(foreign).id).speed
    assert speed.prefill_observations >= 8
    # Within 2x after a dozen requests (the prior is 10,000; the bug gave 200,000).
    assert TRUE_RATE / 2 <= speed.prefill_tokens_per_s <= TRUE_RATE * 2
