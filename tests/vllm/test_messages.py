"""Anthropic's Messages API on real vLLM through the gateway (core/messages_input.py).

A coding agent's conversation as Claude Code sends it: every request stamps its system prompt
with a per-request attribution block (which vLLM drops before rendering) and moves its
``cache_control`` marker to the newest turn. The gateway must key each turn as an extension of
the last anyway, keep the conversation on one engine, and read vLLM's Anthropic usage (the
prompt split into ``input_tokens`` and ``cache_read_input_tokens``), whole and streamed."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from prefixroute.gateway import Gateway, GatewayConfig

from .engines import BLOCK_SIZE, MODEL_NAME, VLLMServer
from .metrics import total

pytestmark = pytest.mark.vllm

REPLICA = "x-prefixroute-replica"



async def _message(
    session: aiohttp.ClientSession, gw: Gateway, body: dict[str, Any]
) -> tuple[tuple[str, int], dict[str, Any], str]:
    """((the replica that answered, the tokens the router predicted cached there), the usage,
    the text): a stream's from its events."""
    async with session.post(gw.url + "/v1/messages", json={"model": MODEL_NAME, **body}) as resp:
        raw = await resp.text()
        assert resp.status == 200, raw
        replica = resp.headers[REPLICA], int(resp.headers["x-prefixroute-predicted-cached-tokens"])
    if not body.get("stream"):
        answer = json.loads(raw)
        return replica, answer["usage"], "".join(b.get("text", "") for b in answer["content"])
    events = [json.loads(line[6:]) for line in raw.split("\n") if line.startswith("data: {")]
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    (usage,) = [e["usage"] for e in events if e["type"] == "message_delta"]
    return replica, usage, text


async def test_a_coding_agents_conversation_stays_on_one_engine(engines: list[VLLMServer]) -> None:
    config = GatewayConfig(
        port=0, replicas=tuple(e.url for e in engines), kv_block_size=BLOCK_SIZE,
        health_interval_s=0.5, read_timeout_s=120.0, expose_replica_urls=True,
    )  # fmt: skip
    for e in engines:
        e.reset_prefix_cache()
    instructions = "You review patches to the river towns' water ledger, tersely. " * 10
    async with (
        Gateway(config) as gw,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session,
    ):
        homes, prompts = [], 0
        for user in range(2):
            history: list[dict[str, Any]] = []
            served = []
            for turn in range(3):
                history.append({"role": "user", "content": [
                    {"type": "text", "text": f"User {user}, patch {turn}: the ledger adds a row."}
                ]})  # fmt: skip
                messages = json.loads(json.dumps(history))
                messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
                system = [
                    {"type": "text", "text": f"x-anthropic-billing-header: cch={user}{turn};"},
                    {"type": "text", "text": instructions, "cache_control": {"type": "ephemeral"}},
                ]
                body = {"system": system, "messages": messages, "max_tokens": 4,
                        "stream": turn == 1}  # fmt: skip
                (replica, predicted), usage, text = await _message(session, gw, body)
                served.append(replica)
                # Anthropic's split, as vLLM fills it: the prompt is all three counts.
                prompts += sum(usage.get(k, 0) for k in (
                    "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))
                if turn:
                    # vLLM's own count: the conversation so far was in that engine's cache;
                    # and the router's key knew it (a per-request stamp in the key: 0).
                    assert usage["cache_read_input_tokens"] >= BLOCK_SIZE, usage
                    assert predicted >= BLOCK_SIZE
                history.append({"role": "assistant", "content": [{"type": "text", "text": text}]})
            assert len(set(served)) == 1, served
            homes.append(served[0])
        missing = total(gw, "prefixroute_usage_missing_total")
        cached = total(gw, "prefixroute_actual_cached_tokens_total")
        reported = total(gw, "prefixroute_prompt_tokens_total")
    print(f"\nMessages API on vLLM: homes {homes}, cached tokens reported {cached:.0f}")
    assert missing == 0 and cached > 0 and reported == prompts
