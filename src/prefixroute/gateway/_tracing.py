"""OpenTelemetry tracing of routed requests: off unless an OTLP endpoint is configured.

One SERVER span per routed request (``POST /v1/chat/completions``), joined to the caller's trace
when it sent a W3C ``traceparent``. It carries the decision: the chosen replica, the reason, the
predicted cached tokens and, as one ``prefixroute.candidate`` event each, what the policy saw of
every candidate (matched blocks, in-flight requests, queued prefill and, from the default policy,
predicted TTFT and score). Under it, one CLIENT span per upstream attempt, whose context goes to
the replica as ``traceparent`` (vLLM continues it when started with ``--otlp-traces-endpoint``).

Replicas appear by their public name (``r-<hash>``), as in headers and errors: by URL only
with ``expose_replica_urls``.

The provider is this gateway's own, never the process-global one, so two gateways in one process
(tests, benchmarks) export separately. Spans are batched off the event loop
(``BatchSpanProcessor``): the request path pays for building the span, not for exporting it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from prefixroute import __version__
from prefixroute.core import ConfigError, Decision, ReplicaId

_PROPAGATOR = TraceContextTextMapPropagator()  # W3C traceparent / tracestate


class RequestTracing:
    """Builds the spans of routed requests and exports them through one span processor."""

    def __init__(self, processor: SpanProcessor, service_name: str = "prefixroute") -> None:
        resource = Resource.create(
            {"service.name": service_name, "service.version": __version__}
        )
        self._provider = TracerProvider(resource=resource)
        self._provider.add_span_processor(processor)
        self._tracer = self._provider.get_tracer("prefixroute.gateway", __version__)

    @classmethod
    def to_otlp(cls, endpoint: str, service_name: str = "prefixroute") -> RequestTracing:
        """Export over OTLP/gRPC to ``endpoint`` (``http://host:4317``: plaintext;
        ``https://``: TLS), in batches."""
        # Imported here: the exporter pulls in grpc and protobuf modules that a gateway without
        # tracing never needs at startup.
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError as exc:  # xds-protos' older copy of the OTLP protos won (Makefile)
            raise ConfigError(
                f"the OTLP exporter cannot load ({exc}); reinstall its protos last: "
                "pip install --force-reinstall --no-deps opentelemetry-proto"
            ) from exc

        exporter: SpanExporter = OTLPSpanExporter(
            endpoint=endpoint, insecure=endpoint.startswith("http://")
        )
        return cls(BatchSpanProcessor(exporter), service_name)

    def start_request(self, method: str, path: str, headers: Mapping[str, str]) -> Span:
        """The SERVER span of one request, child of the caller's ``traceparent`` if any."""
        parent = _PROPAGATOR.extract(headers)
        return self._tracer.start_span(
            f"{method} {path}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": path},
        )

    @staticmethod
    def record_decision(
        span: Span, decision: Decision, name_of: Callable[[ReplicaId], str], policy: str
    ) -> None:
        """The decision's replica, reason and prediction, and one event per candidate; every
        replica named by ``name_of`` (the registry's public name), never by its URL."""
        span.set_attributes(
            {
                "prefixroute.policy": policy,
                "prefixroute.replica": name_of(decision.replica),
                "prefixroute.reason": str(decision.reason),
                "prefixroute.predicted_cached_tokens": decision.predicted_cached_tokens,
            }
        )
        for c in decision.candidates:
            attributes: dict[str, Any] = {
                "prefixroute.replica": name_of(c.replica),
                "prefixroute.chosen": c.replica == decision.replica,
                "prefixroute.matched_blocks": c.matched_blocks,
                "prefixroute.cached_tokens": c.cached_tokens,
                "prefixroute.in_flight": c.in_flight,
                "prefixroute.queued_prefill_tokens": c.queued_prefill_tokens,
            }
            if c.predicted_ttft_s is not None:
                attributes["prefixroute.predicted_ttft_s"] = c.predicted_ttft_s
            if c.score is not None:
                attributes["prefixroute.score"] = c.score
            span.add_event("prefixroute.candidate", attributes)

    @contextmanager
    def upstream(
        self, parent: Span, replica_name: str, headers: MutableMapping[str, str]
    ) -> Iterator[Span]:
        """A CLIENT span for one upstream attempt; its ``traceparent`` is set in ``headers``.

        The span is never made the current one: nothing in the attempt reads the current
        context, and attaching one costs as much as the span itself (measured).
        """
        span = self._tracer.start_span(
            "POST upstream",
            context=trace.set_span_in_context(parent),
            kind=SpanKind.CLIENT,
            attributes={"prefixroute.replica": replica_name},
        )
        _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))
        try:
            yield span
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            span.end()

    @staticmethod
    def traceparent(span: Span) -> dict[str, str]:
        """The W3C headers that make ``span`` the parent of what the replica traces (the
        endpoint picker's answer carries them to the replica through the proxy)."""
        out: dict[str, str] = {}
        _PROPAGATOR.inject(out, context=trace.set_span_in_context(span))
        return out

    @staticmethod
    def abandon(span: Span) -> None:
        """End the request span of a request that ended before any answer (an error)."""
        span.set_status(Status(StatusCode.ERROR, "ended before an answer"))
        span.end()

    @staticmethod
    def finish(span: Span, status: int) -> None:
        """End the request span with its HTTP status (5xx marks it an error)."""
        span.set_attribute("http.response.status_code", status)
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR))
        span.end()

    def shutdown(self) -> None:
        """Flush what is batched and stop exporting (on gateway stop)."""
        self._provider.shutdown()


@contextmanager
def under_span(
    tracing: RequestTracing, span: Span, name: str, headers: dict[str, str]
) -> Iterator[Mapping[str, str]]:
    """``headers``, with the ``traceparent`` of an upstream CLIENT span open meanwhile."""
    with tracing.upstream(span, name, headers):
        yield headers


def attempt_headers(
    tracing: RequestTracing | None, span: Span | None, name: str, headers: Mapping[str, str]
) -> AbstractContextManager[Mapping[str, str]]:
    """The upstream headers of one attempt on replica ``name``, under its own CLIENT span when
    the request is traced (its ``traceparent`` goes to the replica). Untraced, ``headers`` as
    they are, in a context that costs nothing to enter (no generator per attempt)."""
    if span is None or tracing is None:
        return nullcontext(headers)
    return under_span(tracing, span, name, dict(headers))
