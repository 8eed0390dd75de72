"""A fresh gateway asks a replica's ``/tokenize`` for a model's characters per token
(``gateway/_token_probe.py``), so a burst routed before any answer's usage is not costed at the
4-characters prior (issue 11: 172,032 predicted cached tokens against 57,344 reported)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
from aiohttp import web

from prefixroute.emulate import EmulatedTokenizer, count_tokens
from prefixroute.gateway._state import STATE
from prefixroute.gateway._token_probe import PROBE_CHARS, PROBE_WAIT_S

from .fakes import FakeReplica, completion_body
from .helpers import STEADY, ClusterFactory, GatewayFactory, metrics_page
from .test_precise import metric

# Words of 9 characters with their space: about 9 characters a token under the emulated
# tokenizer (one token per word), far from the prior of 4.
TEXT = " ".join(f"w{i:07d}" for i in range(600))


@contextlib.asynccontextmanager
async def _silent_tokenize(
    answer: Callable[[], web.StreamResponse],
) -> AsyncIterator[FakeReplica]:
    """A replica whose ``/tokenize`` does not answer while the test runs, and that answers
    every other call with ``answer()``."""
    release = asyncio.Event()

    async def replica(request: web.Request) -> web.StreamResponse:
        if request.path == "/tokenize":
            await release.wait()
        return answer()

    fake = FakeReplica(replica, tokenize=True)
    await fake.start()
    try:
        yield fake
    finally:
        release.set()
        await fake.stop()


def _ratio(page: str, model: str) -> float | None:
    try:
        return metric(page, "prefixroute_chars_per_token", model=model)
    except AssertionError:
        return None


async def test_the_first_request_is_costed_at_the_replicas_count_before_any_answer(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """While the first answer is still streaming (no usage yet), the model's characters per
    token are already the replica's own count of the routing text."""
    cluster = await make_cluster(2)
    gw = await make_gateway(cluster.urls, **STEADY)
    body = {"model": "emulated", "prompt": TEXT, "max_tokens": 400, "stream": True}
    async with session.post(gw.url + "/v1/completions", json=body) as resp:
        assert resp.status == 200
        await resp.content.readline()  # its first event: routed, and not ended
        assert gw.router.usage_reports == 0
        page = await metrics_page(session, gw)
        await resp.read()
    true = len(TEXT) / count_tokens(TEXT)
    learned = _ratio(page, "emulated")
    assert learned is not None and abs(learned / true - 1) < 0.02, (learned, true)
    assert metric(page, "prefixroute_token_probes_total", outcome="learned") == 1


async def test_a_burst_on_a_fresh_gateway_asks_once_per_model(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """Eight requests at once on a fresh gateway: one probe, which they wait for (their
    predictions are made at its count), and none once the model is known."""
    counted = asyncio.Event()

    async def replica(request: web.Request) -> web.StreamResponse:
        if request.path == "/tokenize":
            asked = await request.json()
            await asyncio.sleep(0.05)  # the burst arrives meanwhile
            counted.set()
            return web.json_response({"count": count_tokens(asked["prompt"]), "tokens": []})
        assert counted.is_set(), "routed before the probe answered"
        return web.Response(body=completion_body(prompt=100), content_type="application/json")

    fake = FakeReplica(replica, tokenize=True)
    await fake.start()
    try:
        gw = await make_gateway([fake.url], **STEADY)
        body = {"model": "emulated", "prompt": TEXT, "max_tokens": 1}
        posts = [session.post(gw.url + "/v1/completions", json=body) for _ in range(8)]
        answers = await asyncio.gather(*posts)
        assert [a.status for a in answers] == [200] * 8
        probes = [s for s in fake.seen if s.path == "/tokenize"]
        assert len(probes) == 1
        # The routing text's first PROBE_CHARS characters: a sample, with the request's model.
        assert json.loads(probes[0].body) == {"prompt": TEXT[:PROBE_CHARS], "model": "emulated"}
        learned = gw.router.chars_per_token_of("emulated")
        assert learned != 4.0  # told by the probe, then by the answers' usage
    finally:
        await fake.stop()


async def test_a_replica_without_tokenize_serves_at_the_prior_and_is_not_asked_again(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """A 404 on ``/tokenize`` (most OpenAI-compatible servers): the request is served at the
    prior, the outcome is counted, and the next requests are not held up by another ask."""
    async def replica(request: web.Request) -> web.StreamResponse:
        return web.Response(body=completion_body(prompt=200), content_type="application/json")

    fake = FakeReplica(replica, tokenize=False)
    await fake.start()
    try:
        gw = await make_gateway([fake.url], **STEADY)
        body = {"model": "emulated", "prompt": "hello there " * 100, "max_tokens": 1}
        for _ in range(3):
            async with session.post(gw.url + "/v1/completions", json=body) as resp:
                assert resp.status == 200
        page = await metrics_page(session, gw)
        assert metric(page, "prefixroute_token_probes_total", outcome="unsupported") == 1
        # The answers' usage (200 prompt tokens each) teaches the ratio instead.
        assert _ratio(page, "emulated") == len("hello there " * 100) / 200
    finally:
        await fake.stop()


async def test_models_no_replica_serves_are_never_asked_nor_kept(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """A client naming models nobody serves (each request a new name) gets its 404s, and the
    gateway asks nothing and keeps nothing of them (the security audit: 300 such names of 1 MB
    each had grown the gateway by 300 MB)."""
    cluster = await make_cluster(1)
    gw = await make_gateway(cluster.urls, **STEADY)
    for i in range(20):
        body = {"model": f"nobody-{i}", "prompt": TEXT, "max_tokens": 1}
        async with session.post(gw.url + "/v1/completions", json=body) as resp:
            assert resp.status == 404
    probe = gw.app[STATE].token_probe
    assert probe is not None and probe._probes == {}
    assert "prefixroute_token_probes_total{" not in await metrics_page(session, gw)


async def test_a_tokenize_that_hangs_holds_the_first_request_only_briefly(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """A replica whose ``/tokenize`` never answers: the first request waits at most the probe's
    bound, not the probe's whole timeout (here 5 s), and is served; the probe ends failed."""

    def answer() -> web.StreamResponse:
        return web.Response(body=completion_body(), content_type="application/json")

    async with _silent_tokenize(answer) as fake:
        gw = await make_gateway([fake.url], health_timeout_s=1.0, failure_threshold=1000)
        body = {"model": "emulated", "prompt": TEXT, "max_tokens": 1}
        started = time.monotonic()
        async with session.post(gw.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200
        assert time.monotonic() - started < PROBE_WAIT_S + 0.5  # not the probe's 1 s
        await asyncio.sleep(1.2)  # the probe times out
        page = await metrics_page(session, gw)
        assert metric(page, "prefixroute_token_probes_total", outcome="failed") == 1


async def test_a_short_first_text_is_not_asked_about_and_a_longer_one_is(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """A "Hello" first (5 characters: 2 tokens, weighing less than the prior) would have left
    the model marked known at 4 characters a token (the review of 2026-12-07): it is not asked
    about, and the first text long enough is."""
    cluster = await make_cluster(1)
    gw = await make_gateway(cluster.urls, **STEADY)
    body = {"model": "emulated", "prompt": "Hello", "max_tokens": 400, "stream": True}
    async with session.post(gw.url + "/v1/completions", json=body) as resp:
        await resp.content.readline()  # routed, not ended: no usage yet
        assert not gw.router.knows_chars_per_token("emulated")
        long = {"model": "emulated", "prompt": TEXT, "max_tokens": 400, "stream": True}
        async with session.post(gw.url + "/v1/completions", json=long) as second:
            await second.content.readline()
            learned = gw.router.chars_per_token_of("emulated")
            assert abs(learned / (len(TEXT) / count_tokens(TEXT)) - 1) < 0.02, learned
            await second.read()
        await resp.read()


async def test_a_slow_probe_holds_only_the_requests_of_its_first_quarter_second(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """While a /tokenize answer takes 3 s, the requests after the first quarter second go on
    at once (each waited 0.25 s until the probe's end before the review of 2026-12-07)."""

    def answer() -> web.StreamResponse:  # no usage: nothing else tells
        return web.json_response({"choices": [{"text": "ok", "index": 0}]})

    async with _silent_tokenize(answer) as fake:
        gw = await make_gateway([fake.url], **STEADY)
        body = {"model": "emulated", "prompt": TEXT, "max_tokens": 1}
        started = time.monotonic()
        async with session.post(gw.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200
        assert time.monotonic() - started >= PROBE_WAIT_S  # it waited its quarter second
        started = time.monotonic()
        for _ in range(6):
            async with session.post(gw.url + "/v1/completions", json=body) as resp:
                assert resp.status == 200
        assert time.monotonic() - started < 0.75  # 1.5 s if each had waited 0.25 s


async def test_token_ids_and_a_tokenizer_need_no_probe(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """Token ids count exactly, so nothing is asked; nor with a tokenizer (token mode)."""
    cluster = await make_cluster(1)
    plain = await make_gateway(cluster.urls, **STEADY)
    exact = await make_gateway(cluster.urls, tokenizer_object=EmulatedTokenizer(), **STEADY)
    ids = {"model": "emulated", "prompt": list(range(1, 200)), "max_tokens": 1}
    text = {"model": "emulated", "prompt": TEXT, "max_tokens": 1}
    for gw, body in ((plain, ids), (exact, text)):
        async with session.post(gw.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200
        assert "prefixroute_token_probes_total{" not in await metrics_page(session, gw)
    assert exact.app[STATE].token_probe is None


async def test_the_emulated_replica_counts_as_vllms_tokenize(
    make_cluster: ClusterFactory, session: aiohttp.ClientSession
) -> None:
    """vLLM's ``POST /tokenize``: a prompt or chat messages in; ``count``, ``max_model_len``
    and the ``tokens`` out; an unknown model is a 404 and a body without either a 400."""
    cluster = await make_cluster(1)
    url = cluster.urls[0] + "/tokenize"
    async with session.post(url, json={"model": "emulated", "prompt": "a b, c"}) as resp:
        answer = await resp.json()
    assert resp.status == 200 and answer["count"] == 4 == len(answer["tokens"])
    assert answer["max_model_len"] > 0
    chat = {"messages": [{"role": "user", "content": "hi there"}]}
    async with session.post(url, json=chat) as resp:
        rendered = "<|user|> hi there <|end|>\n<|assistant|>"
        assert (await resp.json())["count"] == count_tokens(rendered)
    async with session.post(url, json={"model": "other", "prompt": "x"}) as resp:
        assert resp.status == 404
    async with session.post(url, json={"model": "emulated"}) as resp:
        assert resp.status == 400
