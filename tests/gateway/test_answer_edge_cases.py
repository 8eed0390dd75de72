"""What a replica's answer may say beyond a plain success, as real engines say it, and what the
gateway learns from it (an outside audit, 2026-12-02, found each of these wrong; every test here
failed on the code before it).

- A client's own 400 may quote the whole body, the ``stream_options`` the gateway added
  included (vLLM's and SGLang's validation errors do): that is no refusal of the field.
- A stream may report an error in-band (``200``, then ``data: {"error": ...}``): no first token,
  no success (docs/gateway.md).
- A connection reset is a broken connection, as a close is.
- A batch of prompts is keyed on its first, but its usage counts them all: it teaches no
  characters per token. ``n`` choices decode side by side: their tokens teach no decode step.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from polling import until

from prefixroute.gateway._state import STATE

from .fakes import ClosingReplica, completion_body
from .helpers import FakeFactory, GatewayFactory
from .test_precise import metric, metrics


async def _json(request: web.Request) -> Any:
    raw = await request.read()
    return json.loads(raw) if raw else None


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion, "prompt_tokens_details": {"cached_tokens": 0}}


# --- 1 -------------------------------------------------------------------------------------
async def _vllm_validation_400(request: web.Request) -> web.StreamResponse:
    """vLLM/SGLang answer a request-level validation error with str(exc) + str(exc.errors()),
    whose 'input' is the whole body, the added stream_options included."""
    body = await _json(request)
    if body and body.get("tool_choice") and not body.get("tools"):
        msg = f"Value error, When using `tool_choice`, `tools` must be set. [input_value={body!r}]"
        return web.json_response({"error": {"message": msg, "code": 400}}, status=400)
    return web.Response(body=completion_body(), content_type="application/json")


async def test_a_clients_own_400_quoting_our_field_keeps_the_asking_on(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    fake = await make_fake(handler=_vllm_validation_400)
    gw = await make_gateway([fake.url])
    bad = {"model": "emulated", "messages": [{"role": "user", "content": "hi"}],
           "stream": True, "tool_choice": "auto"}  # fmt: skip
    async with session.post(gw.url + "/v1/chat/completions", json=bad) as resp:
        assert resp.status == 400  # the client's own fault, relayed
        assert "tool_choice" in await resp.text()
    # Sent again as the client sent it (to tell), and refused alike: the request's fault.
    assert [s.method for s in fake.seen].count("POST") == 2
    assert gw.app[STATE].asks_stream_usage
    # A replica that took the field before: its later 400 naming it changes nothing either.
    good = dict(bad, messages=[{"role": "user", "content": "hello"}])
    del good["tool_choice"]
    async with session.post(gw.url + "/v1/chat/completions", json=good) as resp:
        assert resp.status == 200
    gw.app[STATE].stop_asking_stream_usage(gw.app[STATE].registry.public_name(
        next(iter(gw.app[STATE].registry)).id))  # fmt: skip
    assert gw.app[STATE].asks_stream_usage


# --- 2 -------------------------------------------------------------------------------------
async def _error_event(request: web.Request) -> web.StreamResponse:
    await request.read()
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await out.prepare(request)
    await out.write(b'data: {"error":{"object":"error","message":"engine failed",'
                    b'"type":"InternalServerError","code":500}}\n\ndata: [DONE]\n\n')
    await out.write_eof()
    return out


async def test_a_stream_that_reports_an_error_teaches_no_first_token_and_is_no_success(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    # Two replicas: a request that could go nowhere else is judged by nothing (_verdict).
    fakes = [await make_fake(handler=_error_event) for _ in range(2)]
    gw = await make_gateway([f.url for f in fakes], policy="round_robin")
    for _ in range(3):
        body = {"model": "emulated", "prompt": "hello " * 200, "stream": True}
        async with session.post(gw.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200 and '"engine failed"' in await resp.text()  # as it came
    state = gw.app[STATE]
    for record in state.registry:
        assert state.router.replica_load(record.id).speed.prefill_observations == 0
    outcomes = [ok for record in state.registry for _, ok in record.outcomes]
    assert len(outcomes) == 3 and not any(outcomes)
    text = await metrics(session, gw.url)
    assert metric(text, "prefixroute_upstream_failures_total", kind="error_event") == 3
    assert metric(text, "prefixroute_usage_missing_total") == 0  # an error is no usage missing


# --- 3 -------------------------------------------------------------------------------------
async def test_a_connection_reset_is_a_broken_connection(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    fake = ClosingReplica(reset=True, every_post=True, delay_s=0.05)  # RST, not FIN
    await fake.start()
    good = await make_fake()
    try:
        # Beside a replica that answers, whose success convicts it (_verdict).
        gw = await make_gateway([fake.url, good.url], failure_threshold=1, eject_s=30,
                                policy="round_robin")  # fmt: skip
        registry = gw.app[STATE].registry
        await until(lambda: len(registry.candidates(None)) == 2)
        for _ in range(2):  # one of them starts on the replica that resets
            async with session.post(gw.url + "/v1/completions", json={"prompt": "hi"}) as resp:
                assert resp.status == 200  # retried onto the good one
        record = registry.find(fake.url)
        assert record.total_failures == 1 and not record.healthy  # as a close (FIN) is
    finally:
        await fake.stop()


# --- 4 / 5 ---------------------------------------------------------------------------------
async def _vllm_usage(request: web.Request) -> web.StreamResponse:
    """Usage as vLLM counts it: prompt tokens summed over a batch's prompts, completion tokens
    over every choice. 4 characters a token; 10 ms a decode step whatever n is."""
    body = await _json(request)
    if body is None:
        return web.Response()
    prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
    n, per = body.get("n", 1), body.get("max_tokens", 16)
    usage = _usage(sum(len(p) // 4 for p in prompts), per * n * len(prompts))
    if not body.get("stream"):
        count = n * len(prompts)
        choices = [{"index": i, "text": "x", "finish_reason": "length"} for i in range(count)]
        return web.json_response({"object": "text_completion", "choices": choices, "usage": usage})
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await out.prepare(request)
    for _ in range(per):
        for i in range(n):
            await out.write(b'data: {"choices":[{"index":%d,"text":" x"}]}\n\n' % i)
        await asyncio.sleep(0.01)
    await out.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
    await out.write(b"data: [DONE]\n\n")
    await out.write_eof()
    return out


async def test_a_batch_of_prompts_teaches_no_characters_per_token(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    fake = await make_fake(handler=_vllm_usage)
    gw = await make_gateway([fake.url])
    for i in range(40):
        prompts = [f"{i:03d} {j} " + "abcd" * 100 for j in range(8)]
        body = {"model": "emulated", "prompt": prompts, "max_tokens": 2}
        async with session.post(gw.url + "/v1/completions", json=body) as r:
            assert r.status == 200
    single = {"model": "emulated", "prompt": "abcd" * 100, "max_tokens": 2}
    for _ in range(8):
        async with session.post(gw.url + "/v1/completions", json=single) as r:
            assert r.status == 200
    learned = gw.app[STATE].router.chars_per_token()["emulated"].value
    assert 3.0 < learned < 5.0, learned  # the fake's 4 (was 0.50: 8 prompts' tokens, 1's chars)


async def test_n_choices_teach_no_decode_step(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    steps: dict[int, float] = {}
    observed: dict[int, int] = {}
    for n in (1, 8):
        fake = await make_fake(handler=_vllm_usage)
        gw = await make_gateway([fake.url])
        for i in range(12):
            body = {"model": "emulated", "prompt": f"{i} " + "abcd" * 50, "max_tokens": 20,
                    "n": n, "stream": True}
            async with session.post(gw.url + "/v1/completions", json=body) as r:
                await r.read()
        state = gw.app[STATE]
        speed = state.router.replica_load(next(iter(state.registry)).id).speed
        steps[n], observed[n] = speed.decode_step_s, speed.decode_observations
    assert observed[1] == 12 and observed[8] == 0, observed
    assert steps[8] > steps[1] / 2, steps  # was ~0.0014 s against ~0.011 s


async def _slow(request: web.Request) -> web.StreamResponse:
    await request.read()
    await asyncio.sleep(2.0)
    return web.Response(body=completion_body(), content_type="application/json")


async def test_a_request_whose_client_went_away_is_counted_as_499(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client that leaves before its answer (its handler is cancelled) is still a request:
    ``prefixroute_requests_total`` counts it with nginx's 499, labelled by the replica it was
    routed to. It was counted nowhere. And, as every client mistake (docs/security.md), it is
    one DEBUG line: it was none."""
    fake = await make_fake(handler=_slow)
    gw = await make_gateway([fake.url])
    caplog.set_level(logging.DEBUG, logger="prefixroute")
    with contextlib.suppress(TimeoutError):
        async with session.post(
            gw.url + "/v1/completions", json={"model": "emulated", "prompt": "hi " * 50},
            timeout=aiohttp.ClientTimeout(total=0.3),
        ) as resp:  # fmt: skip
            await resp.read()

    async def counted() -> bool:
        text = await metrics(session, gw.url)
        return 'status="499"' in text

    await until(counted)
    text = await metrics(session, gw.url)
    assert metric(text, "prefixroute_requests_total", status="499") == 1
    line = next(x for x in text.splitlines() if 'status="499"' in x)
    assert 'replica="none"' not in line  # routed: it names the replica it waited on
    gone = [r for r in caplog.records if "499 the client went away" in r.getMessage()]
    assert len(gone) == 1 and gone[0].levelno == logging.DEBUG
