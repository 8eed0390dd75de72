"""The Responses API through the picker (epp/_stored.py): a stored response's continuation,
``GET`` and ``cancel`` are picked to the replica that answered it, and to it alone (no
fallbacks); its id is noted from a stream's ``response.created`` or a plain answer's body;
per tenant, with the gateway's refusals as immediate responses."""

from __future__ import annotations

import json
from typing import Any

from prefixroute.core import ReplicaId
from prefixroute.epp import PickShared, PickStream
from prefixroute.gateway import TenancyConfig

from .support import (
    ENDPOINTS,
    pick,
    picked,
    request_headers,
    response_body,
    response_headers,
    shared,
)

SSE = "text/event-stream"
SECRET = "0123456789abcdef-tenant-salt-secret"


def responses_body(text: str, **fields: Any) -> bytes:
    return json.dumps({"model": "m", "input": text, "max_output_tokens": 2, **fields}).encode()


def created(response_id: str) -> bytes:
    data = {"type": "response.created", "response": {"id": response_id, "object": "response"}}
    return f"event: response.created\ndata: {json.dumps(data)}\n\n".encode()


async def answered(s: PickShared, response_id: str, stream: bool, text: str = "hello") -> str:
    """A Responses request picked and answered with ``response_id``: the endpoint it went to."""
    p = PickStream(s)
    out = await pick(p, responses_body(text, stream=stream), "/v1/responses")
    header = picked(out)[0]
    assert header is not None
    endpoint = header.split(",")[0]  # the primary, before any fallbacks
    assert endpoint in ENDPOINTS
    await p.handle(response_headers(200, SSE if stream else "application/json"))
    if stream:
        await p.handle(response_body(created(response_id)))
        await p.handle(response_body(b"", end_of_stream=True))
    else:
        whole = {"id": response_id, "object": "response", "usage": {"input_tokens": 3}}
        await p.handle(response_body(json.dumps(whole).encode(), end_of_stream=True))
    return endpoint


async def test_a_continuation_goes_to_the_replica_that_answered_and_to_no_fallback() -> None:
    s = shared("round_robin", fallbacks=2)  # round robin: anything else would move it
    for stream in (True, False):
        home = await answered(s, f"resp_{stream}", stream)
        for _ in range(3):
            p = PickStream(s)
            body = responses_body("next?", previous_response_id=f"resp_{stream}")
            out = await pick(p, body, "/v1/responses")
            assert picked(out) == (home, home)  # one endpoint: no fallback to a stranger
        for path in (f"/v1/responses/resp_{stream}", f"/v1/responses/resp_{stream}/cancel"):
            p = PickStream(s)
            out = await p.handle(request_headers(path, end_of_stream=True))
            assert picked(out) == (home, home)


async def test_a_stream_is_noted_as_soon_as_it_names_its_response() -> None:
    s = shared("round_robin")
    p = PickStream(s)
    home = picked(await pick(p, responses_body("hi", stream=True), "/v1/responses"))[0]
    await p.handle(response_headers(200, SSE))
    await p.handle(response_body(created("resp_early")))  # the stream goes on
    out = await pick(PickStream(s), responses_body("more", previous_response_id="resp_early"),
                     "/v1/responses")  # fmt: skip
    assert picked(out)[0] == home


async def test_unknown_ids_and_other_tenants_are_refused_and_an_unavailable_home_is_a_503() -> None:
    s = shared("round_robin", tenancy=TenancyConfig(isolation=True, cache_salt_secret=SECRET))
    home = await answered(s, "resp_a", stream=False)
    p = PickStream(s)
    out = await p.handle(request_headers("/v1/responses/resp_a", end_of_stream=True,
                                         extra={"x-tenant-id": "team-b"}))  # fmt: skip
    assert out[0].immediate_response.status.code == 404
    out = await pick(PickStream(s), responses_body("x", previous_response_id="resp_zzz"),
                     "/v1/responses")  # fmt: skip
    assert out[0].immediate_response.status.code == 404
    out = await pick(PickStream(s), responses_body("x", request_id="resp_a"), "/v1/responses")
    assert out[0].immediate_response.status.code == 400
    s.registry.record_probe(f"http://{home}", False, 100.0)  # type: ignore[arg-type]
    for _ in range(3):
        s.registry.record_failure(f"http://{home}", 100.0, "probe")  # type: ignore[arg-type]
    out = await pick(PickStream(s), responses_body("x", previous_response_id="resp_a"),
                     "/v1/responses")  # fmt: skip
    assert out[0].immediate_response.status.code == 503


async def test_a_fetch_teaches_the_router_nothing() -> None:
    """A stored response's ``GET`` computes nothing, and its usage is the stored answer's."""
    s = shared("round_robin")
    home = await answered(s, "resp_f", stream=False)
    speed = s.router.replica_load(ReplicaId(f"http://{home}")).speed
    before = (s.router.usage_reports, speed.prefill_observations, speed.whole_observations)
    for stream in (False, True):
        p = PickStream(s)
        out = await p.handle(request_headers("/v1/responses/resp_f", end_of_stream=True))
        assert picked(out)[0] == home
        usage = {"input_tokens": 900, "output_tokens": 5,
                 "input_tokens_details": {"cached_tokens": 0}}  # fmt: skip
        whole = {"id": "resp_f", "object": "response", "usage": usage}
        if stream:
            await p.handle(response_headers(200, SSE))
            delta = {"type": "response.output_text.delta", "delta": "x"}
            done = {"type": "response.completed", "response": whole}
            body = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in (delta, done))
        else:
            await p.handle(response_headers(200))
            body = json.dumps(whole).encode()
        await p.handle(response_body(body, end_of_stream=True))
    after = (s.router.usage_reports, speed.prefill_observations, speed.whole_observations)
    assert after == before


async def test_a_home_up_but_full_is_shed_with_a_429_not_a_503() -> None:
    """Up but at its in-flight cap, the home will have room: the protocol's 429 for a request
    shed under load (with Retry-After), not the 503 of no ready endpoint (epp/_candidates.py)."""
    s = shared("round_robin", max_in_flight_per_replica=1, retry_after_s=1)
    await answered(s, "resp_a", stream=False)
    body = responses_body("more", previous_response_id="resp_a")
    assert picked(await pick(PickStream(s), body, "/v1/responses"))[0]  # in flight: room taken
    out = await pick(PickStream(s), body, "/v1/responses")
    answer = out[0].immediate_response
    assert answer.status.code == 429, answer
    assert json.loads(answer.body)["error"]["code"] == "replicas_overloaded"
    headers = {h.header.key.lower(): h.header.raw_value for h in answer.headers.set_headers}
    assert headers["retry-after"] == b"1"
