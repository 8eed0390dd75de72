"""OpenAI's Responses API (``/v1/responses``) through the gateway, on emulated replicas that
answer it as vLLM does and store every answer (emulate/_responses.py).

From the spec (gateway/_responses.py, core/responses_input.py): a conversation resent whole
is routed on its prefix like a chat; its usage (``input_tokens``, cached tokens) is learned from
a whole answer and from a stream's ``response.completed``; a continuation
(``previous_response_id``), ``GET /v1/responses/{id}`` and ``cancel`` go to the replica that
stored the response, whatever the load says; ids are per tenant, and under isolation an unknown
continuation and a chosen id are refused."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from aiohttp import web

from prefixroute.core import ReplicaId
from prefixroute.gateway import Gateway, TenancyConfig
from prefixroute.gateway._state import STATE

from . import helpers as h
from .helpers import STEADY, ClusterFactory, FakeFactory, GatewayFactory, words

SECRET = "0123456789abcdef-tenant-salt-secret"
REPLICA = "x-prefixroute-replica"


async def respond(
    session: aiohttp.ClientSession, gw: Gateway, body: dict[str, Any], **kw: Any
) -> tuple[int, dict[str, str], str]:
    return await h.post_json(session, gw.url + "/v1/responses", body, **kw)


def events(raw: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in raw.split("\n") if line.startswith("data: {")]


async def test_a_conversation_resent_whole_stays_where_it_is_cached(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    cluster = await make_cluster(4)
    gw = await make_gateway(cluster.urls, **STEADY)
    items: list[dict[str, Any]] = []
    served, cached = [], []
    for turn in range(4):
        items.append({"role": "user", "content": [{"type": "input_text", "text": words(120)}]})
        body = {"instructions": words(200), "input": items, "max_output_tokens": 3,
                "stream": turn % 2 == 1}  # fmt: skip
        status, headers, raw = await respond(session, gw, body)
        assert status == 200, raw
        answer = events(raw)[-1]["response"] if body["stream"] else json.loads(raw)
        assert answer["object"] == "response" and answer["usage"]["output_tokens"] == 3
        served.append(headers[REPLICA])
        cached.append(answer["usage"]["input_tokens_details"]["cached_tokens"])
        if turn:
            assert int(headers["x-prefixroute-predicted-cached-tokens"]) > 300
        text = answer["output"][0]["content"][0]["text"]
        items.append({"role": "assistant", "content": [{"type": "output_text", "text": text}]})
    assert len(set(served)) == 1 and min(cached[1:]) > 300
    page = await h.metrics_page(session, gw)
    # Every answer's usage read, whole and streamed.
    assert h.counter(page, "prefixroute_actual_cached_tokens_total") == sum(cached)
    assert h.counter(page, "prefixroute_usage_missing_total") == 0


async def test_a_stream_is_relayed_as_sent_and_its_first_token_is_its_first_delta(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    cluster = await make_cluster(1)
    gw = await make_gateway(cluster.urls, **STEADY)
    body = {"input": words(300), "max_output_tokens": 4, "stream": True}
    status, headers, raw = await respond(session, gw, body)
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    kinds = [e["type"] for e in events(raw)]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") == 4
    assert "[DONE]" not in raw  # nothing of the chat stream's added
    page = await h.metrics_page(session, gw)
    assert h.counter(page, "prefixroute_usage_missing_total") == 0


async def test_continuations_go_to_the_replica_that_stored_the_response(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """Each continuation carries only its new input: nothing in its prefix says where the
    conversation is, and any other replica answers it 404."""
    cluster = await make_cluster(4)
    gw = await make_gateway(cluster.urls, **STEADY)
    homes: set[str] = set()
    for conversation in range(6):
        body: dict[str, Any] = {"input": f"conversation {conversation}: " + words(150),
                                "max_output_tokens": 2}  # fmt: skip
        status, headers, raw = await respond(session, gw, body)
        assert status == 200, raw
        home, previous = headers[REPLICA], json.loads(raw)["id"]
        homes.add(home)
        for turn in range(3):
            body = {"input": f"and then {turn}?", "previous_response_id": previous,
                    "max_output_tokens": 2, "stream": turn == 1}  # fmt: skip
            status, headers, raw = await respond(session, gw, body)
            assert status == 200, raw
            assert headers[REPLICA] == home
            answer = events(raw)[-1]["response"] if turn == 1 else json.loads(raw)
            assert answer["usage"]["input_tokens_details"]["cached_tokens"] > 140
            previous = answer["id"]
        async with session.get(gw.url + f"/v1/responses/{previous}") as resp:
            assert resp.status == 200 and resp.headers[REPLICA] == home
            assert (await resp.json())["id"] == previous
    assert len(homes) > 1  # the first turns were spread: the pin, not one busy replica


async def test_unknown_or_malformed_stored_responses_are_404_here(
    make_gateway: GatewayFactory, make_fake: FakeFactory, session: aiohttp.ClientSession
) -> None:
    fake = await make_fake()
    gw = await make_gateway([fake.url], **STEADY)
    for path in ("/v1/responses/resp_unknown", "/v1/responses/resp_unknown/cancel",
                 "/v1/responses/" + "a" * 257, "/v1/responses/a+b"):  # fmt: skip
        method = session.post if path.endswith("/cancel") else session.get
        async with method(gw.url + path) as resp:
            assert resp.status == 404, path
            message = (await resp.json())["error"]["message"]
            # The id is named only when it is one: no error repeats the client's bytes.
            named = "resp_unknown" in path
            assert ("with id" in message) == named and ("a" * 257) not in message, message
    assert [s.path for s in fake.seen if s.path.startswith("/v1/")] == []


async def test_a_stored_responses_replica_down_is_a_503_not_another_replica(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    cluster = await make_cluster(2)
    gw = await make_gateway(cluster.urls, health_interval_s=0.05, failure_threshold=1)
    status, headers, raw = await respond(session, gw, {"input": words(50), "max_output_tokens": 1})
    assert status == 200, raw
    home = cluster.urls.index(headers[REPLICA])
    await cluster.replicas[home].kill()
    while True:  # until the gateway's probes have taken it out
        async with session.get(gw.url + "/health") as resp:
            if (await resp.json())["ready"] == 1:
                break
        await asyncio.sleep(0.02)
    body = {"input": "more", "previous_response_id": json.loads(raw)["id"], "max_output_tokens": 1}
    status, headers, raw = await respond(session, gw, body)
    # Not the other replica (which would answer 404: it holds no such response).
    assert status == 503, raw
    assert "error" in json.loads(raw)



async def test_a_stored_responses_replica_up_but_full_is_overloaded_not_unavailable(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """Up but at its in-flight cap, the owner will have room later: the answer is the cap's
    "overloaded" 503 with Retry-After (retry), not "not available" (gateway/_responses.py)."""
    cluster = await make_cluster(2)
    gw = await make_gateway(cluster.urls, max_in_flight_per_replica=1, **STEADY)
    status, _, raw = await respond(session, gw, {"input": words(50), "max_output_tokens": 1})
    assert status == 200, raw
    previous = json.loads(raw)["id"]
    body = {"input": "go on", "previous_response_id": previous, "max_output_tokens": 4000,
            "stream": True}  # fmt: skip
    async with session.post(gw.url + "/v1/responses", json=body) as held:  # the owner's room
        assert held.status == 200
        await held.content.readline()
        body = {"input": "more", "previous_response_id": previous, "max_output_tokens": 1}
        status, headers, raw = await respond(session, gw, body)
        assert status == 503, raw
        assert json.loads(raw)["error"]["code"] == "replicas_overloaded"
        assert headers["Retry-After"] == "1"


async def test_tenants_reach_only_their_own_stored_responses(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    cluster = await make_cluster(1)  # one replica: only the gateway can keep them apart
    tenancy = TenancyConfig(isolation=True, cache_salt_secret=SECRET)
    gw = await make_gateway(cluster.urls, tenancy=tenancy, **STEADY)
    a, b = {"x-tenant-id": "team-a"}, {"x-tenant-id": "team-b"}
    status, _, raw = await respond(session, gw, {"input": words(50), "max_output_tokens": 1},
                                   headers=a)  # fmt: skip
    assert status == 200, raw
    stored = json.loads(raw)["id"]
    more = {"input": "more", "previous_response_id": stored, "max_output_tokens": 1}
    status, _, raw = await respond(session, gw, more, headers=b)
    assert status == 404 and "not found" in json.loads(raw)["error"]["message"]
    async with session.get(gw.url + f"/v1/responses/{stored}", headers=b) as resp:
        assert resp.status == 404
    async with session.get(gw.url + f"/v1/responses/{stored}", headers=a) as resp:
        assert resp.status == 200
    status, _, raw = await respond(session, gw, more, headers=a)
    assert status == 200, raw
    # Under isolation a client may not pick its response's id (it could take another's).
    chosen = {"input": "x", "request_id": stored, "max_output_tokens": 1}
    status, _, raw = await respond(session, gw, chosen, headers=b)
    assert status == 400 and "request_id" in json.loads(raw)["error"]["message"]


async def test_bad_responses_requests_are_400s_that_reach_no_replica(
    make_gateway: GatewayFactory, make_fake: FakeFactory, session: aiohttp.ClientSession
) -> None:
    fake = await make_fake()
    gw = await make_gateway([fake.url], **STEADY)
    for body in ({}, {"input": []}, {"input": "x", "previous_response_id": 5},
                 {"input": "x", "instructions": ["no"]}):  # fmt: skip
        status, _, raw = await respond(session, gw, body)
        assert status == 400, (body, raw)
        assert json.loads(raw)["error"]["message"]
    assert [s.path for s in fake.seen if s.path.startswith("/v1/")] == []


async def test_a_streamed_responses_replica_is_known_before_its_stream_ends(
    make_gateway: GatewayFactory, make_fake: FakeFactory, session: aiohttp.ClientSession
) -> None:
    """A client may continue (or fetch) a response the moment it reads ``response.completed``,
    while the replica has not closed the stream yet: the gateway must know its replica from
    the stream's first event, not from its end."""
    release = asyncio.Event()
    created = {"id": "resp_early", "object": "response", "status": "in_progress", "output": []}

    async def answer(request: web.Request) -> web.StreamResponse:
        if request.method == "GET":
            return web.json_response({**created, "status": "completed"})
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for kind, fields in (("response.created", {"response": created}),
                             ("response.output_text.delta", {"delta": "hi"}),
                             ("response.completed", {"response": created})):  # fmt: skip
            data = json.dumps({**fields, "type": kind})
            await out.write(f"event: {kind}\ndata: {data}\n\n".encode())
        await release.wait()  # the stream stays open until the client has fetched it
        await out.write_eof()
        return out

    fake = await make_fake(handler=answer)
    gw = await make_gateway([fake.url], **STEADY)
    body = {"input": "hello", "stream": True, "max_output_tokens": 1}
    async with session.post(gw.url + "/v1/responses", json=body) as stream:
        seen = b""
        while b"response.completed" not in seen:
            seen += await stream.content.readany()
        async with session.get(gw.url + "/v1/responses/resp_early") as resp:
            status = resp.status
        release.set()
        await stream.read()
    assert status == 200


async def test_two_isolated_tenants_share_no_cached_blocks_on_responses(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """The gateway's ``cache_salt`` reaches the replica on ``/v1/responses`` too: on one
    replica, the second tenant's same prompt finds nothing of the first's cached."""
    cluster = await make_cluster(1)
    tenancy = TenancyConfig(isolation=True, cache_salt_secret=SECRET)
    gw = await make_gateway(cluster.urls, tenancy=tenancy, **STEADY)
    # The client's own cache_salt is the gateway's to replace.
    body = {"instructions": words(200), "input": "hello", "max_output_tokens": 1,
            "cache_salt": "shared"}  # fmt: skip

    async def cached_as(team: str) -> int:
        status, _, raw = await respond(session, gw, body, headers={"x-tenant-id": team})
        assert status == 200, raw
        return int(json.loads(raw)["usage"]["input_tokens_details"]["cached_tokens"])

    assert await cached_as("team-a") == 0
    assert await cached_as("team-b") == 0
    assert await cached_as("team-a") > 150


async def test_fetching_a_stored_response_teaches_the_router_nothing(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """A ``GET`` computes nothing, and the usage in its answer is the stored answer's: taken as
    the fetch's own, each poll would teach the speed model a whole prompt prefilled in a
    millisecond (a client polling a background response sends many)."""
    cluster = await make_cluster(1)
    gw = await make_gateway(cluster.urls, **STEADY)
    status, _, raw = await respond(session, gw, {"input": words(300), "max_output_tokens": 3})
    assert status == 200, raw
    stored = json.loads(raw)["id"]
    speed = gw.router.replica_load(gw.router.replicas[0]).speed

    def taught() -> tuple[int, ...]:
        return (gw.router.usage_reports, speed.prefill_observations, speed.decode_observations,
                speed.whole_observations)  # fmt: skip

    before = taught()
    assert before[0] == 1  # the answer itself was learned from
    owners = gw.app[STATE].responses
    noted: list[str] = []
    answered = owners.answered

    def spy(tenant: str | None, response_id: str, replica: ReplicaId) -> None:
        noted.append(response_id)
        answered(tenant, response_id, replica)

    owners.answered = spy  # type: ignore[method-assign]
    for _ in range(5):
        async with session.get(gw.url + f"/v1/responses/{stored}") as resp:
            assert resp.status == 200
            assert (await resp.json())["usage"]["input_tokens"] > 300
    assert taught() == before
    assert noted == []  # nor is a fetch an answer to note (or to publish to other instances)
    assert gw.router.replica_load(gw.router.replicas[0]).in_flight == 0


async def test_a_streamed_fetch_is_no_first_token_to_learn_from(
    make_gateway: GatewayFactory, make_fake: FakeFactory, session: aiohttp.ClientSession
) -> None:
    """``GET /v1/responses/{id}?stream=true`` replays a stored stream: its first delta is no
    prefill's end, and its usage is the stored answer's."""
    usage = {"input_tokens": 900, "output_tokens": 5, "input_tokens_details": {"cached_tokens": 0}}
    stored = {"id": "resp_replayed", "object": "response", "usage": usage}

    async def answer(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for kind, fields in (("response.created", {"response": {**stored, "usage": None}}),
                             ("response.output_text.delta", {"delta": "hi"}),
                             ("response.completed", {"response": stored})):  # fmt: skip
            data = json.dumps({**fields, "type": kind})
            await out.write(f"event: {kind}\ndata: {data}\n\n".encode())
        await out.write_eof()
        return out

    fake = await make_fake(handler=answer)
    gw = await make_gateway([fake.url], **STEADY)
    status, _, raw = await respond(session, gw, {"input": "hi", "stream": True})
    assert status == 200, raw
    speed = gw.router.replica_load(gw.router.replicas[0]).speed
    before = (gw.router.usage_reports, speed.prefill_observations, speed.decode_observations)
    async with session.get(gw.url + "/v1/responses/resp_replayed?stream=true") as resp:
        assert resp.status == 200 and "response.completed" in await resp.text()
    assert (gw.router.usage_reports, speed.prefill_observations,
            speed.decode_observations) == before  # fmt: skip
