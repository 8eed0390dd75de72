"""Real vLLM sends a stream's usage only when asked (no ``--enable-force-include-usage``, as
``engines.py`` starts it): the gateway asks for the streams whose client did not, learns from
them, and keeps the usage event from the client (``gateway._usage``)."""

from __future__ import annotations

import json

import aiohttp
import pytest

from prefixroute.gateway import Gateway, GatewayConfig

from .engines import BLOCK_SIZE, MODEL_NAME, VLLMServer
from .metrics import total

pytestmark = pytest.mark.vllm



@pytest.mark.parametrize("stream_usage", [True, False], ids=["asked by the gateway", "off"])
async def test_a_stream_whose_client_did_not_ask_for_usage(
    engines: list[VLLMServer], stream_usage: bool
) -> None:
    config = GatewayConfig(
        port=0, replicas=tuple(e.url for e in engines), kv_block_size=BLOCK_SIZE,
        health_interval_s=0.5, read_timeout_s=120.0, stream_usage=stream_usage,
    )  # fmt: skip
    body = {"model": MODEL_NAME, "prompt": "one two three four five", "max_tokens": 3,
            "stream": True}  # fmt: skip
    async with (
        Gateway(config) as gw,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session,
    ):
        async with session.post(gw.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            raw = await resp.text()
        events = [json.loads(line[6:]) for line in raw.split("\n\n")
                  if line.startswith("data: {")]  # fmt: skip
        assert raw.rstrip().endswith("data: [DONE]")
        assert events and all(e.get("choices") for e in events), "usage reached the client"
        reported = total(gw, "prefixroute_prompt_tokens_total")
        missing = total(gw, "prefixroute_usage_missing_total")
    if stream_usage:
        assert reported > 0 and missing == 0
    else:  # vLLM sent none: what the gateway learned before this change
        assert reported == 0 and missing == 1


async def test_a_stream_keeps_the_engines_system_fingerprint(engines: list[VLLMServer]) -> None:
    """vLLM 0.32 stamps ``system_fingerprint`` on the finish chunk of a client that did not ask
    for usage, and only on the usage chunk of one that did: the gateway asks, hides that chunk,
    and puts its fingerprint on the finish chunk, so the client gets what the engine would have
    sent it (``gateway/_fingerprint.py``)."""
    engine = engines[0]
    config = GatewayConfig(
        port=0, replicas=(engine.url,), kv_block_size=BLOCK_SIZE, health_interval_s=0.5,
        read_timeout_s=120.0,
    )  # fmt: skip
    body = {"model": MODEL_NAME, "prompt": "six seven eight", "max_tokens": 3, "stream": True,
            "temperature": 0}  # fmt: skip
    streams = []
    async with (
        Gateway(config) as gw,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session,
    ):
        for url in (engine.url, gw.url):
            async with session.post(url + "/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                raw = await resp.text()
            streams.append([json.loads(line[6:]) for line in raw.split("\n\n")
                            if line.startswith("data: {")])  # fmt: skip
    direct, relayed = streams
    marks = [[e.get("system_fingerprint") for e in s] for s in (direct, relayed)]
    assert marks[0] == marks[1], marks  # the same chunks carry it, with the same value
    assert any(marks[0]), "this vLLM stamps no fingerprint: nothing to check"
