"""One ext_proc stream, message by message, as Envoy drives it (protocol v1.0.0, proposal 004).

The last part: fallback endpoints (v1.0.0), ``ip:port,ip:port,...``, the primary first, in the
header and the ``envoy.lb`` metadata alike; the fallbacks are the policy's next choices."""

from __future__ import annotations

import json
from typing import Any

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from prefixroute.core import DEFAULT_POLICY, ReplicaId
from prefixroute.epp import EppConfig, PickShared, PickStream
from prefixroute.gateway import GatewayConfig, RequestTracing

from .support import (
    BUFFERED,
    ENDPOINTS,
    FULL_DUPLEX,
    STREAMED,
    completion,
    pick,
    picked,
    request_body,
    request_headers,
    response_body,
    response_headers,
    set_headers,
    shared,
)


async def test_full_duplex_answers_at_the_body_end_with_header_and_metadata_alike() -> None:
    s = shared()
    stream = PickStream(s)
    assert await stream.handle(request_headers()) == []
    body = completion(300)
    assert await stream.handle(request_body(body[:100], end_of_stream=False)) == []
    out = await stream.handle(request_body(body[100:]))
    assert [r.WhichOneof("response") for r in out] == ["request_headers", "request_body"]
    header, meta = picked(out)
    assert header in ENDPOINTS
    assert meta == header  # the protocol: never two different values
    streamed = out[1].request_body.response.body_mutation.streamed_response
    assert streamed.body == body and streamed.end_of_stream  # the whole body goes on unchanged
    assert s.router.loads.get(stream.decision.replica).in_flight == 1  # type: ignore[union-attr]


async def test_buffered_mode_continues_headers_then_picks_in_the_body_answer() -> None:
    stream = PickStream(shared())
    first = await stream.handle(request_headers(mode=BUFFERED))
    assert [r.WhichOneof("response") for r in first] == ["request_headers"]
    assert set_headers(first[0].request_headers.response.header_mutation) == {}
    out = await stream.handle(request_body(completion(50)))
    assert [r.WhichOneof("response") for r in out] == ["request_body"]
    assert not out[0].request_body.response.body_mutation.HasField("streamed_response")
    header, meta = picked(out)
    assert header in ENDPOINTS and meta == header


async def test_a_request_without_body_is_picked_on_its_headers() -> None:
    stream = PickStream(shared())
    out = await stream.handle(request_headers("/v1/models", end_of_stream=True))
    header, meta = picked(out)
    assert header in ENDPOINTS and meta == header


async def test_the_conversation_stays_where_its_prefix_is() -> None:
    s = shared()
    first = picked(await pick(PickStream(s), completion(400)))[0]
    for n in (700, 1000, 1400):
        assert picked(await pick(PickStream(s), completion(n)))[0] == first
    other = picked(await pick(PickStream(s), completion(400).replace(b"w", b"x")))[0]
    assert other != first  # a fresh prompt goes to a less loaded replica


async def test_round_robin_uses_the_same_router_objects() -> None:
    s = shared("round_robin")
    seen = [picked(await pick(PickStream(s), completion(10)))[0] for _ in range(3)]
    assert sorted(seen) == sorted(ENDPOINTS)


async def test_the_subset_hint_is_obeyed() -> None:
    s = shared()
    for _ in range(6):
        stream = PickStream(s)
        assert await stream.handle(request_headers(subset=[ENDPOINTS[2]])) == []
        assert picked(await stream.handle(request_body(completion(20))))[0] == ENDPOINTS[2]


async def test_a_subset_entry_without_a_port_names_every_endpoint_at_that_ip() -> None:
    """The reference picker compares a hint's IPs only; an entry without a port was refused
    here as malformed, and a hint of pod IPs was answered 503."""
    pool = ("10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.2:8000", "[fd00::7]:8000")
    s = shared("round_robin", pool)
    for subset, allowed in (
        (["10.0.0.1"], pool[:2]), (["[fd00:0::7]"], pool[3:]), ([" 10.0.0.1:8001 "], pool[1:2])
    ):
        seen = set()
        for _ in range(6):
            stream = PickStream(s)
            assert await stream.handle(request_headers(subset=subset)) == []
            seen.add(picked(await stream.handle(request_body(completion(20))))[0])
        assert seen == set(allowed)


async def test_a_subset_with_nothing_eligible_is_a_503() -> None:
    for subset in ([], ["10.9.9.9:1"], ["10.9.9.9"], ["not an endpoint"]):
        stream = PickStream(shared())
        await stream.handle(request_headers(subset=subset))
        out = await stream.handle(request_body(completion(20)))
        assert [r.WhichOneof("response") for r in out] == ["immediate_response"]
        assert out[0].immediate_response.status.code == 503
        assert json.loads(out[0].immediate_response.body)["error"]["code"] == "no_replica_available"


def shed_answer(out: list[Any]) -> dict[str, Any]:
    """The 429 of a request the picker sheds (protocol 004: 503 is for no ready endpoint)."""
    assert [r.WhichOneof("response") for r in out] == ["immediate_response"]
    answer = out[0].immediate_response
    assert answer.status.code == 429
    retry = {h.header.key.lower(): h.header.raw_value for h in answer.headers.set_headers}
    assert retry["retry-after"] == b"1"
    return dict(json.loads(answer.body)["error"])


async def test_every_endpoint_at_its_in_flight_cap_is_a_429_subset_or_not() -> None:
    """It was a 503 (serve's answer), and with a subset hint naming a replica up but full, a
    503 saying "none of the 1 endpoints of the proxy's subset hint is eligible"."""
    s = shared(endpoints=ENDPOINTS[:2], max_in_flight_per_replica=1, retry_after_s=1)
    for _ in range(2):  # both endpoints take one and are full
        assert picked(await pick(PickStream(s), completion(20)))[0]
    assert shed_answer(await pick(PickStream(s), completion(20)))["code"] == "replicas_overloaded"
    stream = PickStream(s)
    await stream.handle(request_headers(subset=[ENDPOINTS[1]]))
    assert shed_answer(await stream.handle(request_body(completion(20))))["code"] == (
        "replicas_overloaded"
    )


async def test_an_unhealthy_endpoint_is_not_picked() -> None:
    s = shared()
    for endpoint in ENDPOINTS[:2]:
        s.registry.record_probe(f"http://{endpoint}", False, 100.0)  # type: ignore[arg-type]
        for _ in range(3):
            s.registry.record_failure(f"http://{endpoint}", 100.0, "probe")  # type: ignore[arg-type]
    for _ in range(4):
        assert picked(await pick(PickStream(s), completion(30)))[0] == ENDPOINTS[2]


async def test_a_body_that_is_not_json_is_a_400_from_the_gateway_table() -> None:
    stream = PickStream(shared())
    out = await pick(stream, b"{not json")
    assert out[0].immediate_response.status.code == 400
    assert json.loads(out[0].immediate_response.body)["error"]["code"] == "invalid_json"
    stream.close()  # nothing was routed: nothing to release


async def test_a_stream_feeds_first_token_usage_and_completion() -> None:
    s = shared()
    stream = PickStream(s)
    await pick(stream, completion(100, stream=True))
    replica = stream.decision.replica  # type: ignore[union-attr]
    load = s.router.loads.get(replica)
    out = await stream.handle(response_headers(content_type="text/event-stream"))
    headers = set_headers(out[0].response_headers.response.header_mutation)
    assert headers["x-prefixroute-reason"] == stream.decision.reason.value  # type: ignore[union-attr]
    assert headers["x-prefixroute-predicted-cached-tokens"] == "0"
    assert (load.in_flight, load.prefilling) == (1, 1)
    s.clock.now = 100.5  # type: ignore[attr-defined]
    chunk = b'data: {"choices":[{"text":"a"}]}\n\n'
    back = await stream.handle(response_body(chunk))
    assert back[0].response_body.response.body_mutation.streamed_response.body == chunk
    assert (load.in_flight, load.prefilling) == (1, 0)  # the first token came back
    usage = {
        "prompt_tokens": 100, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 0}
    }  # fmt: skip
    final = f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode()
    await stream.handle(response_body(final, end_of_stream=True))
    assert load.in_flight == 0
    assert s.router.usage_reports == 1
    stream.close()  # already released: a second release does nothing
    assert load.in_flight == 0


@pytest.mark.parametrize(("code", "errors"), [(500, 1), (400, 0)])
async def test_a_stream_reporting_an_error_in_band_times_no_first_token(
    code: int, errors: int
) -> None:
    """``data: {"error": ...}`` in a 200 stream (gateway._sse): no first token is learned, and
    the replica is judged as the gateway judges it: a 5xx in its error rate, a 4xx not at all,
    neither a success."""
    s, stream, replica = await routed_stream(100)
    record = s.registry.get(replica)
    await stream.handle(response_headers(content_type="text/event-stream"))
    s.clock.now += 0.5  # type: ignore[attr-defined]
    event = b'data: {"error":{"message":"failed","code":%d}}\n\ndata: [DONE]\n\n' % code
    back = await stream.handle(response_body(event, end_of_stream=True))
    assert back[0].response_body.response.body_mutation.streamed_response.body == event
    assert s.router.replica_load(replica).speed.prefill_observations == 0
    assert s.router.replica_load(replica).in_flight == 0
    assert not any(ok for _, ok in record.outcomes)
    assert len(record.outcomes) == errors


async def test_a_plain_answer_reports_usage_at_its_end() -> None:
    s = shared()
    stream = PickStream(s)
    await pick(stream, completion(100))
    await stream.handle(response_headers())
    body = json.dumps(
        {"usage": {"prompt_tokens": 100, "completion_tokens": 4,
                   "prompt_tokens_details": {"cached_tokens": 64}}}
    ).encode()  # fmt: skip
    await stream.handle(response_body(body[:10]))
    assert s.router.usage_reports == 0
    await stream.handle(response_body(body[10:], end_of_stream=True))
    assert s.router.usage_reports == 1
    assert s.router.loads.get(stream.decision.replica).in_flight == 0  # type: ignore[union-attr]


async def routed_stream(words: int) -> tuple[PickShared, PickStream, ReplicaId]:
    """A fresh picker's stream that picked for a ``words``-word completion, and its replica."""
    s = shared()
    stream = PickStream(s)
    await pick(stream, completion(words))
    assert stream.decision is not None
    return s, stream, stream.decision.replica


async def test_a_stream_cut_before_the_answer_releases_the_request() -> None:
    s, stream, replica = await routed_stream(100)
    assert s.router.loads.get(replica).in_flight == 1
    stream.close()
    assert s.router.loads.get(replica).in_flight == 0
    assert s.router.usage_reports == 0


async def test_an_envoy_503_counts_against_the_replica() -> None:
    s, stream, replica = await routed_stream(10)
    await stream.handle(response_headers(503, "text/plain", end_of_stream=True))
    assert s.registry.get(replica).failures == 1
    assert s.router.loads.get(replica).in_flight == 0


@pytest.mark.parametrize(("status", "kept"), [(429, False), (400, False), (200, True), (503, True)])
async def test_a_request_the_replica_turned_away_leaves_no_blocks_in_its_index(
    status: int, kept: bool
) -> None:
    # As the gateway's relay (tests/gateway/test_withdraw.py): a 4xx (SGLang's queue-full 429,
    # vLLM's too-long 400) computed none of the prompt; a 200 did, and a 5xx may have.
    s, stream, replica = await routed_stream(200)
    assert s.router.indexed_blocks(replica) > 0  # the decision's own insert
    await stream.handle(response_headers(status, "application/json", end_of_stream=True))
    assert (s.router.indexed_blocks(replica) > 0) is kept
    assert s.router.loads.get(replica).in_flight == 0


async def test_a_turned_away_request_keeps_blocks_an_earlier_answer_taught() -> None:
    s = shared()
    first = PickStream(s)
    await pick(first, completion(200))
    replica = first.decision.replica  # type: ignore[union-attr]
    await first.handle(response_headers(200, "application/json", end_of_stream=True))
    held = s.router.indexed_blocks(replica)
    second = PickStream(s)  # the same prompt and more: only the new tail is its own
    await pick(second, completion(300))
    assert second.decision.replica == replica  # type: ignore[union-attr]
    assert s.router.indexed_blocks(replica) > held
    await second.handle(response_headers(429, "application/json", end_of_stream=True))
    assert s.router.indexed_blocks(replica) == held


# --- fallback endpoints -----------------------------------------------------------------
FOUR = (*ENDPOINTS, "10.0.0.4:8000")


def destinations(out: list[Any]) -> list[str]:
    header, meta = picked(out)
    assert header is not None and header == meta  # never two different values
    return header.split(",")


@pytest.mark.parametrize("policy", ["round_robin", "least_loaded", DEFAULT_POLICY])
async def test_the_list_names_distinct_endpoints_primary_first(policy: str) -> None:
    s = shared(policy, FOUR, fallbacks=2)
    stream = PickStream(s)
    names = destinations(await pick(stream, completion(50)))
    assert len(names) == 3 and len(set(names)) == 3 and set(names) <= set(FOUR)
    assert stream.decision is not None and names[0] == stream.decision.replica.split("//")[1]
    assert s.router.loads.get(stream.decision.replica).in_flight == 1  # only the primary's


async def test_fallbacks_do_not_change_the_primary() -> None:
    """The same requests, with and without fallbacks, go to the same primaries (explaining
    the next choices uses up no turn or draw of the policy)."""
    plain, listed = shared("random", FOUR), shared("random", FOUR, fallbacks=3)
    for n in range(8):
        body = completion(20 + n, tag=f"t{n}")
        one = destinations(await pick(PickStream(plain), body))
        many = destinations(await pick(PickStream(listed), body))
        assert len(one) == 1 and len(many) == 4 and many[0] == one[0]


async def test_the_first_fallback_is_the_policys_next_choice() -> None:
    """Least loaded, the first two endpoints busy: primary and fallback are the two idle ones
    (not the next in the pool's order, which is busy)."""
    s = shared("least_loaded", FOUR, fallbacks=1)
    for busy in FOUR[:2]:
        stream = PickStream(s)
        assert await stream.handle(request_headers(subset=[busy])) == []
        await stream.handle(request_body(completion(10, tag=busy)))
    names = destinations(await pick(PickStream(s), completion(10)))
    assert sorted(names) == sorted(FOUR[2:])


async def test_the_list_stays_within_the_subset_and_the_candidates() -> None:
    s = shared("round_robin", FOUR, fallbacks=5)
    stream = PickStream(s)
    assert await stream.handle(request_headers(subset=[FOUR[1], FOUR[3]])) == []
    names = destinations(await stream.handle(request_body(completion(10))))
    assert sorted(names) == sorted([FOUR[1], FOUR[3]])  # fewer than asked: all there are
    s.registry.record_probe(f"http://{FOUR[0]}", False, 100.0)  # type: ignore[arg-type]
    for _ in range(3):
        s.registry.record_failure(f"http://{FOUR[0]}", 100.0, "probe")  # type: ignore[arg-type]
    names = destinations(await pick(PickStream(s), completion(10)))
    assert FOUR[0] not in names and len(names) == 3  # an ejected endpoint is nobody's fallback


async def answer_served_by(stream: PickStream, endpoint: str) -> None:
    """Envoy reports the answer as served by ``endpoint`` (the protocol's metadata entry), and
    the answer ends."""
    served = response_headers()
    meta = served.metadata_context.filter_metadata["envoy.lb"]
    meta.update({"x-gateway-destination-endpoint-served": endpoint})
    await stream.handle(served)
    await stream.handle(response_body(b"{}", end_of_stream=True))


async def test_without_fallbacks_one_endpoint_is_sent() -> None:
    names = destinations(await pick(PickStream(shared("round_robin", FOUR)), completion(10)))
    assert len(names) == 1


@pytest.mark.parametrize("served_by", ["fallback", "primary"])
async def test_an_answer_served_by_a_fallback_counts_against_the_primary(served_by: str) -> None:
    """Served by the fallback: the primary gets the failure, the fallback the answer; served
    by the primary, nothing changes."""
    s = shared("round_robin", FOUR, fallbacks=1)
    stream = PickStream(s)
    primary, fallback = destinations(await pick(stream, completion(10)))
    server = fallback if served_by == "fallback" else primary
    await answer_served_by(stream, server)
    assert s.registry.get(f"http://{primary}").failures == (server != primary)  # type: ignore[arg-type]
    assert s.registry.get(f"http://{fallback}").failures == 0  # type: ignore[arg-type]
    requests = s.metrics.registry.get_sample_value(
        "prefixroute_requests_total",
        # the replica's id, as in the gateway's counter and the picker's other families
        {"replica": f"http://{server}", "status": "200", "reason": "round_robin"},
    )  # fmt: skip
    assert requests == 1


async def test_a_fallback_passes_no_plain_answer_on_the_primary() -> None:
    """The primary never served the request, so no first token came from it: the plain answers
    sent there before it (first tokens nobody sees) still wait their turn there
    (core/plain_answers.py: only a first token that came passes them)."""
    s = shared("round_robin", FOUR, fallbacks=1)
    for endpoint in FOUR:  # one plain answer already in flight on every replica
        rid = f"plain-{endpoint}"
        s.router.loads.count_dispatch(
            rid, f"http://{endpoint}", prompt_tokens=500, output_tokens=10,
            predicted_cached_tokens=0, now=s.clock(),
        )  # fmt: skip
        s.router.first_token_due(rid)  # as the picker's timer marks a plain answer
    stream = PickStream(s)
    primary, fallback = destinations(await pick(stream, completion(10)))
    await answer_served_by(stream, fallback)
    assert s.router.replica_load(f"http://{primary}").prefilling == 1  # the plain answer
    assert s.router.replica_load(f"http://{primary}").in_flight == 1


def test_fallbacks_is_a_count() -> None:
    with pytest.raises(Exception, match="fallbacks"):
        EppConfig(GatewayConfig(), fallbacks=-1)


# -- a stream's usage the client did not ask for (the gateway's stream_usage) -------------------

USAGE = {"prompt_tokens": 9, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 0}}
TOKEN = b'data: {"choices":[{"text":"a"}]}\n\n'
USAGE_EVENT = f"data: {json.dumps({'choices': [], 'usage': USAGE})}\n\n".encode()


def _sent_body(out: list[Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The body the replica gets (full duplex) and the request headers set with it."""
    body = out[1].request_body.response.body_mutation.streamed_response.body
    return json.loads(body), set_headers(out[0].request_headers.response.header_mutation)


async def _answer(stream: PickStream) -> bytes:
    """A streamed answer with a usage event; what goes on to the client."""
    await stream.handle(response_headers(content_type="text/event-stream"))
    back = await stream.handle(response_body(TOKEN + USAGE_EVENT[:30]))
    back += await stream.handle(response_body(USAGE_EVENT[30:] + b"data: [DONE]\n\n", True))
    return b"".join(r.response_body.response.body_mutation.streamed_response.body for r in back)


async def test_the_picker_asks_for_the_usage_and_keeps_it_from_the_client() -> None:
    s = shared()
    stream = PickStream(s)
    body, headers = _sent_body(await pick(stream, completion(100, stream=True)))
    assert body["stream_options"] == {"include_usage": True}
    sent = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    assert headers["content-length"] == str(len(sent))
    # A compressed stream could not be read event by event to keep the usage back.
    assert headers["accept-encoding"] == "identity"
    assert await _answer(stream) == TOKEN + b"data: [DONE]\n\n"
    assert s.router.usage_reports == 1


async def test_a_client_that_asked_gets_its_usage_and_its_body_unchanged() -> None:
    s = shared()
    stream = PickStream(s)
    asked = json.dumps({"prompt": "a b c", "stream": True,
                        "stream_options": {"include_usage": True}}).encode()  # fmt: skip
    out = await pick(stream, asked)
    assert out[1].request_body.response.body_mutation.streamed_response.body == asked
    assert "accept-encoding" not in _sent_body(out)[1]  # the client's own choice stands
    assert await _answer(stream) == TOKEN + USAGE_EVENT + b"data: [DONE]\n\n"
    assert s.router.usage_reports == 1


async def test_no_usage_is_asked_for_where_the_answer_cannot_be_edited_or_when_off() -> None:
    # STREAMED responses (not full duplex): the chunks go on as they came, so the usage event
    # would reach the client. stream_usage = false: the gateway's setting, the same here.
    stream = PickStream(shared())
    headers = request_headers()
    headers.protocol_config.response_body_mode = STREAMED
    await stream.handle(headers)
    out = await stream.handle(request_body(completion(50, stream=True)))
    assert "stream_options" not in _sent_body(out)[0]
    stream = PickStream(shared(stream_usage=False))
    body = completion(50, stream=True)
    out = await pick(stream, body)
    assert out[1].request_body.response.body_mutation.streamed_response.body == body


async def test_buffered_mode_asks_for_the_usage_and_hands_back_the_answer_without_it() -> None:
    s = shared()
    stream = PickStream(s)
    await stream.handle(request_headers(mode=BUFFERED))
    out = await stream.handle(request_body(completion(100, stream=True)))
    sent = out[0].request_body.response.body_mutation.body  # the whole body, replaced
    assert json.loads(sent)["stream_options"] == {"include_usage": True}
    assert set_headers(out[0].request_body.response.header_mutation)["content-length"] == str(
        len(sent)
    )
    await stream.handle(response_headers(content_type="text/event-stream"))
    whole = TOKEN + USAGE_EVENT + b"data: [DONE]\n\n"
    back = await stream.handle(response_body(whole, end_of_stream=True))
    assert back[0].response_body.response.body_mutation.body == TOKEN + b"data: [DONE]\n\n"
    assert s.router.usage_reports == 1


@pytest.mark.parametrize(
    "mode", [FULL_DUPLEX, STREAMED, BUFFERED], ids=["full_duplex", "streamed", "buffered"]
)
async def test_only_an_answer_passed_on_as_it_comes_times_its_first_token(mode: int) -> None:
    """A BUFFERED answer reaches the picker whole, at its end: the time of its first output is
    the end's, so it teaches no prefill time (it would make the replica look slow by the whole
    decode). Streamed modes pass chunks as the replica sends them, first token included."""
    s = shared()
    stream = PickStream(s)
    headers = request_headers(mode=FULL_DUPLEX if mode == STREAMED else mode)
    headers.protocol_config.response_body_mode = mode
    await stream.handle(headers)
    await stream.handle(request_body(completion(100, stream=True)))
    replica = stream.decision.replica  # type: ignore[union-attr]
    await stream.handle(response_headers(content_type="text/event-stream"))
    s.clock.now += 0.5  # type: ignore[attr-defined]
    await stream.handle(response_body(TOKEN + USAGE_EVENT + b"data: [DONE]\n\n", True))
    learned = s.router.replica_load(replica).speed.prefill_observations
    assert learned == (0 if mode == BUFFERED else 1)
    assert s.router.replica_load(replica).in_flight == 0  # released either way


async def test_usage_is_counted_in_metrics_as_the_gateway_counts_it() -> None:
    # The picker's /metrics has the gateway's families: prompt tokens reported (the hit rate's
    # denominator) and answers without usage, which it used to leave at 0.
    s = shared()
    metric = s.metrics.registry.get_sample_value
    for reported in (True, False):
        stream = PickStream(s)
        await pick(stream, completion(100))
        await stream.handle(response_headers())
        body = {"choices": [{"text": "x"}], **({"usage": USAGE} if reported else {})}
        await stream.handle(response_body(json.dumps(body).encode(), end_of_stream=True))
        labels = {"replica": stream.decision.replica}  # type: ignore[union-attr]
        prompt = metric("prefixroute_prompt_tokens_total", labels)
        missing = metric("prefixroute_usage_missing_total", labels)
        if reported:
            assert prompt == USAGE["prompt_tokens"]
        else:
            assert missing == 1


# -- the answer's accounting, as the gateway's (gateway._proxy, gateway._verdict) ---------------


async def test_usage_without_cached_tokens_still_teaches_characters_per_token() -> None:
    # vLLM without --enable-prompt-tokens-details, SGLang without --enable-cache-report: the
    # gateway learns characters per token from prompt_tokens alone; the picker skipped them.
    s = shared()
    stream = PickStream(s)
    await pick(stream, completion(100))
    await stream.handle(response_headers())
    usage = {"prompt_tokens": 150, "completion_tokens": 4}
    await stream.handle(response_body(json.dumps({"usage": usage}).encode(), end_of_stream=True))
    learned = s.router.chars_per_token()
    assert sum(c.observations for c in learned.values()) == 1


@pytest.mark.parametrize("status", [500, 503])
async def test_a_5xx_answer_is_judged_as_the_gateway_judges_it(status: int) -> None:
    # 502/503/504 (Envoy could not reach it, or it broke) is a failure; another 5xx may be the
    # request's own and only counts in the error rate (an outlier is taken out). Before, a 500
    # counted nowhere, and no upstream failure was counted in /metrics.
    s, stream, replica = await routed_stream(10)
    await stream.handle(response_headers(status, "application/json", end_of_stream=True))
    record = s.registry.get(replica)
    assert record is not None
    assert record.failures == (1 if status == 503 else 0)
    assert [ok for _, ok in record.outcomes] == [False]
    failures = s.metrics.registry.get_sample_value(
        "prefixroute_upstream_failures_total", {"replica": replica, "kind": "status"}
    )
    assert failures == 1


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "stream"])
async def test_a_full_sglang_replica_is_counted_busy_not_blamed(streamed: bool) -> None:
    # SGLang's --max-queued-requests overflow: a 503 saying its queue is full, or a 200 stream
    # whose first event says so. Full, not broken (gateway._upstream_answers), as serve judges
    # it: three of them had taken the replica out.
    s, stream, replica = await routed_stream(10)
    full = {"message": "The request queue is full.", "type": "Service Unavailable", "code": 503}
    if streamed:
        await stream.handle(response_headers(200, "text/event-stream"))
        event = f"data: {json.dumps({'error': full})}\n\ndata: [DONE]\n\n".encode()
        await stream.handle(response_body(event, end_of_stream=True))
    else:
        await stream.handle(response_headers(503, "application/json"))
        await stream.handle(response_body(json.dumps(full).encode(), end_of_stream=True))
    record = s.registry.get(replica)
    assert record is not None and record.failures == 0 and list(record.outcomes) == []
    busy = s.metrics.registry.get_sample_value(
        "prefixroute_upstream_failures_total", {"replica": replica, "kind": "busy"}
    )
    assert busy == 1


async def test_one_request_marks_one_replica_even_through_a_fallback() -> None:
    s = shared("round_robin", FOUR, fallbacks=1)
    stream = PickStream(s)
    primary, fallback = destinations(await pick(stream, completion(10)))
    served = response_headers(503, "text/plain", end_of_stream=True)  # the fallback failed too
    meta = served.metadata_context.filter_metadata["envoy.lb"]
    meta.update({"x-gateway-destination-endpoint-served": fallback})
    await stream.handle(served)
    assert s.registry.get(f"http://{primary}").failures == 1  # type: ignore[union-attr]
    assert s.registry.get(f"http://{fallback}").failures == 0  # type: ignore[union-attr]


async def test_calls_other_than_v1_are_not_counted_as_requests() -> None:
    s = shared()
    for path in ("/v1/models", "/health", "/v1/completions"):
        stream = PickStream(s)
        await pick(stream, b"", path=path)
        await stream.handle(response_headers(200, "application/json", end_of_stream=True))
    counted = sum(
        sample.value
        for metric in s.metrics.registry.collect()
        for sample in metric.samples
        if sample.name == "prefixroute_requests_total"
    )
    assert counted == 1


def _generate_body(n: int, stream: bool = False) -> bytes:
    """SGLang's ``/generate`` body whose text is ``n`` words (as ``completion``'s prompt)."""
    text = " ".join(f"w{i}" for i in range(n))
    return json.dumps({"text": text, "stream": stream}).encode()


async def test_sglang_generate_is_keyed_on_its_text_and_its_meta_info_learned() -> None:
    s = shared()
    first = picked(await pick(PickStream(s), _generate_body(400), path="/generate"))[0]
    stream = PickStream(s)
    out = await pick(stream, _generate_body(700, stream=True), path="/generate")
    assert picked(out)[0] == first
    await stream.handle(response_headers(content_type="text/event-stream"))
    meta = {"prompt_tokens": 700, "completion_tokens": 1, "cached_tokens": 400}
    chunk = f"data: {json.dumps({'text': 'a', 'meta_info': meta})}\n\ndata: [DONE]\n\n"
    back = await stream.handle(response_body(chunk.encode(), end_of_stream=True))
    assert back[0].response_body.response.body_mutation.streamed_response.body == chunk.encode()
    assert s.router.usage_reports == 1  # the meta_info read as the usage report
    counted = sum(
        sample.value
        for metric in s.metrics.registry.collect()
        for sample in metric.samples
        if sample.name == "prefixroute_requests_total"
    )
    assert counted == 1  # /generate is a model call, counted as the gateway counts it


async def test_a_compressed_stream_has_its_first_token_at_its_first_chunk() -> None:
    s = shared()
    stream = PickStream(s)
    await pick(stream, completion(100, stream=True))
    load = s.router.loads.get(stream.decision.replica)  # type: ignore[union-attr]
    headers = response_headers(content_type="text/event-stream")
    headers.response_headers.headers.headers.add(key="content-encoding", raw_value=b"gzip")
    await stream.handle(headers)
    assert load.prefilling == 1
    await stream.handle(response_body(b"\x1f\x8b\x08\x00 compressed bytes"))
    assert load.prefilling == 0  # the first token came back


async def test_a_stream_cut_after_its_answer_started_is_counted_as_a_request() -> None:
    s = shared()
    stream = PickStream(s)
    await pick(stream, completion(100, stream=True))
    await stream.handle(response_headers(content_type="text/event-stream"))
    await stream.handle(response_body(b'data: {"choices":[{"text":"a"}]}\n\n'))
    stream.close()  # Envoy ended the ext_proc stream: the client or the replica went away
    replica = stream.decision.replica  # type: ignore[union-attr]
    labels = {"replica": replica, "status": "200", "reason": stream.decision.reason.value}  # type: ignore[union-attr]
    assert s.metrics.registry.get_sample_value("prefixroute_requests_total", labels) == 1
    assert s.router.loads.get(replica).in_flight == 0
    stream.close()  # once
    assert s.metrics.registry.get_sample_value("prefixroute_requests_total", labels) == 1


async def test_a_request_a_fallback_served_is_accounted_to_the_fallback() -> None:
    # As the gateway's retry routes again: the primary's load is released and it learns nothing
    # of an answer it did not give; the fallback holds the request and its prefix, and its
    # usage is judged against its own prediction. Before, all of it went to the primary.
    s = shared("round_robin", FOUR, fallbacks=1)
    stream = PickStream(s)
    primary, fallback = (f"http://{e}" for e in destinations(await pick(stream, completion(64))))
    served = response_headers(content_type="text/event-stream")
    meta = served.metadata_context.filter_metadata["envoy.lb"]
    meta.update({"x-gateway-destination-endpoint-served": fallback.removeprefix("http://")})
    await stream.handle(served)
    loads = s.router.loads
    assert (loads.get(primary).in_flight, loads.get(fallback).in_flight) == (0, 1)  # type: ignore[arg-type]
    assert s.router.indexed_blocks(fallback) > 0  # type: ignore[arg-type]
    s.clock.now += 0.5  # type: ignore[attr-defined]
    await stream.handle(response_body(TOKEN))
    await stream.handle(response_body(USAGE_EVENT + b"data: [DONE]\n\n", end_of_stream=True))
    assert loads.get(fallback).in_flight == 0  # type: ignore[arg-type]
    assert loads.get(primary).speed.prefill_observations == 0  # type: ignore[arg-type]
    assert loads.get(fallback).speed.prefill_observations == 0  # type: ignore[arg-type]
    actual = s.metrics.registry.get_sample_value(
        "prefixroute_actual_cached_tokens_total", {"replica": fallback}
    )
    assert actual == 0 and s.router.usage_reports == 1


# -- tracing (otlp_endpoint), as serve traces ----------------------------------------------

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def test_a_traced_request_has_its_span_with_the_decision_and_passes_it_on() -> None:
    # The picker built the tracer from otlp_endpoint and never used it: no spans, no warning.
    s = shared()
    exporter = InMemorySpanExporter()
    s.state.tracing = RequestTracing(SimpleSpanProcessor(exporter), "picker-under-test")
    stream = PickStream(s)
    out = await pick(stream, completion(50), headers={"traceparent": TRACEPARENT})
    sent = set_headers(out[0].request_headers.response.header_mutation)
    trace_id = TRACEPARENT.split("-")[1]
    assert sent["traceparent"].split("-")[1] == trace_id  # the replica continues the trace
    await stream.handle(response_headers(200, end_of_stream=True))
    (span,) = exporter.get_finished_spans()
    assert format(span.context.trace_id, "032x") == trace_id
    assert span.attributes["prefixroute.reason"] == stream.decision.reason.value  # type: ignore[index,union-attr]
    assert span.attributes["http.response.status_code"] == 200  # type: ignore[index]
    assert len([e for e in span.events if e.name == "prefixroute.candidate"]) == len(ENDPOINTS)
    refused = PickStream(s)
    await pick(refused, b"not json")  # a 400 from the picker itself
    assert exporter.get_finished_spans()[-1].attributes["http.response.status_code"] == 400  # type: ignore[index]
    cut = PickStream(s)
    await pick(cut, completion(50))
    cut.close()  # no answer came
    assert exporter.get_finished_spans()[-1].status.status_code == StatusCode.ERROR


async def test_a_replica_that_refuses_stream_options_stops_the_asking() -> None:
    # Behind Envoy the picker cannot send the request again as serve does: that client gets
    # the 400, and later streams are not asked for their usage.
    s = shared()
    stream = PickStream(s)
    await pick(stream, completion(10, stream=True))
    refusal = b'{"error":{"message":"stream_options: Extra inputs are not permitted"}}'
    await stream.handle(response_headers(400))
    await stream.handle(response_body(refusal, end_of_stream=True))
    assert not s.state.asks_stream_usage
    body = completion(10, stream=True)
    out = await pick(PickStream(s), body)
    assert out[1].request_body.response.body_mutation.streamed_response.body == body


async def test_a_replica_whose_context_window_is_too_short_is_not_picked() -> None:
    """The picker narrows its candidates as ``serve`` does (``gateway._context_window``): an
    endpoint whose card's window cannot hold the prompt is never named, primary or fallback;
    a short prompt may go anywhere."""
    s = shared(policy="round_robin", fallbacks=2)
    small = ReplicaId("http://" + ENDPOINTS[0])
    s.registry.set_models(small, [{"id": "m", "max_model_len": 100}])
    for endpoint in ENDPOINTS[1:]:
        s.registry.set_models(ReplicaId("http://" + endpoint), [{"id": "m", "max_model_len": 8192}])
    named = set()
    for i in range(6):  # 400 words: over 100 tokens at any count
        header, _ = picked(await pick(PickStream(s), completion(400, tag=f"t{i}-")))
        assert header is not None
        named.update(header.split(","))
    assert named == set(ENDPOINTS[1:])
    firsts = set()
    for i in range(6):
        header, _ = picked(await pick(PickStream(s), completion(5, tag=f"s{i}-")))
        assert header is not None
        firsts.add(header.split(",")[0])
    assert firsts == set(ENDPOINTS)


async def test_a_400_over_the_window_teaches_the_replicas_window() -> None:
    """Behind Envoy the picker cannot move the refused request (the client gets the engine's
    400), but it learns the window the 400 says, as ``serve`` does: a later request that needs
    more is not sent there."""
    s = shared(policy="round_robin")
    stream = PickStream(s)
    header, _ = picked(await pick(stream, completion(400, tag="long-")))
    assert header is not None
    refused = ReplicaId("http://" + header.split(",")[0])
    assert s.registry.get(refused).context_window is None  # its card said none
    message = (
        "This model's maximum context length is 300 tokens. However, your prompt contains 450 "
        "input tokens, which exceeds this limit even without any output tokens."
    )
    body = {"error": {"message": message, "type": "BadRequestError", "code": 400}}
    await stream.handle(response_headers(400))
    await stream.handle(response_body(json.dumps(body).encode(), end_of_stream=True))
    assert s.registry.get(refused).context_window == 300
    for i in range(2 * len(ENDPOINTS)):  # round robin would name it every fourth time
        header, _ = picked(await pick(PickStream(s), completion(400, tag=f"again{i}-")))
        assert header is not None and "http://" + header.split(",")[0] != refused
    # A 400 that says something else teaches nothing, wherever it went.
    windows = [s.registry.get(ReplicaId("http://" + e)).context_window for e in ENDPOINTS]
    for i in range(len(ENDPOINTS)):
        other = PickStream(s)
        await pick(other, completion(5, tag=f"short{i}-"))
        await other.handle(response_headers(400))
        await other.handle(response_body(b'{"error":{"message":"bad n"}}', end_of_stream=True))
    assert [s.registry.get(ReplicaId("http://" + e)).context_window for e in ENDPOINTS] == windows


class _BrokenSync:
    """A decision sharer (sync_redis) whose every call fails."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: object, **kwargs: object) -> None:
            raise OverflowError("can't serialize")

        return fail


async def test_a_sharing_that_fails_loses_no_pick() -> None:
    # As serve's (gateway._proxy): the others miss one decision, the request is still picked
    # for, and its end releases it.
    s = shared()
    s.state.sync = _BrokenSync()  # type: ignore[assignment]
    stream = PickStream(s)
    assert destinations(await pick(stream, completion(10)))
    assert stream.decision is not None and not stream.refused
