"""OpenTelemetry tracing (issue 14 item 3): one SERVER span per request carrying the decision,
a CLIENT span per upstream attempt whose W3C ``traceparent`` reaches the replica, and export over
OTLP/gRPC to a real receiver started here."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures

import aiohttp
import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from prefixroute.core import CandidateScore, Decision, DecisionReason, ReplicaId
from prefixroute.gateway._tracing import RequestTracing

from .fakes import FakeReplica
from .helpers import STEADY, GatewayFactory, send

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
A, B = ReplicaId("http://10.0.0.1:8000"), ReplicaId("http://10.0.0.2:8000")
NAMES = {A: "r-aaaaaaaa", B: "r-bbbbbbbb"}  # the registry's public names


@pytest.fixture
def traced() -> tuple[RequestTracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    return RequestTracing(SimpleSpanProcessor(exporter), "test-gw"), exporter


def decision() -> Decision:
    return Decision(
        A,
        DecisionReason.PREFIX_MATCH,
        96,
        (
            CandidateScore(A, 6, 96, 2, 300, 0.031, 0.040),
            CandidateScore(B, 0, 0, 0, 0, 0.052, 0.052),
        ),
    )


def test_a_request_span_joins_the_callers_trace_and_carries_the_decision(
    traced: tuple[RequestTracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = traced
    span = tracing.start_request("POST", "/v1/completions", {"traceparent": TRACEPARENT})
    tracing.record_decision(span, decision(), NAMES.__getitem__, "predicted_ttft")
    tracing.finish(span, 200)
    (done,) = exporter.get_finished_spans()
    assert done.kind is SpanKind.SERVER
    assert done.name == "POST /v1/completions"
    assert format(done.context.trace_id, "032x") == TRACE_ID
    assert done.parent is not None and format(done.parent.span_id, "016x") == PARENT_ID
    attrs = done.attributes or {}
    assert attrs["prefixroute.replica"] == "r-aaaaaaaa"
    assert attrs["prefixroute.reason"] == "prefix_match"
    assert attrs["prefixroute.policy"] == "predicted_ttft"
    assert attrs["prefixroute.predicted_cached_tokens"] == 96
    assert attrs["http.response.status_code"] == 200
    assert done.status.status_code is not StatusCode.ERROR
    events = [dict(e.attributes or {}) for e in done.events if e.name == "prefixroute.candidate"]
    assert len(events) == 2
    chosen, other = events
    assert chosen["prefixroute.chosen"] is True and other["prefixroute.chosen"] is False
    assert (chosen["prefixroute.matched_blocks"], chosen["prefixroute.cached_tokens"]) == (6, 96)
    assert chosen["prefixroute.in_flight"] == 2
    assert chosen["prefixroute.queued_prefill_tokens"] == 300
    assert (other["prefixroute.predicted_ttft_s"], other["prefixroute.score"]) == (0.052, 0.052)
    # Every replica is named as clients see it; no replica URL leaves in the trace.
    assert (chosen["prefixroute.replica"], other["prefixroute.replica"]) == (NAMES[A], NAMES[B])
    assert not any("10.0.0." in str(v) for e in events for v in e.values())


def test_without_a_traceparent_the_request_starts_a_new_trace(
    traced: tuple[RequestTracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = traced
    tracing.finish(tracing.start_request("POST", "/v1/chat/completions", {}), 503)
    (done,) = exporter.get_finished_spans()
    assert done.parent is None
    assert done.status.status_code is StatusCode.ERROR  # a 5xx is an error span


def test_scores_are_left_out_when_the_policy_computed_none(
    traced: tuple[RequestTracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = traced
    span = tracing.start_request("POST", "/v1/completions", {})
    d = Decision(B, DecisionReason.ROUND_ROBIN, 0, (CandidateScore(B, 0, 0, 0, 0),))
    tracing.record_decision(span, d, NAMES.__getitem__, "round_robin")
    tracing.finish(span, 200)
    (event,) = exporter.get_finished_spans()[0].events
    assert "prefixroute.predicted_ttft_s" not in (event.attributes or {})
    assert "prefixroute.score" not in (event.attributes or {})


def test_the_upstream_span_is_a_child_and_its_traceparent_goes_to_the_replica(
    traced: tuple[RequestTracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = traced
    span = tracing.start_request("POST", "/v1/completions", {"traceparent": TRACEPARENT})
    headers: dict[str, str] = {"Content-Type": "application/json"}
    with tracing.upstream(span, "r-aaaaaaaa", headers) as client:
        client_id = format(client.get_span_context().span_id, "016x")
    tracing.finish(span, 200)
    upstream, server = exporter.get_finished_spans()
    assert upstream.kind is SpanKind.CLIENT and server.kind is SpanKind.SERVER
    assert upstream.parent is not None and upstream.parent.span_id == server.context.span_id
    assert upstream.context.trace_id == server.context.trace_id
    version, trace_id, span_id, flags = headers["traceparent"].split("-")
    assert (version, trace_id, span_id, flags) == ("00", TRACE_ID, client_id, "01")


class _Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """A minimal OTLP/gRPC trace collector: keeps what it is sent."""

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.arrived = threading.Event()

    def Export(  # noqa: N802 (the gRPC method's name)
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: object
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.requests.append(request)
        self.arrived.set()
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def receiver() -> Iterator[tuple[_Receiver, int]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    collector = _Receiver()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield collector, port
    server.stop(grace=None)


def test_spans_reach_a_real_otlp_grpc_receiver(receiver: tuple[_Receiver, int]) -> None:
    collector, port = receiver
    tracing = RequestTracing.to_otlp(f"http://127.0.0.1:{port}", "gw-under-test")
    span = tracing.start_request("POST", "/v1/completions", {"traceparent": TRACEPARENT})
    tracing.record_decision(span, decision(), NAMES.__getitem__, "predicted_ttft")
    tracing.finish(span, 200)
    tracing.shutdown()  # flushes the batch
    assert collector.arrived.wait(10)
    spans = [
        (resource, s)
        for req in collector.requests
        for resource in req.resource_spans
        for scope in resource.scope_spans
        for s in scope.spans
    ]
    assert len(spans) == 1
    resource, span_pb = spans[0]
    service = {a.key: a.value.string_value for a in resource.resource.attributes}
    assert service["service.name"] == "gw-under-test"
    assert span_pb.trace_id.hex() == TRACE_ID
    assert span_pb.parent_span_id.hex() == PARENT_ID
    attrs = {a.key: a.value for a in span_pb.attributes}
    assert attrs["prefixroute.reason"].string_value == "prefix_match"
    assert [e.name for e in span_pb.events] == ["prefixroute.candidate"] * 2


async def test_a_traced_gateway_exports_each_request_and_passes_traceparent_on(
    receiver: tuple[_Receiver, int],
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
) -> None:
    """End to end: ``otlp_endpoint`` set, two fake replicas, one routed request. The collector
    gets its SERVER span (the caller's trace, the decision, a candidate event per replica) and
    the CLIENT span whose id the replica received as ``traceparent``."""
    collector, port = receiver
    a, b = FakeReplica(), FakeReplica()
    urls = [await a.start(), await b.start()]
    try:
        gw = await make_gateway(
            urls, otlp_endpoint=f"http://127.0.0.1:{port}", expose_replica_urls=False, **STEADY
        )  # replicas named r-<hash>, as by default
        body = {"model": "emulated", "prompt": "hello " * 50, "max_tokens": 1}
        reply = await send(
            session, gw.url, "/v1/completions", body, headers={"traceparent": TRACEPARENT}
        )
        assert reply.status == 200, reply
        await gw.stop()  # flushes the batch
    finally:
        await a.stop()
        await b.stop()
    assert collector.arrived.wait(10)
    spans = {
        s.name: s
        for req in collector.requests
        for resource in req.resource_spans
        for scope in resource.scope_spans
        for s in scope.spans
    }
    server, client = spans["POST /v1/completions"], spans["POST upstream"]
    assert server.trace_id.hex() == TRACE_ID and client.trace_id.hex() == TRACE_ID
    assert client.parent_span_id == server.span_id
    attrs = {a.key: a.value.string_value for a in server.attributes}
    assert attrs["prefixroute.replica"] == reply.headers["x-prefixroute-replica"]
    assert attrs["prefixroute.reason"] == reply.headers["x-prefixroute-reason"]
    assert attrs["prefixroute.policy"] == "predicted_ttft"
    candidates = [e for e in server.events if e.name == "prefixroute.candidate"]
    assert len(candidates) == 2
    for event in candidates:
        names = {a.key for a in event.attributes}
        assert {"prefixroute.predicted_ttft_s", "prefixroute.score"} <= names
        attrs_of = {a.key: a.value.string_value for a in event.attributes}
        assert attrs_of["prefixroute.replica"].startswith("r-")  # public names, never URLs
    (seen,) = [s for s in a.seen + b.seen if s.path.startswith("/v1/")]
    version, trace_id, span_id, _ = seen.headers["traceparent"].split("-")
    assert (version, trace_id, span_id) == ("00", TRACE_ID, client.span_id.hex())


async def test_without_an_endpoint_nothing_is_traced_or_propagated(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    fake = FakeReplica()
    url = await fake.start()
    try:
        gw = await make_gateway([url], **STEADY)
        body = {"model": "emulated", "prompt": "hello", "max_tokens": 1}
        reply = await send(session, gw.url, "/v1/completions", body)
        assert reply.status == 200
    finally:
        await fake.stop()
    (seen,) = [s for s in fake.seen if s.path.startswith("/v1/")]
    assert "traceparent" not in {k.lower() for k in seen.headers}
