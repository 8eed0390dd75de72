"""One ext_proc stream (one HTTP request through Envoy): pick on the request, learn from the answer.

Envoy opens one gRPC stream per HTTP request and sends, in order, the request headers, the
request body (in chunks), maybe trailers, then the response headers and body. :class:`PickStream`
turns each message into the responses Envoy waits for (``handle``), so the gRPC servicer only
loops; this module does no I/O and takes the time from a clock it is given.

Request side. The body is needed to pick (the prompt is the routing key), so it is held until
its end. Two body modes are served, told apart by the ``protocol_config`` Envoy sends first:

* ``FULL_DUPLEX_STREAMED`` (the protocol's streaming mode): Envoy does not wait for our headers
  answer before sending body chunks. We answer nothing until the body ends, then send the headers
  answer (the destination header, the ``envoy.lb`` metadata) and the whole body back as one
  streamed chunk.
* ``BUFFERED``: Envoy sends the whole body in one message after our (empty) headers answer; the
  destination goes in the body answer, whose header mutation still applies (nothing was sent).

Picking is the gateway's: the body is read under the gateway's strict JSON rules
(``parse_body``/``key_of``) into the core's ``RouteKey``, whose ``view`` is what the router
routes on, and the decision is ``Router.route`` among the registry's candidates (healthy,
serving the model, under their in-flight cap), narrowed to the proxy's subset hint when there is
one. Errors become an ``ImmediateResponse`` with the status and JSON body of the gateway's one
error table (400 for a body we cannot route, 503 when nothing is eligible).

Response side, the same accounting as the gateway's relay (``gateway._proxy``): the first SSE
data event is the request's first token (``Router.first_token``); at the end, the ``usage`` of the
last usage-bearing event (or of the whole JSON body) goes to ``Router.observe_usage`` and
``Router.complete`` with the completion tokens. ``close`` (the stream ended, however) completes a
request that did not end cleanly, once. Response chunks go back at once: full duplex hands them
back as streamed chunks, other modes just continue, so streaming is not held up.

With ``sync_redis``, the decision, the first token and the end are also handed to the Redis sync
(``gateway.RouteSync``) at the same three points as in the gateway's proxy, so several pickers,
and gateways, on one channel share one index and one load view.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from prefixroute.core import (
    EMPTY_KEY,
    ConfigError,
    Decision,
    Endpoint,
    NoReplicaAvailable,
    PrefixrouteError,
    ReplicaId,
    RouteKey,
    Router,
)
from prefixroute.epp import _protocol as proto
from prefixroute.gateway import (
    PREDICTED_HEADER,
    REASON_HEADER,
    REPLICA_HEADER,
    DecisionEntry,
    FleetView,
    GatewayMetrics,
    ReplicaRegistry,
    RouteSync,
    SSEScanner,
    Usage,
    error_body,
    key_of,
    normalize_url,
    parse_body,
    spec_for,
    usage_in_body,
)

log = logging.getLogger(__name__)

MAX_PLAIN_BODY = 1024 * 1024  # bytes of a plain answer kept to read its usage (the rest passes)
_GATEWAY_STATUSES = frozenset({502, 503, 504})  # Envoy's own answers when the replica failed
_PATHS = {"/v1/completions": Endpoint.COMPLETIONS, "/v1/chat/completions": Endpoint.CHAT}


def endpoint_of(rid: ReplicaId) -> str:
    """``http://10.0.0.7:8000`` -> ``10.0.0.7:8000``, the protocol's form."""
    return urlsplit(rid).netloc


def replica_of(endpoint: str) -> ReplicaId:
    """``10.0.0.7:8000`` (or a URL with a port) -> the registry's id; raises ConfigError."""
    rid = normalize_url(endpoint if "://" in endpoint else "http://" + endpoint)
    try:
        port = urlsplit(rid).port
    except ValueError:
        port = None
    if port is None or any(c.isspace() for c in rid):
        raise ConfigError(f"an endpoint must be IP:PORT (or a URL with a port), got {endpoint!r}")
    return rid


@dataclass(slots=True)
class PickShared:
    """What every stream of one picker shares."""

    router: Router
    registry: ReplicaRegistry
    metrics: GatewayMetrics
    default_full_duplex: bool = True  # body mode when Envoy does not say (older Envoys)
    clock: Callable[[], float] = time.monotonic  # seconds
    ids: itertools.count[int] = field(default_factory=itertools.count)
    # sync_redis: each decision, first token and end is also told to the other pickers and
    # gateways, as the gateway's proxy tells them (its methods return at once, never raise)
    sync: RouteSync | None = None
    fleet: FleetView | None = None  # the fleet page's recent decisions, when it is mounted


class PickStream:
    def __init__(self, shared: PickShared) -> None:
        self.s = shared
        self.rid = f"epp-{next(shared.ids)}"  # the router's request id
        self.full_duplex_request = shared.default_full_duplex
        self.full_duplex_response = shared.default_full_duplex
        self.headers: dict[str, str] = {}
        self.subset: list[str] | None = None
        self._body: list[bytes] = []
        self.decision: Decision | None = None
        self.status = 0  # the response's status (0 until its headers)
        self._scanner: SSEScanner | None = None
        self._plain: list[bytes] = []
        self._plain_bytes = 0
        self._first_token = False
        self._done = False  # accounting ended (complete was called), or nothing to account

    # --- the messages -----------------------------------------------------------------------
    def handle(self, req: proto.Request) -> list[proto.Response]:
        kind = req.WhichOneof("request")
        if req.HasField("protocol_config"):
            cfg = req.protocol_config
            self.full_duplex_request = cfg.request_body_mode == proto.FULL_DUPLEX_STREAMED
            self.full_duplex_response = cfg.response_body_mode == proto.FULL_DUPLEX_STREAMED
        if kind == "request_headers":
            return self._request_headers(req)
        if kind == "request_body":
            return self._request_body(req.request_body)
        if kind == "request_trailers":
            out = self._pick(end_of_body=False) if self.decision is None else []
            return out + [proto.request_trailers_response()]
        if kind == "response_headers":
            return self._response_headers(req)
        if kind == "response_body":
            return self._response_body(req.response_body)
        if kind == "response_trailers":
            self._finish()
            return [proto.response_trailers_response()]
        return []

    def close(self) -> None:
        """The gRPC stream ended: a request still counted in flight ends here (once)."""
        self._release(None)

    def _request_headers(self, req: proto.Request) -> list[proto.Response]:
        self.headers = proto.headers_of(req.request_headers)
        self.subset = proto.subset_of(req)
        if req.request_headers.end_of_stream:  # no body: route on load alone
            return self._pick_headers_only()
        if self.full_duplex_request:
            return []  # answered with the body's end
        return [proto.request_headers_response({})]

    def _request_body(self, body: proto.Body) -> list[proto.Response]:
        self._body.append(body.body)
        if not body.end_of_stream:
            return []
        return self._pick(end_of_body=True)

    # --- picking --------------------------------------------------------------------------
    def _pick_headers_only(self) -> list[proto.Response]:
        try:
            decision = self._route(EMPTY_KEY)
        except PrefixrouteError as exc:
            return [self._error(exc)]
        endpoint = endpoint_of(decision.replica)
        return [proto.request_headers_response({proto.DESTINATION_HEADER: endpoint}, endpoint)]

    def _pick(self, end_of_body: bool) -> list[proto.Response]:
        body = b"".join(self._body)
        self._body = []
        try:
            decision = self._route(self._key(body))
        except PrefixrouteError as exc:
            return [self._error(exc)]
        endpoint = endpoint_of(decision.replica)
        dest = {proto.DESTINATION_HEADER: endpoint}
        if self.full_duplex_request:
            return [
                proto.request_headers_response(dest, endpoint),
                proto.request_body_response(streamed=body, end_of_stream=end_of_body),
            ]
        return [proto.request_body_response(dest, endpoint)]

    def _key(self, body: bytes) -> RouteKey:
        path = self.headers.get(":path", "").split("?", 1)[0]
        endpoint = _PATHS.get(path, Endpoint.OTHER)
        if not body:
            return EMPTY_KEY
        return key_of(endpoint, parse_body(body))  # BadRequest / InvalidJSON: a 400

    def _route(self, key: RouteKey) -> Decision:
        s = self.s
        started = time.perf_counter()
        view = key.view(s.router, self.rid)
        candidates = _narrow(s.registry.candidates(key.model), self.subset)
        decision = s.router.route(view, s.clock(), candidates)
        s.metrics.decision_seconds.observe(time.perf_counter() - started)
        self.decision = decision
        if s.sync is not None:
            s.sync.routed(view, decision)
        return decision

    def _error(self, exc: PrefixrouteError) -> proto.Response:
        spec = spec_for(exc)
        self._done = True  # nothing was routed: nothing to account
        self.s.metrics.count_request("none", spec.status, "none")
        body = json.dumps(error_body(str(exc), spec.type, spec.code), separators=(",", ":"))
        # Every row of the gateway's table names a code; the type stands in for one that did not.
        details = spec.code or spec.type
        return proto.immediate_response(spec.status, body.encode(), details=details)

    # --- the answer -----------------------------------------------------------------------
    def _response_headers(self, req: proto.Request) -> list[proto.Response]:
        headers = proto.headers_of(req.response_headers)
        try:
            self.status = int(headers.get(":status", "0"))
        except ValueError:
            self.status = 0
        decision = self.decision
        if decision is None:  # an answer to a request we did not route (our own error)
            return [proto.response_headers_response({})]
        served = proto.served_of(req)
        if served is not None and served != endpoint_of(decision.replica):
            log.info("%s: picked %s, served by %s", self.rid, decision.replica, served)
        if headers.get("content-type", "").startswith("text/event-stream"):
            self._scanner = SSEScanner()
        extra = {
            REPLICA_HEADER: self.s.registry.public_name(decision.replica),
            REASON_HEADER: decision.reason.value,
            PREDICTED_HEADER: str(decision.predicted_cached_tokens),
        }
        out = [proto.response_headers_response(extra)]
        if req.response_headers.end_of_stream:
            self._finish()
        return out

    def _response_body(self, body: proto.Body) -> list[proto.Response]:
        chunk = body.body
        if self.decision is not None and not self._done:
            scanner = self._scanner
            if scanner is not None:
                scanner.feed(chunk)
                if scanner.saw_data and not self._first_token:
                    self._first_token = True
                    self.s.router.first_token(self.rid, self.s.clock())
                    if self.s.sync is not None:
                        self.s.sync.first_token(self.rid)
            elif self._plain_bytes < MAX_PLAIN_BODY:
                self._plain.append(chunk)
                self._plain_bytes += len(chunk)
            if body.end_of_stream:
                self._finish()
        if self.full_duplex_response:
            return [proto.response_body_response(chunk, body.end_of_stream)]
        return [proto.response_body_response()]

    def _finish(self) -> None:
        """The answer ended cleanly: learn from its usage, count it, release the request."""
        decision = self.decision
        if decision is None or self._done:
            return
        usage: Usage | None
        if self._scanner is not None:
            self._scanner.flush()
            usage = self._scanner.usage
        else:
            usage = usage_in_body(b"".join(self._plain)) if self._plain else None
        replica, s = decision.replica, self.s
        status = self.status
        s.metrics.count_request(s.registry.public_name(replica), status, decision.reason.value)
        if s.fleet is not None:
            path = self.headers.get(":path", "").partition("?")[0]
            s.fleet.decisions.record(
                DecisionEntry(
                    time.time(), replica, decision.reason.value, status,
                    decision.predicted_cached_tokens, path,
                )
            )  # fmt: skip
        if status == 200 and usage is not None:
            s.metrics.observe_usage(replica, decision.predicted_cached_tokens, usage.cached_tokens)
        if s.registry.router.has_replica(replica):
            if status in _GATEWAY_STATUSES:  # Envoy could not reach it, or it broke
                s.registry.record_failure(replica, s.clock(), f"status {status}")
            elif 200 <= status < 500:
                s.registry.record_success(replica, s.clock())
        self._release(usage if status == 200 else None)

    def _release(self, usage: Usage | None) -> None:
        if self._done or self.decision is None:
            return
        self._done = True
        router = self.s.router
        output = None
        if usage is not None:
            if usage.prompt_tokens is not None and usage.cached_tokens is not None:
                router.observe_usage(self.rid, usage.prompt_tokens, usage.cached_tokens)
            output = usage.completion_tokens
        router.complete(self.rid, self.s.clock(), output)
        if self.s.sync is not None:
            self.s.sync.completed(self.rid)


def _narrow(candidates: Sequence[ReplicaId], subset: Sequence[str] | None) -> list[ReplicaId]:
    """``candidates`` within the proxy's subset hint (all of them without one); raises
    NoReplicaAvailable when the hint leaves none, as the protocol wants (503)."""
    if subset is None:
        return list(candidates)
    allowed = set()
    for endpoint in subset:
        try:
            allowed.add(replica_of(endpoint))
        except PrefixrouteError:
            continue  # a malformed entry is just not eligible
    narrowed = [rid for rid in candidates if rid in allowed]
    if not narrowed:
        raise NoReplicaAvailable(
            f"none of the {len(subset)} endpoints of the proxy's subset hint is eligible"
        )
    return narrowed
