"""The emulated replica's SGLang ``/generate``: SGLang's request fields and answer shapes (text,
output_ids, meta_info with the cached tokens), cumulative stream chunks, adapters and the
``extra_key`` cache namespace, and its 400s."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from prefixroute.emulate import EmulatedReplica, EmulatorConfig
from prefixroute.sim.replica import ReplicaConfig

FAST = EmulatorConfig(
    ReplicaConfig(block_size=1, kv_capacity_blocks=4096), time_scale=0.01, adapters=("sql",)
)
PROMPT = " ".join(f"w{i}" for i in range(40))  # 40 tokens to the emulator's tokenizer


@pytest.fixture
async def url() -> AsyncIterator[str]:
    async with EmulatedReplica(FAST) as r:
        yield r.url + "/generate"


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        yield s


async def _post(session: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, str]:
    async with session.post(url, json=body) as resp:
        return resp.status, await resp.text()


async def test_a_plain_answer_has_the_text_and_the_counts(
    url: str, session: aiohttp.ClientSession
) -> None:
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 4}}
    status, raw = await _post(session, url, body)
    assert status == 200
    first = json.loads(raw)
    assert len(first["text"].split()) == 4 and len(first["output_ids"]) == 4
    meta = first["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 4}
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"]) == (40, 4, 0)
    _, raw = await _post(session, url, body)
    assert json.loads(raw)["meta_info"]["cached_tokens"] >= 39  # the prefix, from the cache
    # Token ids are the prompt as they are; SGLang's default output length is 128.
    _, raw = await _post(session, url, {"input_ids": list(range(1, 21))})
    meta = json.loads(raw)["meta_info"]
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (20, 128)


async def test_a_stream_sends_all_the_output_so_far_in_every_chunk(
    url: str, session: aiohttp.ClientSession
) -> None:
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 3}, "stream": True}
    status, raw = await _post(session, url, body)
    assert status == 200 and raw.endswith("data: [DONE]\n\n")
    chunks = [json.loads(e[6:]) for e in raw.split("\n\n") if e.startswith("data: {")]
    assert [len(c["text"].split()) for c in chunks] == [1, 2, 3]
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == [1, 2, 3]
    assert chunks[0]["text"] and chunks[2]["text"].startswith(chunks[0]["text"])
    assert [c["meta_info"]["finish_reason"] for c in chunks[:2]] == [None, None]
    assert chunks[2]["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    assert all(c["meta_info"]["prompt_tokens"] == 40 for c in chunks)


async def test_an_adapter_and_an_extra_key_keep_their_blocks_apart(
    url: str, session: aiohttp.ClientSession
) -> None:
    async def cached(**fields: Any) -> int:
        body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 1}, **fields}
        status, raw = await _post(session, url, body)
        assert status == 200, raw
        return int(json.loads(raw)["meta_info"]["cached_tokens"])

    assert await cached() == 0
    assert await cached() > 0
    assert await cached(lora_path="sql") == 0  # the adapter's blocks are its own
    assert await cached(lora_path="sql") > 0
    assert await cached(extra_key="tenant-a") == 0  # a namespace of its own, as cache_salt
    assert await cached(extra_key="tenant-a") > 0
    assert await cached(extra_key="tenant-b") == 0


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"text": "a b", "input_ids": [1, 2]},
        {"text": 5},
        {"input_ids": [1, "x"]},
        {"text": ["a", "b"]},  # a batch of two: one prompt per request here
        {"text": "a", "sampling_params": {"max_new_tokens": 0}},
        {"text": "a", "sampling_params": "fast"},
        {"text": "a", "stream": "yes"},
        {"text": "a", "lora_path": "unknown"},
        {"text": "a", "extra_key": ""},
        [1, 2],
    ],
)
async def test_bad_bodies_are_400_with_an_error_body(
    url: str, session: aiohttp.ClientSession, body: Any
) -> None:
    status, raw = await _post(session, url, body)
    assert status == 400, raw
    assert json.loads(raw)["error"]["message"]

