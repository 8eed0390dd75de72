"""A fresh gateway in approximate mode asks real vLLM's ``POST /tokenize`` for the model's
characters per token before any answer has told them (``gateway/_token_probe.py``)."""

from __future__ import annotations

import aiohttp
import pytest

from prefixroute.gateway import Gateway, GatewayConfig, HFTokenizer
from prefixroute.gateway._state import STATE

from .engines import BLOCK_SIZE, MODEL, MODEL_NAME, VLLMServer
from .metrics import total

pytestmark = pytest.mark.vllm


async def test_a_fresh_gateway_learns_the_models_ratio_from_vllms_tokenize(
    engines: list[VLLMServer],
) -> None:
    config = GatewayConfig(
        port=0, replicas=tuple(e.url for e in engines), kv_block_size=BLOCK_SIZE,
        health_interval_s=0.5, read_timeout_s=120.0,
    )  # fmt: skip
    prompt = "a fresh gateway counts this prompt on the engine before routing it " * 20
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 2}
    async with (
        Gateway(config) as gw,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session,
    ):
        assert gw.router.chars_per_token_of(MODEL_NAME) == 4.0  # the prior: nothing told yet
        async with session.post(gw.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
        registry = gw.app[STATE].metrics.registry
        sample = registry.get_sample_value
        assert sample("prefixroute_token_probes_total", {"outcome": "learned"}) == 1
        assert total(gw, "prefixroute_token_probes_total") == 1
        learned = gw.router.chars_per_token_of(MODEL_NAME)
    # vLLM's count of the prompt (with its BOS), by the model's own tokenizer here.
    count = len(HFTokenizer(str(MODEL)).encode_prompt(prompt))
    assert abs(learned / (len(prompt) / count) - 1) < 0.05, (learned, len(prompt) / count)
