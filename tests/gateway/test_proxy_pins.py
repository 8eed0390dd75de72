"""The proxy's retry loop and fault rules, pinned one by one (gateway/_proxy.py's and
gateway/_verdict.py's docstrings, docs/security.md "Poison requests", the metrics of
gateway/_metrics.py).

The rules: a failure before any byte reached the client is retried once among the remaining
candidates. A refused connection is the replica's at once. Any other failure is suspected until
the retry tells: the same failure again, or a 4xx from the second replica, is the request's own
(no replica marked, ``prefixroute_request_faults_total`` counts it); a retry that does not fail
the same way marks the first replica. With no retry to judge it, a timeout, a broken connection
or a gateway status (502, 503, 504) marks the replica; any other 5xx only counts in its error
rate. A stream that breaks after it started is its replica's. One request marks at most one
replica (a refused connection excepted).

The unit tests drive ``Verdict`` with a real registry and real metrics (a gateway built, not
started); the others run a gateway against fake replicas on real sockets (the retry loop's
ends, through a gateway, are in test_faults.py).
"""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from polling import until

from prefixroute.core import Decision, ReplicaId, RequestView
from prefixroute.gateway import Gateway, GatewayConfig
from prefixroute.gateway._errors import UpstreamError
from prefixroute.gateway._metrics import GatewayMetrics
from prefixroute.gateway._registry import ReplicaRecord, ReplicaRegistry
from prefixroute.gateway._relay import RelayResult
from prefixroute.gateway._state import STATE
from prefixroute.gateway._tracing import RequestTracing
from prefixroute.gateway._upstream_answers import kind_of as _kind
from prefixroute.gateway._verdict import Verdict

from .fakes import held_until, one_event_stream
from .helpers import FakeFactory, GatewayFactory, send

A, B, C = ReplicaId("http://a:1"), ReplicaId("http://b:2"), ReplicaId("http://c:3")


def _judge(failure_threshold: int = 3) -> tuple[Verdict, ReplicaRegistry, GatewayMetrics]:
    """A fresh verdict (one request) over three replicas."""
    gw = Gateway(GatewayConfig(replicas=(A, B, C), failure_threshold=failure_threshold))
    state = gw.app[STATE]
    return Verdict(state.registry, state.metrics), state.registry, state.metrics


def _marks(registry: ReplicaRegistry) -> dict[str, int]:
    """Failures counted against each replica."""
    return {r.url: r.total_failures for r in registry}


def _outcomes(record: ReplicaRecord) -> list[bool]:
    """The answers in the replica's error-rate window: True for a success, False for an error."""
    return [ok for _, ok in record.outcomes]


def _answer(status: int = 200, **fields: object) -> RelayResult:
    return RelayResult(web.Response(status=status), status, None, **fields)  # type: ignore[arg-type]


def _sample(metrics: GatewayMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


# --- failures before the first byte ------------------------------------------------------------


def test_a_refused_connection_is_the_replicas_at_once_even_with_a_retry_to_come() -> None:
    verdict, registry, metrics = _judge()
    assert verdict.failed(A, "connect", can_retry=True) is False
    assert _marks(registry) == {A: 1, B: 0, C: 0}
    # The retry is refused too: also marked (no request content makes a connection fail), and
    # not the request's fault (a refused connection is never only suspected).
    assert verdict.failed(B, "connect", can_retry=False) is False
    assert _marks(registry) == {A: 1, B: 1, C: 0}
    assert _sample(metrics, "prefixroute_upstream_failures_total", replica=A, kind="connect") == 1
    assert _sample(metrics, "prefixroute_request_faults_total", kind="connect") is None


@pytest.mark.parametrize("kind", ["timeout", "disconnect", "status", "error"])
def test_any_other_failure_with_a_retry_to_come_is_only_suspected(kind: str) -> None:
    verdict, registry, metrics = _judge()
    assert verdict.failed(A, kind, can_retry=True) is False
    assert _marks(registry) == {A: 0, B: 0, C: 0}
    assert _outcomes(registry.get(A)) == []  # not even an error-rate entry yet
    assert _sample(metrics, "prefixroute_upstream_failures_total", replica=A, kind=kind) == 1


@pytest.mark.parametrize("kind", ["timeout", "disconnect", "status", "error"])
def test_the_same_failure_on_the_retry_is_the_requests_own(kind: str) -> None:
    verdict, registry, metrics = _judge()
    verdict.failed(A, kind, can_retry=True)
    assert verdict.failed(B, kind, can_retry=False) is True  # no further attempt
    assert _marks(registry) == {A: 0, B: 0, C: 0}
    assert _outcomes(registry.get(A)) == _outcomes(registry.get(B)) == []
    assert _sample(metrics, "prefixroute_request_faults_total", kind=kind) == 1
    assert _sample(metrics, "prefixroute_upstream_failures_total", replica=B, kind=kind) == 1


def test_a_different_failure_on_the_retry_is_not_a_request_fault() -> None:
    verdict, registry, metrics = _judge()
    verdict.failed(A, "status", can_retry=True)
    assert verdict.failed(B, "timeout", can_retry=False) is False
    assert _sample(metrics, "prefixroute_request_faults_total", kind="status") is None
    assert _sample(metrics, "prefixroute_request_faults_total", kind="timeout") is None
    assert _marks(registry)[B] == 1  # a timeout with no retry to judge it


@pytest.mark.parametrize("kind", ["timeout", "disconnect"])
def test_with_no_retry_a_timeout_or_broken_connection_marks_the_replica(kind: str) -> None:
    verdict, registry, _ = _judge()
    assert verdict.failed(A, kind, can_retry=False) is False
    assert _marks(registry) == {A: 1, B: 0, C: 0}


def test_with_no_retry_any_other_failure_only_counts_in_the_error_rate() -> None:
    verdict, registry, _ = _judge()
    assert verdict.failed(A, "error", can_retry=False) is False
    assert _marks(registry) == {A: 0, B: 0, C: 0}
    assert _outcomes(registry.get(A)) == [False]


# --- answers -------------------------------------------------------------------------------------


def _retry_answered(first: str, status: int) -> tuple[ReplicaRegistry, GatewayMetrics]:
    """A failed (``first``, a retry possible), then B, with 2 failures so far, answered the
    retry with ``status``."""
    verdict, registry, metrics = _judge()
    registry.get(B).failures = 2
    verdict.failed(A, first, can_retry=True)
    verdict.answered(B, _answer(status))
    return registry, metrics


def test_a_retry_that_succeeds_marks_the_first_replica_and_counts_its_success() -> None:
    registry, _ = _retry_answered("timeout", 200)
    assert _marks(registry) == {A: 1, B: 0, C: 0}
    assert registry.get(B).failures == 0  # a request it served forgives its failures
    assert _outcomes(registry.get(B)) == [True]


def test_a_4xx_from_the_retry_says_the_request_is_bad() -> None:
    registry, metrics = _retry_answered("status", 400)
    assert _marks(registry) == {A: 0, B: 0, C: 0}
    assert registry.get(B).failures == 2  # not counted as B's success either
    assert _sample(metrics, "prefixroute_request_faults_total", kind="status") == 1


def test_a_4xx_with_no_suspect_is_a_served_request() -> None:
    verdict, registry, metrics = _judge()
    registry.get(A).failures = 2
    verdict.answered(A, _answer(404))
    assert registry.get(A).failures == 0
    assert _sample(metrics, "prefixroute_request_faults_total", kind="status") is None


def test_the_same_5xx_relayed_from_the_retry_is_the_requests_own() -> None:
    verdict, registry, metrics = _judge()
    verdict.failed(A, "status", can_retry=True)
    verdict.answered(B, _answer(500))
    assert _marks(registry) == {A: 0, B: 0, C: 0}
    assert _outcomes(registry.get(B)) == []
    assert _sample(metrics, "prefixroute_request_faults_total", kind="status") == 1
    assert _sample(metrics, "prefixroute_upstream_failures_total", replica=B, kind="status") == 1


@pytest.mark.parametrize("status", [500, 501, 599])
def test_a_relayed_5xx_with_no_retry_to_judge_it_only_counts_in_the_error_rate(
    status: int,
) -> None:
    verdict, registry, metrics = _judge()
    verdict.answered(A, _answer(status))
    assert _marks(registry) == {A: 0, B: 0, C: 0}
    assert _outcomes(registry.get(A)) == [False]
    assert _sample(metrics, "prefixroute_upstream_failures_total", replica=A, kind="status") == 1


@pytest.mark.parametrize("status", [502, 503, 504])
def test_a_relayed_gateway_status_marks_the_replica(status: int) -> None:
    verdict, registry, metrics = _judge()
    verdict.answered(A, _answer(status))
    assert _marks(registry) == {A: 1, B: 0, C: 0}
    assert _sample(metrics, "prefixroute_upstream_failures_total", replica=A, kind="status") == 1


def test_a_stream_that_breaks_after_it_started_is_its_replicas() -> None:
    verdict, registry, metrics = _judge()
    verdict.answered(A, _answer(200, failure="disconnect"))
    assert _marks(registry) == {A: 1, B: 0, C: 0}
    assert _outcomes(registry.get(A)) == [False]
    assert (
        _sample(metrics, "prefixroute_upstream_failures_total", replica=A, kind="disconnect") == 1
    )


@pytest.mark.parametrize(("code", "errors"), [(500, 1), (503, 1), (400, 0), (429, 0)])
def test_a_stream_that_reports_an_error_in_band_is_judged_by_its_code(
    code: int, errors: int
) -> None:
    """A 200 stream, then ``data: {"error": ...}`` (``_sse``): a 5xx code counts in the error
    rate (as a relayed 5xx other than 502-504 does: no mark, so no single request takes a
    replica out) and in the failures metric; a 4xx is the request's; neither is a success."""
    verdict, registry, metrics = _judge()
    verdict.answered(A, _answer(200, error_status=code))
    assert _marks(registry) == {A: 0, B: 0, C: 0}
    assert _outcomes(registry.get(A)) == [False] * errors
    kind = _sample(metrics, "prefixroute_upstream_failures_total", replica=A, kind="error_event")
    assert kind == (1 if errors else None)
    # A suspect before it: a 5xx retry did not fail the same way, so the suspect is marked; a
    # 4xx says the request is bad, as a relayed 4xx does, and nobody is.
    verdict, registry, metrics = _judge()
    verdict.failed(A, "timeout", can_retry=True)
    verdict.answered(B, _answer(200, error_status=code))
    assert _marks(registry) == {A: errors, B: 0, C: 0}
    faults = _sample(metrics, "prefixroute_request_faults_total", kind="timeout")
    assert faults == (None if errors else 1)


def test_one_request_marks_at_most_one_replica() -> None:
    # A fails (suspected), the retry on B then breaks mid-stream: B is marked, A is not as well.
    verdict, registry, _ = _judge()
    verdict.failed(A, "status", can_retry=True)
    verdict.answered(B, _answer(200, failure="disconnect"))
    assert _marks(registry) == {A: 0, B: 1, C: 0}


@pytest.mark.parametrize(
    ("fields", "success"),
    [({}, True), ({"client_gone": True}, False), ({"cut": "slow_client"}, False)],
)
def test_only_an_answer_the_client_took_whole_counts_as_a_success(
    fields: dict[str, object], success: bool
) -> None:
    # A client that went away, or a stream we cut, says nothing about the replica.
    verdict, registry, _ = _judge()
    registry.get(A).failures = 2
    verdict.answered(A, _answer(200, **fields))
    assert registry.get(A).failures == (0 if success else 2)
    assert _outcomes(registry.get(A)) == ([True] if success else [])


# --- why a replica was taken out: the failure's kind ------------------------------------------


@pytest.mark.parametrize(
    ("steps", "why"),
    [
        ([("failed", A, "connect", True)], "connect"),
        ([("failed", A, "timeout", False)], "timeout"),
        ([("answered", A, 503)], "status 503"),
        ([("answered", A, "disconnect")], "disconnect"),
        ([("failed", A, "timeout", True), ("answered", B, 200)], "timeout"),
    ],
)
def test_an_ejection_names_the_failure_that_caused_it(
    steps: list[tuple[object, ...]], why: str, caplog: pytest.LogCaptureFixture
) -> None:
    verdict, _, _ = _judge(failure_threshold=1)
    with caplog.at_level(logging.WARNING, logger="prefixroute.gateway._registry"):
        for step in steps:
            if step[0] == "failed":
                verdict.failed(step[1], step[2], can_retry=step[3])  # type: ignore[arg-type]
            elif isinstance(step[2], int):
                verdict.answered(step[1], _answer(step[2]))  # type: ignore[arg-type]
            else:
                verdict.answered(step[1], _answer(200, failure=step[2]))  # type: ignore[arg-type]
    assert [r.getMessage() for r in caplog.records] == [
        f"replica {A} taken out after 1 failures ({why})"
    ]


def test_the_failure_kind_of_an_upstream_error_without_a_cause_is_error() -> None:
    assert _kind(UpstreamError("replica r failed")) == "error"


# --- the proxy's requests, through a gateway ---------------------------------------------------


async def test_replicas_get_the_body_as_json_with_the_upstream_headers(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    # The replica gets the parsed body re-encoded, as application/json whatever else the client
    # declared (a type a web page could send cross-site is refused: test_app.py), and the
    # request id.
    fake = await make_fake()
    gw = await make_gateway([fake.url])
    body = json.dumps({"prompt": "x", "max_tokens": 1}).encode()
    headers = {"Content-Type": "application/octet-stream", "x-request-id": "req-42"}
    async with session.post(gw.url + "/v1/completions", data=body, headers=headers) as r:
        assert r.status == 200
    seen = fake.seen[-1]
    sent = {name.lower(): value for name, value in seen.headers.items()}
    assert sent["content-type"] == "application/json"
    assert sent["x-request-id"] == "req-42"
    assert json.loads(seen.body) == {"prompt": "x", "max_tokens": 1}


async def test_a_request_for_a_model_goes_only_to_replicas_serving_it(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    a, b = await make_fake(models=("m1",)), await make_fake(models=("m2",))
    gw = await make_gateway([a.url, b.url], policy="round_robin")
    for _ in range(4):
        r = await send(session, gw.url, "/v1/completions", {"model": "m2", "prompt": "x"})
        assert r.headers["x-prefixroute-replica"] == b.url


class _Heard:
    """A RouteListener that records what it hears (what _sync shares with other instances)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []  # (call, request id, replica or "")
        self.tenants: list[str | None] = []  # the tenant of each routed request

    def routed(self, view: RequestView, decision: Decision) -> None:
        self.events.append(("routed", view.request_id, decision.replica))
        self.tenants.append(view.tenant)

    def first_token(self, request_id: str) -> None:
        self.events.append(("first_token", request_id, ""))

    def completed(self, request_id: str) -> None:
        self.events.append(("completed", request_id, ""))

    def withdrawn(self, request_id: str) -> None:
        self.events.append(("withdrawn", request_id, ""))


async def test_the_listener_hears_each_request_routed_started_and_completed(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    # The router's id of a request is the client's request id and a number (unique here), and
    # the listener hears it with the decision, the first token and the end. The view names the
    # tenant that sent it: "default" when the request names none (docs/security.md).
    fake = await make_fake(handler=one_event_stream)
    gw = await make_gateway([fake.url])
    heard = _Heard()
    proxy = gw.app[STATE].proxy
    assert proxy is not None
    proxy.listener = heard
    body = {"prompt": "x", "max_tokens": 1, "stream": True}
    reply = await send(session, gw.url, "/v1/completions", body, headers={"x-request-id": "q7"})
    assert reply.status == 200 and reply.done
    assert [call for call, _, _ in heard.events] == ["routed", "first_token", "completed"]
    rids = {rid for _, rid, _ in heard.events}
    assert len(rids) == 1 and rids.pop().startswith("q7-")
    assert heard.events[0][2] == fake.url
    assert heard.tenants == ["default"]


async def test_only_completions_and_chat_answers_feed_the_cache_prediction_metrics(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    # Other /v1/* calls are routed on load alone: their answers (even with a usage block) say
    # nothing about a cache prediction (gateway/_metrics.py: predicted vs actual cached tokens).
    fake = await make_fake()  # answers every call with a completion body and its usage
    gw = await make_gateway([fake.url])
    metrics = gw.app[STATE].metrics
    async with session.post(gw.url + "/v1/embeddings", json={"input": "hi"}) as resp:
        assert resp.status == 200
    labels = {"replica": fake.url, "outcome": "exact"}
    assert _sample(metrics, "prefixroute_cache_predictions_total", **labels) == 0
    reply = await send(session, gw.url, "/v1/completions", {"prompt": "x"})
    assert reply.status == 200
    assert _sample(metrics, "prefixroute_cache_predictions_total", **labels) == 1


def _traced(gw: Gateway) -> InMemorySpanExporter:
    """Trace ``gw``'s requests into memory, as ``otlp_endpoint`` does into a collector."""
    exporter = InMemorySpanExporter()
    proxy = gw.app[STATE].proxy
    assert proxy is not None
    proxy.tracing = RequestTracing(SimpleSpanProcessor(exporter), "test-gw")
    return exporter


def _request_spans(exporter: InMemorySpanExporter) -> list[tuple[object, StatusCode]]:
    """(HTTP status, span status) of each finished request (SERVER) span."""
    spans = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]
    return [((s.attributes or {}).get("http.response.status_code"), s.status.status_code)
            for s in spans]  # fmt: skip


async def test_a_traced_request_that_fails_ends_its_span_with_the_error_status_it_answered(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    # The only replica drops the connection: no retry, the client gets the upstream error (502),
    # and the request's span carries that status and is an error (RequestTracing.finish).
    async def drop(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.abort()
        return web.Response()

    fake = await make_fake(handler=drop)
    gw = await make_gateway([fake.url], failure_threshold=1000)
    exporter = _traced(gw)
    reply = await send(session, gw.url, "/v1/completions", {"prompt": "x", "max_tokens": 1})
    assert reply.status == 502
    assert _request_spans(exporter) == [(502, StatusCode.ERROR)]


async def test_a_traced_request_whose_client_leaves_ends_its_span_as_client_closed(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    # The client gives up while the replica still holds the answer: the handler is cancelled,
    # and the span ends with 499, nginx's "client closed request" (gateway/_proxy.py).
    release = asyncio.Event()
    fake = await make_fake(handler=held_until(release))
    gw = await make_gateway([fake.url])
    exporter = _traced(gw)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await send(session, gw.url, "/v1/completions", {"prompt": "x", "max_tokens": 1})
    await until(lambda: bool(_request_spans(exporter)))
    release.set()
    assert [status for status, _ in _request_spans(exporter)] == [499]
