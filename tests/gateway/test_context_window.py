"""Context windows (``gateway._context_window``): in a fleet whose replicas serve one model with
different windows (vLLM's ``--max-model-len``), a request longer than one replica's window goes
to one whose window holds it. Known from each replica's ``/v1/models`` card, a window too
short keeps the request away; a 400 that says the prompt is over the window, when another
replica's is larger, moves the request there unblamed; with no larger window the 400 is the
client's, as it came."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web

from prefixroute.core import ReplicaId
from prefixroute.emulate import EmulatorConfig, start_replicas
from prefixroute.gateway import Gateway, ReplicaRegistry
from prefixroute.gateway._context_window import card_window, fitting, window_said
from prefixroute.sim.replica import ReplicaConfig

from .helpers import STEADY, FakeFactory, GatewayFactory
from .test_busy import _counter

ENGINE = ReplicaConfig(block_size=16, kv_capacity_blocks=1024)  # 16,384 tokens of KV each
SMALL, LARGE = 300, 4000  # context windows, tokens
TOKEN = "admin-token-for-tests"


def _config(window: int) -> EmulatorConfig:
    return EmulatorConfig(ENGINE, time_scale=0.01, max_model_len=window)


async def _windows_known(gw: Gateway, urls: list[str]) -> None:
    """Until the gateway has read each replica's card (its first health round)."""
    for _ in range(200):
        if all(gw.registry.find(u).context_window is not None for u in urls):
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the replicas' windows never became known")


async def _send(
    session: aiohttp.ClientSession, gw: Gateway, words: int, i: int, word: str = "word "
) -> tuple[int, str, dict[str, Any]]:
    body = {"prompt": f"q{i} " + word * words, "max_tokens": 2}
    async with session.post(gw.url + "/v1/completions", json=body) as resp:
        return resp.status, resp.headers.get("x-prefixroute-replica", ""), await resp.json()


async def test_a_prompt_over_the_small_window_is_served_by_the_large_replica(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    small = await start_replicas(1, _config(SMALL))
    large = await start_replicas(1, _config(LARGE))
    try:
        urls = [small.urls[0], large.urls[0]]
        gw = await make_gateway(
            urls, policy="round_robin", expose_replica_urls=True, admin_token=TOKEN, **STEADY
        )
        await _windows_known(gw, urls)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with session.get(gw.admin_url + "/admin/replicas", headers=headers) as resp:
            listed = {r["url"]: r["context_window"] for r in (await resp.json())["replicas"]}
        assert listed == {small.urls[0]: SMALL, large.urls[0]: LARGE}
        # 1,000 words: about 1,000 tokens (5 characters each), which the gateway counts as
        # ~1,250 at its prior 4 characters a token: over the small window by its own count.
        served = [await _send(session, gw, 1000, i) for i in range(4)]
        assert [(s, r) for s, r, _ in served] == [(200, large.urls[0])] * 4
        assert _counter(gw, "prefixroute_retries_total", reason="context_window") == 0
        # 400 tokens of 2 characters, counted under the small window at 4 or 5 characters a
        # token: round robin sends some there first, whose 400 moves them on, unblamed.
        served = [await _send(session, gw, 400, 10 + i, "x ") for i in range(4)]
        assert [(s, r) for s, r, _ in served] == [(200, large.urls[0])] * 4
        moved = _counter(gw, "prefixroute_retries_total", reason="context_window")
        assert moved >= 1
        kind = {"replica": small.urls[0], "kind": "context_window"}
        assert _counter(gw, "prefixroute_upstream_failures_total", **kind) == moved
        record = gw.registry.find(small.urls[0])
        assert record.healthy and record.total_failures == 0
        # Short prompts still go to both.
        served = [await _send(session, gw, 20, 20 + i) for i in range(4)]
        assert {r for s, r, _ in served if s == 200} == set(urls)
    finally:
        await small.stop()
        await large.stop()


async def test_a_request_refused_for_its_length_skips_every_window_as_short(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """Once a replica said its window is too short, the request needs more than that window:
    a second replica of the same window is not tried. Round robin over [small, small, large]
    (the configured order) picks each in turn, and a retry with one candidate left picks no
    turn: each small refuses two of the six, each moved once, straight to the large one. Were
    the refusal not taken as the request's size, a retry would choose between the other small
    and the large one."""
    smalls = await start_replicas(2, _config(SMALL))
    large = await start_replicas(1, _config(LARGE))
    try:
        urls = [*smalls.urls, large.urls[0]]
        gw = await make_gateway(urls, policy="round_robin", expose_replica_urls=True, **STEADY)
        await _windows_known(gw, urls)
        # Six prompts of 5-character tokens first: the gateway's characters per token near 5,
        # so the prompts of 2-character tokens after them are counted under the small window.
        # (Each of the six is routed once, to the large replica: round robin's count stays a
        # multiple of 3.)
        served = [await _send(session, gw, 1000, i) for i in range(6)]
        served += [await _send(session, gw, 400, 10 + i, "x ") for i in range(6)]
        assert [(s, r) for s, r, _ in served] == [(200, large.urls[0])] * 12
        moved = [
            _counter(gw, "prefixroute_upstream_failures_total", replica=u, kind="context_window")
            for u in smalls.urls
        ]
        assert moved == [2, 2]
        assert _counter(gw, "prefixroute_retries_total", reason="context_window") == 4
    finally:
        await smalls.stop()
        await large.stop()


async def too_long(request: web.Request) -> web.Response:
    """vLLM 0.32's 400 for a prompt over a 300-token window, whatever the prompt."""
    message = (
        "This model's maximum context length is 300 tokens. However, your prompt contains 1001 "
        "input tokens, which exceeds this limit even without any output tokens."
    )
    error = {"message": message, "type": "BadRequestError", "param": "input_tokens", "code": 400}
    return web.json_response({"error": error}, status=400)


async def test_a_window_a_replica_said_is_learned(
    make_gateway: GatewayFactory, make_fake: FakeFactory, session: aiohttp.ClientSession
) -> None:
    """A replica whose card gives no window says it in its 400: the request moves, and later
    requests that need more go elsewhere at once (round robin would have sent it every
    other one)."""
    fake = await make_fake(handler=too_long)  # its /v1/models card has no max_model_len
    large = await start_replicas(1, _config(LARGE))
    try:
        gw = await make_gateway([fake.url, large.urls[0]], policy="round_robin", **STEADY)
        await _windows_known(gw, large.urls)
        assert gw.registry.find(fake.url).context_window is None
        statuses = [(await _send(session, gw, 1000, i))[0] for i in range(4)]
        assert statuses == [200] * 4
        assert len([s for s in fake.seen if s.method == "POST"]) == 1
        assert gw.registry.find(fake.url).context_window == 300
    finally:
        await large.stop()


async def test_with_no_larger_window_the_client_gets_the_engines_400(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    cluster = await start_replicas(2, _config(SMALL))
    try:
        gw = await make_gateway(cluster.urls, **STEADY)
        await _windows_known(gw, cluster.urls)
        status, _, body = await _send(session, gw, 1000, 0)
        assert status == 400
        assert body["error"]["message"].startswith("This model's maximum context length is 300")
        assert _counter(gw, "prefixroute_retries_total", reason="context_window") == 0
        assert all(gw.registry.find(u).total_failures == 0 for u in cluster.urls)
    finally:
        await cluster.stop()


@pytest.mark.parametrize(
    ("body", "window"),
    [
        # vLLM 0.32 (renderers/params.py, entrypoints/serve/utils/api_utils.py)
        ("This model's maximum context length is 16384 tokens. However, your prompt contains "
         "20000 input tokens, which exceeds this limit even without any output tokens.", 16384),
        ("Input length (20000) exceeds model's maximum context length (8192).", 8192),
        # SGLang
        ("The input (20000 tokens) is longer than the model's context length (32768 tokens).",
         32768),
        ("Requested token count exceeds the model's maximum context length of 4096 tokens. "
         "You requested a total of 5000 tokens", 4096),
        ("Invalid 'tools' format", None),
        ("max_tokens must be at least 1, got 0.", None),
    ],
)  # fmt: skip
def test_the_engines_words_for_a_prompt_over_the_window(body: str, window: int | None) -> None:
    wrapped = {"error": {"message": body, "type": "BadRequestError", "code": 400}}
    assert window_said(json.dumps(wrapped).encode()) == window


def test_a_replicas_window_is_its_base_models_smallest() -> None:
    cards = [
        {"id": "base", "max_model_len": 8192, "parent": None},
        {"id": "lora-a", "max_model_len": 2048, "parent": "base"},  # an adapter: its base's
        {"id": "other", "max_model_len": 4096},
        {"id": "odd", "max_model_len": True},  # not a number of tokens
        {"id": "none"},
    ]
    assert card_window(cards) == 4096
    assert card_window([{"id": "x", "max_model_len": "8192"}, {"id": "y"}]) is None


def test_fitting_keeps_what_holds_the_request_else_the_largest_windows() -> None:
    windows: dict[str, int | None] = {"a": 1000, "b": 4000, "c": None, "d": 4000}
    registry = cast(ReplicaRegistry, SimpleNamespace(
        get=lambda r: SimpleNamespace(context_window=windows[r])
    ))  # fmt: skip
    every = [ReplicaId(r) for r in windows]
    assert fitting(registry, every, 1000) == every  # the window holds exactly its size
    assert fitting(registry, every, 1001) == ["b", "c", "d"]  # unknown: the engine says
    assert fitting(registry, every[:2] + every[3:], 5000) == ["b", "d"]  # none: the largest


def test_a_400_does_not_lower_the_window_a_replica_s_own_card_gives() -> None:
    """Engines quote the client's values in their 400s (vLLM's ``value=...``): a request whose
    temperature read "maximum context length is 1 tokens" set the replica's window to 1, and
    every later request went elsewhere until the next card refresh (an outside audit,
    2026-12-07). A card's window stands; where no card gives one, the 400's words are all
    there is, and they are taken."""
    from prefixroute.core import Router, make_policy
    from prefixroute.gateway import GatewayConfig
    from prefixroute.gateway._context_window import learned_window

    registry = ReplicaRegistry(Router(make_policy("round_robin")), GatewayConfig())
    carded = registry.add("http://10.0.0.1:8000")
    registry.set_models(carded.id, [{"id": "m", "max_model_len": 32768}])
    bare = registry.add("http://10.0.0.2:8000")
    registry.set_models(bare.id, [{"id": "m"}])
    said = window_said(b'{"message": "temperature: value=maximum context length is 1 tokens"}')
    assert said == 1  # the words alone cannot tell a quote from the engine's own
    learned_window(registry, carded.id, said)
    learned_window(registry, bare.id, 300)
    assert (carded.context_window, bare.context_window) == (32768, 300)
