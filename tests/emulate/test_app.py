"""The emulated replica over HTTP: OpenAI shapes, usage with cached tokens, errors, metrics."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from prefixroute.core import ConfigError
from prefixroute.emulate import EmulatedReplica, EmulatorConfig
from prefixroute.sim.replica import ReplicaConfig

FAST = EmulatorConfig(ReplicaConfig(block_size=1, kv_capacity_blocks=4096), time_scale=0.01)


@pytest.fixture
async def replica() -> AsyncIterator[EmulatedReplica]:
    async with EmulatedReplica(FAST) as r:
        yield r


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        yield s


def _events(raw: str) -> list[Any]:
    assert raw.endswith("data: [DONE]\n\n")
    return [
        json.loads(line[6:])
        for line in raw.split("\n\n")
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


async def _post(session: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, str]:
    async with session.post(url, json=body) as resp:
        return resp.status, await resp.text()


async def test_completion_plain(replica: EmulatedReplica, session: aiohttp.ClientSession) -> None:
    status, raw = await _post(
        session, replica.url + "/v1/completions", {"prompt": "w1 w2 w3", "max_tokens": 5}
    )
    assert status == 200
    body = json.loads(raw)
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["model"] == "emulated"
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["text"].split()) == 5
    assert body["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": 8,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


async def test_cache_hits_are_reported(
    replica: EmulatedReplica, session: aiohttp.ClientSession
) -> None:
    url = replica.url + "/v1/completions"
    await _post(session, url, {"prompt": "a b c d e f", "max_tokens": 1})
    _, raw = await _post(session, url, {"prompt": "a b c d e f g h", "max_tokens": 1})
    assert json.loads(raw)["usage"]["prompt_tokens_details"]["cached_tokens"] == 6
    _, raw = await _post(session, url, {"prompt": "a b c d e f", "max_tokens": 1})
    assert json.loads(raw)["usage"]["prompt_tokens_details"]["cached_tokens"] == 5  # prompt - 1


async def test_completion_stream(replica: EmulatedReplica, session: aiohttp.ClientSession) -> None:
    async with session.post(
        replica.url + "/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 3, "stream": True}
    ) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = _events(await resp.text())
    assert [e["object"] for e in events] == ["text_completion"] * 4
    assert [e["choices"][0]["finish_reason"] for e in events[:3]] == [None, None, "length"]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 3
    assert events[-1]["usage"]["prompt_tokens"] == 3


async def test_without_force_usage_a_stream_gets_usage_only_when_it_asks(
    session: aiohttp.ClientSession,
) -> None:
    # vLLM's default (no --enable-force-include-usage): the usage chunk is the client's choice.
    body: dict[str, Any] = {"prompt": [5, 6, 7], "max_tokens": 2, "stream": True}
    async with EmulatedReplica(dataclasses.replace(FAST, force_usage=False)) as r:
        url = r.url + "/v1/completions"
        events = _events((await _post(session, url, body))[1])
        assert len(events) == 2 and all(e["choices"] for e in events)
        asked = {**body, "stream_options": {"include_usage": True}}
        events = _events((await _post(session, url, asked))[1])
        assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 2
        not_asked = {**body, "stream_options": {"include_usage": False}}
        assert len(_events((await _post(session, url, not_asked))[1])) == 2
        # vLLM 0.32's StreamOptions defaults include_usage to false: an object without it
        # (vllm/entrypoints/generate/base/protocol.py) does not ask
        for options in ({}, {"continuous_usage_stats": False}, {"include_usage": None}):
            events = _events((await _post(session, url, {**body, "stream_options": options}))[1])
            assert len(events) == 2 and all(e["choices"] for e in events), options


@pytest.mark.parametrize("options", [{"include_usage": True}, "yes"])
async def test_stream_options_without_a_stream_or_not_an_object_are_refused(
    replica: EmulatedReplica, session: aiohttp.ClientSession, options: object
) -> None:
    body = {"prompt": "a", "max_tokens": 1, "stream_options": options}
    status, raw = await _post(session, replica.url + "/v1/completions", body)
    assert status == 400 and json.loads(raw)["error"]["param"] == "stream_options"


async def test_chat_plain_and_stream(
    replica: EmulatedReplica, session: aiohttp.ClientSession
) -> None:
    url = replica.url + "/v1/chat/completions"
    messages = [{"role": "user", "content": "hello there"}]
    status, raw = await _post(session, url, {"messages": messages, "max_completion_tokens": 2})
    body = json.loads(raw)
    assert status == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 2
    status, raw = await _post(session, url, {"messages": messages, "max_tokens": 2, "stream": True})
    events = _events(raw)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [e["object"] for e in events] == ["chat.completion.chunk"] * len(events)
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert text == body["choices"][0]["message"]["content"]
    # The second request found the first's prompt cached, all but the last token.
    assert events[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == (
        body["usage"]["prompt_tokens"] - 1
    )


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/completions", {"prompt": 3}, 400, "prompt"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "n": 2}, 400, "n"),
        ("/v1/completions", {"prompt": ""}, 400, "prompt"),
        ("/v1/completions", {"prompt": "x", "model": "other"}, 404, None),
        # over the window (by default the KV cache's size), in vLLM 0.32's words and param
        ("/v1/completions", {"prompt": "x " * 5000}, 400, "input_tokens"),
        ("/v1/chat/completions", {"messages": [{"content": "x"}]}, 400, "messages"),
        ("/v1/chat/completions", [], 400, None),
    ],
)
async def test_bad_requests(
    replica: EmulatedReplica,
    session: aiohttp.ClientSession,
    path: str,
    body: Any,
    status: int,
    param: str | None,
) -> None:
    got, raw = await _post(session, replica.url + path, body)
    assert got == status
    error = json.loads(raw)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status and error["param"] == param


async def test_an_empty_model_name_is_the_served_model(
    replica: EmulatedReplica, session: aiohttp.ClientSession
) -> None:
    # vLLM's _is_model_supported: an empty name is supported (the default model serves it)
    got, raw = await _post(session, replica.url + "/v1/completions", {"prompt": "x", "model": ""})
    assert got == 200, raw


async def test_malformed_json(replica: EmulatedReplica, session: aiohttp.ClientSession) -> None:
    async with session.post(replica.url + "/v1/completions", data=b"{oops") as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["type"] == "BadRequestError"


async def test_models_health_metrics(
    replica: EmulatedReplica, session: aiohttp.ClientSession
) -> None:
    async with session.get(replica.url + "/v1/models") as resp:
        models = await resp.json()
    assert models["object"] == "list" and models["data"][0]["id"] == "emulated"
    async with session.get(replica.url + "/health") as resp:
        assert resp.status == 200
    await _post(session, replica.url + "/v1/completions", {"prompt": "a b c", "max_tokens": 1})
    await _post(session, replica.url + "/v1/completions", {"prompt": "a b c d", "max_tokens": 1})
    async with session.get(replica.url + "/metrics") as resp:
        text = await resp.text()
    samples = dict(
        line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#")
    )
    label = '{model_name="emulated"}'
    assert float(samples["vllm:prefix_cache_queries_total" + label]) == 7
    assert float(samples["vllm:prefix_cache_hits_total" + label]) == 3
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert float(samples[f"vllm:{name}{label}"]) == 0


async def test_disconnect_aborts_the_request(session: aiohttp.ClientSession) -> None:
    slow = EmulatorConfig(FAST.engine, time_scale=1.0)
    async with EmulatedReplica(slow) as replica:
        resp = await session.post(
            replica.url + "/v1/completions",
            json={"prompt": "a b", "max_tokens": 1000, "stream": True},
        )
        await resp.content.readuntil(b"\n\n")
        resp.close()  # the engine is private; watch it through /metrics
        async with asyncio.timeout(5):
            while True:
                async with session.get(replica.url + "/metrics") as m:
                    text = await m.text()
                if 'vllm:num_requests_running{model_name="emulated"} 0.0' in text:
                    break
                await asyncio.sleep(0.02)


async def test_cache_salt_separates_cached_prefixes(
    replica: EmulatedReplica, session: aiohttp.ClientSession
) -> None:
    """As vLLM: the same prompt hits only under the same salt (and unsalted only unsalted)."""
    url = replica.url + "/v1/completions"
    prompt = " ".join(f"w{i}" for i in range(50))

    async def cached(salt: str | None) -> int:
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": 1}
        if salt is not None:
            body["cache_salt"] = salt
        status, raw = await _post(session, url, body)
        assert status == 200, raw
        return int(json.loads(raw)["usage"]["prompt_tokens_details"]["cached_tokens"])

    assert await cached("tenant-a") == 0
    assert await cached("tenant-a") == 49  # a hit stops one token short, as vLLM's does
    assert await cached("tenant-b") == 0
    assert await cached(None) == 0
    assert await cached(None) == 49
    for bad in ("", 3, ["x"]):
        status, raw = await _post(session, url, {"prompt": prompt, "cache_salt": bad})
        assert status == 400 and "cache_salt" in raw


async def test_adapters_are_served_and_cache_apart(session: aiohttp.ClientSession) -> None:
    """LoRA adapters as vLLM serves them: listed with the base model as ``parent``, answered
    under their own name, and each keeps its own cached blocks (vLLM hashes ``lora_name`` into
    every block): the same prompt hits only under the same adapter, or the base model."""
    config = dataclasses.replace(FAST, model="base", adapters=("sql", "chat"))
    async with EmulatedReplica(config) as replica:
        async with session.get(replica.url + "/v1/models") as resp:
            cards = {c["id"]: c for c in (await resp.json())["data"]}
        assert cards["base"]["parent"] is None
        assert cards["sql"]["parent"] == cards["chat"]["parent"] == "base"
        url = replica.url + "/v1/completions"
        prompt = " ".join(f"w{i}" for i in range(50))

        async def cached(model: str) -> int:
            status, raw = await _post(session, url, {"model": model, "prompt": prompt})
            assert status == 200, raw
            assert json.loads(raw)["model"] == model
            return int(json.loads(raw)["usage"]["prompt_tokens_details"]["cached_tokens"])

        assert await cached("sql") == 0
        assert await cached("chat") == 0
        assert await cached("base") == 0
        assert [await cached(m) for m in ("sql", "chat", "base")] == [49, 49, 49]
        status, raw = await _post(session, url, {"model": "other", "prompt": prompt})
        assert status == 404, raw
    with pytest.raises(ConfigError):
        dataclasses.replace(FAST, model="base", adapters=("base",))
    with pytest.raises(ConfigError):
        dataclasses.replace(FAST, adapters=("",))
