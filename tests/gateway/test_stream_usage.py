"""Streams report usage only when asked (``stream_options.include_usage``), and most streaming
clients do not ask. The gateway asks on their behalf and keeps that usage event from them
(``gateway._usage``, ``stream_usage``): the router learns from every stream, and the client
gets the stream it asked for. Replicas here send usage only when asked, as vLLM by default."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from prefixroute.gateway import Gateway
from prefixroute.gateway._state import STATE

from .fakes import one_event_stream
from .helpers import FAST_REPLICA, ClusterFactory, FakeFactory, GatewayFactory, parse_stream

WHEN_ASKED = dataclasses.replace(FAST_REPLICA, force_usage=False)  # vLLM's default
PROMPT = " ".join(f"w{i}" for i in range(300))


def _total(gw: Gateway, name: str) -> float:
    """A counter's value summed over its replicas."""
    registry = gw.app[STATE].metrics.registry
    return sum(
        s.value for m in registry.collect() for s in m.samples if s.name == name
    )  # fmt: skip


async def _stream(
    session: aiohttp.ClientSession, gw: Gateway, **fields: Any
) -> tuple[list[Any], bool, str]:
    body = {"prompt": PROMPT, "max_tokens": 5, "stream": True, **fields}
    async with session.post(gw.url + "/v1/completions", json=body) as resp:
        assert resp.status == 200
        raw = await resp.text()
    events, done = parse_stream(raw)
    return events, done, raw


async def _gateway(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, **settings: Any
) -> Gateway:
    cluster = await make_cluster(1, WHEN_ASKED)
    return await make_gateway(cluster.urls, **settings)


@pytest.mark.parametrize(
    "options",
    [None, {"include_usage": False}],
    ids=["no stream_options", "include_usage false"],
)
async def test_the_gateway_learns_a_streams_usage_the_client_did_not_ask_for(
    make_cluster: ClusterFactory,
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
    options: dict[str, Any] | None,
) -> None:
    gw = await _gateway(make_cluster, make_gateway)
    fields = {} if options is None else {"stream_options": options}
    for _ in range(2):  # the second is served from the first one's cache
        events, done, _ = await _stream(session, gw, **fields)
        assert done
        assert all(e.get("choices") for e in events), "a usage event reached the client"
        assert "".join(e["choices"][0]["text"] for e in events)  # the tokens all came
    assert _total(gw, "prefixroute_usage_missing_total") == 0
    assert _total(gw, "prefixroute_prompt_tokens_total") > 0
    assert _total(gw, "prefixroute_actual_cached_tokens_total") > 0


@pytest.mark.parametrize(
    "options",
    [{"include_usage": True}, {}, {"continuous_usage_stats": False}],
    ids=["include_usage true", "empty stream_options", "without include_usage"],
)
async def test_a_client_that_sent_stream_options_gets_what_the_replica_sends(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession,
    options: dict[str, Any],
) -> None:
    """A ``stream_options`` object is the client's and the engine's business: with
    ``include_usage`` true the client gets its usage event; without it, what the engine does
    (SGLang defaults it to true, vLLM 0.32 and this emulated vLLM to false). Either way the
    client's stream is the replica's, event for event, as if it had called it directly."""
    cluster = await make_cluster(1, WHEN_ASKED)
    gw = await make_gateway(cluster.urls)
    body = {"prompt": PROMPT, "max_tokens": 5, "stream": True, "stream_options": options}
    async with session.post(cluster.urls[0] + "/v1/completions", json=body) as resp:
        direct, _ = parse_stream(await resp.text())
    events, done, _ = await _stream(session, gw, stream_options=options)
    assert done
    assert [bool(e["choices"]) for e in events] == [bool(e["choices"]) for e in direct]
    asked = bool(options.get("include_usage"))
    assert ("usage" in events[-1]) == ("usage" in direct[-1]) == asked
    if asked:
        assert events[-1]["choices"] == [] and events[-1]["usage"]["prompt_tokens"] > 0


async def test_with_stream_usage_off_streams_go_as_sent(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    gw = await _gateway(make_cluster, make_gateway, stream_usage=False)
    events, done, _ = await _stream(session, gw)
    assert done and all(e.get("choices") for e in events)
    assert _total(gw, "prefixroute_usage_missing_total") == 1  # nothing to learn from
    assert _total(gw, "prefixroute_prompt_tokens_total") == 0


async def test_plain_answers_and_other_calls_are_not_touched(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    # A replica refuses stream_options on a request that does not stream (vLLM's rule, which
    # the emulator keeps): the gateway must not add it there.
    gw = await _gateway(make_cluster, make_gateway)
    body = {"prompt": PROMPT, "max_tokens": 3}
    async with session.post(gw.url + "/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["usage"]["prompt_tokens"] > 0


async def _strict(request: web.Request) -> web.StreamResponse:
    """A server that rejects fields it does not know, stream_options among them (pydantic's
    ``extra="forbid"``), and otherwise streams one event; the prompt "bad" is refused first."""
    body = await request.json()
    if body.get("prompt") == "bad":
        return web.json_response({"error": {"message": "bad prompt", "code": 400}}, status=400)
    if "stream_options" in body:
        error = {"message": "stream_options: Extra inputs are not permitted", "code": 400}
        return web.json_response({"error": error}, status=400)
    return await one_event_stream(request)


async def test_a_replica_that_refuses_stream_options_gets_the_request_as_sent(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    # The client must never get a 400 for a field the gateway added: the request goes again
    # as the client sent it, and the gateway stops asking (one refusal, not one per request).
    fake = await make_fake(handler=_strict)
    gw = await make_gateway([fake.url])
    for _ in range(3):
        body = {"prompt": "hello", "max_tokens": 1, "stream": True}
        async with session.post(gw.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            events, done = parse_stream(await resp.text())
        assert done and events[0]["choices"][0]["text"] == "ok"
    sent = [json.loads(s.body) for s in fake.seen if s.path == "/v1/completions"]
    assert ["stream_options" in b for b in sent] == [True, False, False, False]


async def test_any_other_400_is_the_clients_and_is_not_sent_again(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    fake = await make_fake(handler=_strict)
    gw = await make_gateway([fake.url])
    body = {"prompt": "bad", "max_tokens": 1, "stream": True}  # usage asked, prompt refused
    async with session.post(gw.url + "/v1/completions", json=body) as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["message"] == "bad prompt"
    assert len([s for s in fake.seen if s.path == "/v1/completions"]) == 1
    assert gw.app[STATE].asks_stream_usage  # nothing the gateway added was refused


async def _compressing(request: web.Request) -> web.StreamResponse:
    """A server that compresses its event stream whenever the client accepts gzip (as one
    behind a compressing middleware does), and sends the usage event only when asked."""
    if request.method != "POST":  # health probes
        return web.Response()
    body = await request.json()
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    out.enable_compression()  # honours the request's Accept-Encoding
    await out.prepare(request)
    await out.write(b'data: {"choices":[{"text":"ok"}]}\n\n')
    if (body.get("stream_options") or {}).get("include_usage"):
        usage = {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8,
                 "prompt_tokens_details": {"cached_tokens": 0}}
        await out.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
    await out.write(b"data: [DONE]\n\n")
    await out.write_eof()
    return out


async def test_a_compressing_replica_cannot_hand_the_client_the_usage_it_did_not_ask_for(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    # A compressed stream cannot be read event by event, so the gateway could not keep the
    # usage event it asked for from the client: it asks such streams for no compression.
    fake = await make_fake(handler=_compressing)
    gw = await make_gateway([fake.url])
    body = {"prompt": "hello", "max_tokens": 1, "stream": True}
    headers = {"Accept-Encoding": "gzip, deflate"}
    async with session.post(gw.url + "/v1/completions", json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        events, done = parse_stream(await resp.text())
    assert done
    assert all(e.get("choices") for e in events), "a usage event reached the client"
    assert _total(gw, "prefixroute_prompt_tokens_total") == 7  # and the gateway read it
    sent = [s for s in fake.seen if s.path == "/v1/completions"]
    assert sent[0].headers.get("Accept-Encoding") == "identity"


async def test_a_client_that_asked_for_usage_keeps_its_accept_encoding(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    fake = await make_fake(handler=_compressing)
    gw = await make_gateway([fake.url])
    body = {"prompt": "hello", "max_tokens": 1, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    headers = {"Accept-Encoding": "gzip"}
    async with session.post(gw.url + "/v1/completions", json=body, headers=headers) as resp:
        assert resp.status == 200
        events, done = parse_stream(await resp.text())
    assert done and events[-1]["usage"]["prompt_tokens"] == 7
    sent = [s for s in fake.seen if s.path == "/v1/completions"]
    assert sent[0].headers["Accept-Encoding"] == "gzip"


async def _shouting(request: web.Request) -> web.StreamResponse:
    """A stream sent as ``Text/Event-Stream`` (media types are case-insensitive), with the usage
    event that was asked for."""
    out = web.StreamResponse(headers={"Content-Type": "Text/Event-Stream; Charset=UTF-8"})
    await out.prepare(request)
    usage = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6,
             "prompt_tokens_details": {"cached_tokens": 4}}  # fmt: skip
    await out.write(b'data: {"choices":[{"index":0,"text":"ok"}]}\n\n')
    await out.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
    await out.write(b"data: [DONE]\n\n")
    await out.write_eof()
    return out


async def test_a_stream_whose_content_type_is_not_lower_case_is_relayed_as_a_stream(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """Scanned as a stream: the usage event the gateway asked for is kept from the client and
    learned from. Before, a case-sensitive check relayed it as a plain answer: buffered whole,
    the usage event leaked to the client, nothing learned."""
    fake = await make_fake(handler=_shouting)
    gw = await make_gateway([fake.url])
    body = {"prompt": "hello", "max_tokens": 1, "stream": True}
    async with session.post(gw.url + "/v1/completions", json=body) as resp:
        assert resp.status == 200
        assert "Content-Length" not in resp.headers  # relayed as it came, not buffered whole
        events, done = parse_stream(await resp.text())
    assert done and [e["choices"][0]["text"] for e in events] == ["ok"]
    assert _total(gw, "prefixroute_actual_cached_tokens_total") == 4
