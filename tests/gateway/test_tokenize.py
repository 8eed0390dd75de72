"""Token-exact keys: the tokenizer directory, the chat template, the worker threads."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from prefixroute.core import ConfigError
from prefixroute.emulate import EmulatedTokenizer, EmulatorConfig
from prefixroute.gateway import HFTokenizer
from prefixroute.gateway._requests import Endpoint, route_key
from prefixroute.gateway._tokenize import TokenizerPool
from prefixroute.sim.replica import ReplicaConfig

from .helpers import STEADY, ClusterFactory, GatewayFactory, send
from .test_precise import metric

TINY = Path(__file__).resolve().parents[1] / "data" / "tiny-tokenizer"  # the real-vLLM model's


def test_completion_prompts_get_the_bos_token_chat_prompts_get_it_from_the_template() -> None:
    tok = HFTokenizer(TINY)
    bos = tok.tokenizer.token_to_id("<s>")
    ids = tok.encode_prompt("hello cache")
    assert ids[0] == bos and ids[1:] == tok.encode_prompt("hello cache", add_special_tokens=False)
    rendered = tok.render_chat([{"role": "user", "content": "hi"}])
    assert rendered == "<s><|user|>\nhi<|end|>\n<|assistant|>\n"
    chat = tok.encode_chat([{"role": "user", "content": "hi"}])
    assert chat[0] == bos and chat.count(bos) == 1


def test_text_parts_are_joined_with_newlines_as_vllm_does() -> None:
    tok = HFTokenizer(TINY)
    parts = [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}]
    assert tok.render_chat([{"role": "user", "content": parts}]) == tok.render_chat(
        [{"role": "user", "content": "a\nb"}]
    )


def test_a_directory_without_a_usable_tokenizer_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        HFTokenizer(tmp_path)
    shutil.copy(TINY / "tokenizer.json", tmp_path)
    tok = HFTokenizer(tmp_path)  # no tokenizer_config.json: prompts work, chat does not
    assert tok.encode_prompt("x")
    with pytest.raises(ConfigError, match="chat_template"):
        tok.encode_chat([{"role": "user", "content": "x"}])
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% if %}"}))
    with pytest.raises(ConfigError, match="chat template"):
        HFTokenizer(tmp_path)


def test_named_templates_and_token_objects(tmp_path: Path) -> None:
    shutil.copy(TINY / "tokenizer.json", tmp_path)
    config = {
        "bos_token": {"content": "<s>", "lstrip": False},
        "chat_template": [
            {"name": "tool_use", "template": "TOOLS"},
            {"name": "default", "template": "{{ bos_token }}{{ messages[0]['content'] }}"},
        ],
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert HFTokenizer(tmp_path).render_chat([{"role": "user", "content": "q"}]) == "<s>q"


class Failing:
    def encode_prompt(self, text: str, add_special_tokens: bool = True) -> list[int]:
        raise ValueError("cannot")

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], add_special_tokens: bool = False
    ) -> list[int]:
        raise ValueError("cannot")


async def test_the_pool_replaces_text_with_tokens_or_falls_back() -> None:
    costs: list[float] = []
    failures: list[int] = []
    pool = TokenizerPool(EmulatedTokenizer(), 1, costs.append, lambda: failures.append(1))
    bad = TokenizerPool(Failing(), 1, costs.append, lambda: failures.append(1))
    try:
        key = route_key(Endpoint.COMPLETIONS, b'{"prompt": "a b c"}')
        keyed = await pool.key(key)
        assert keyed.tokens == EmulatedTokenizer().encode_prompt("a b c") and keyed.text is None
        chat = route_key(Endpoint.CHAT, b'{"messages": [{"role": "user", "content": "a"}]}')
        assert (await pool.key(chat)).tokens == EmulatedTokenizer().encode_chat(
            [{"role": "user", "content": "a"}]
        )
        ids = route_key(Endpoint.COMPLETIONS, b'{"prompt": [1, 2, 3]}')
        assert await pool.key(ids) is ids  # token ids already: nothing to do
        assert await bad.key(key) is key  # routed on its text; the replica will judge it
    finally:
        pool.shutdown()
        bad.shutdown()
    assert len(costs) == 2 and all(c >= 0 for c in costs)
    assert failures == [1]


async def test_with_a_tokenizer_approximate_predictions_are_token_exact(
    make_cluster: ClusterFactory,
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
) -> None:
    """Without events but with the replicas' tokenizer, the router's own picture predicts the
    replicas' cached tokens exactly (blocks of the engine's size, the last token recomputed)."""
    cluster = await make_cluster(3, EmulatorConfig(ReplicaConfig(block_size=16), time_scale=0.01))
    gw = await make_gateway(
        cluster.urls, kv_block_size=16, tokenizer_object=EmulatedTokenizer(), **STEADY
    )
    cached = []
    for n in (100, 150, 200):
        body = {"model": "emulated", "prompt": " ".join(f"w{i}" for i in range(n)), "max_tokens": 2}
        reply = await send(session, gw.url, "/v1/completions", body)
        assert reply.usage is not None
        cached.append(reply.usage["prompt_tokens_details"]["cached_tokens"])
    assert cached == [0, 96, 144]
    async with session.get(gw.url + "/metrics") as resp:
        text = await resp.text()
    assert metric(text, "prefixroute_cache_predictions_total", outcome="exact") == 3
    assert metric(text, "prefixroute_cache_predictions_total", outcome="over") == 0
    assert metric(text, "prefixroute_cache_predictions_total", outcome="under") == 0
