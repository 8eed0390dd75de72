"""The emulated replica's context window (``EmulatorConfig.max_model_len``, ``prefixroute
emulate --max-model-len``): a prompt longer than it gets the engine's own 400, in vLLM 0.32's
words on the OpenAI endpoints and SGLang's on ``/generate``, and ``/v1/models`` says it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from prefixroute.core import ConfigError
from prefixroute.emulate import EmulatedReplica, EmulatorConfig
from prefixroute.sim.replica import ReplicaConfig

WINDOW = 100  # tokens; the emulator's tokenizer makes one token of each word
ENGINE = ReplicaConfig(block_size=1, kv_capacity_blocks=4096)


@pytest.fixture
async def replica() -> AsyncIterator[EmulatedReplica]:
    config = EmulatorConfig(ENGINE, time_scale=0.01, max_model_len=WINDOW)
    async with EmulatedReplica(config) as r:
        yield r


async def test_a_prompt_over_the_window_gets_vllms_400(replica: EmulatedReplica) -> None:
    async with aiohttp.ClientSession() as http:
        # At the window, served (vLLM refuses only a prompt longer than it) ...
        body = {"prompt": "x " * (WINDOW - 1), "max_tokens": 1}  # (a completion adds a token)
        async with http.post(replica.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200
            assert (await resp.json())["usage"]["prompt_tokens"] == WINDOW
        # ... one token longer, refused in vLLM 0.32's words, its param named.
        body = {"prompt": "x " * WINDOW, "max_tokens": 1}
        async with http.post(replica.url + "/v1/completions", json=body) as resp:
            status, error = resp.status, (await resp.json())["error"]
        assert status == 400 and error["param"] == "input_tokens"
        assert error["message"] == (
            "This model's maximum context length is 100 tokens. However, your prompt contains "
            "101 input tokens, which exceeds this limit even without any output tokens. Please "
            "reduce the length of the input prompt."
        )
        async with http.post(replica.url + "/generate", json={"text": "x " * 150}) as resp:
            status, text = resp.status, await resp.text()
        assert status == 400
        assert "The input (15" in text and "longer than the model's context length (100 " in text
        async with http.get(replica.url + "/v1/models") as resp:
            cards = json.loads(await resp.text())["data"]
        assert cards[0]["max_model_len"] == WINDOW


async def test_without_a_window_it_is_the_kv_caches_size() -> None:
    config = EmulatorConfig(ENGINE, time_scale=0.01)
    assert config.window == 4096
    async with (
        EmulatedReplica(config) as r,
        aiohttp.ClientSession() as http,
        http.get(r.url + "/v1/models") as resp,
    ):
        assert (await resp.json())["data"][0]["max_model_len"] == 4096


def test_a_window_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="max model length must be positive"):
        EmulatorConfig(ENGINE, max_model_len=0)
