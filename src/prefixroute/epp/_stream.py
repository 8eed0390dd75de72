"""One ext_proc stream (one HTTP request through Envoy): pick on the request, learn from the answer.

Envoy sends, on one gRPC stream, the request headers and body, maybe trailers, then the response
headers and body: :class:`PickStream` answers each (``handle``), with no I/O, on a given clock.

Request side. The body is the routing key, so it is held until its end. ``FULL_DUPLEX_STREAMED``
(the protocol's mode): nothing is answered until the body ends, then the headers answer (the
destination header, the ``envoy.lb`` metadata) and the whole body back as one streamed chunk.
``BUFFERED``: an empty headers answer, then the destination in the body answer. Picking is the
gateway's (``_admit``: tenant, key space, adapter, tokens; ``Router.route`` among the registry's
candidates, narrowed to the proxy's subset hint; a stored response's calls, to its replica only:
``_stored``). With ``fallbacks`` (N > 0) up to N more endpoints follow the primary, each the
policy's next choice (``Router.explain``, which records nothing). Errors are an
``ImmediateResponse`` with the gateway's status, headers and JSON body.

Response side, the gateway relay's accounting (``gateway._proxy``, ``gateway._verdict``): the
answer is read by ``_answer.AnswerReader``; its first output is the first token, timed only in
the streamed body modes; at the end the usage goes to ``Router.observe_usage``,
``Router.complete`` (a request turned away, first to ``Router.withdraw``) and the tenant's
prompt budget, the metrics count the answer and judge the replica, and a 400 over the context
window teaches the window. ``close`` ends, once, a request that did not end cleanly. A fallback
that served the answer means the primary failed it: the request is routed again to it, as the
gateway retries. A plain answer's first token is guessed when due (``gateway._accounting``).
``sync_redis``: decisions, first tokens, withdrawals and ends go to the Redis sync too."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from prefixroute.core import (
    Decision,
    Endpoint,
    PrefixrouteError,
    ReplicaId,
    RequestView,
)
from prefixroute.epp import _protocol as proto
from prefixroute.epp._admit import Admission, admit, request_key
from prefixroute.epp._answer import AnswerReader
from prefixroute.epp._candidates import eligible, endpoint_of, fallbacks
from prefixroute.epp._order import misordered, split_body
from prefixroute.epp._served import note_served
from prefixroute.epp._shared import PickShared, count_answer, judge_answer, refused
from prefixroute.epp._stored import StoredNote, stored_owner  # a stored response's
from prefixroute.gateway import (
    PREDICTED_HEADER,
    PROMPT_ENDPOINTS,
    REASON_HEADER,
    REPLICA_HEADER,
    TURNED_AWAY,
    FirstTokenGuess,
    Overloaded,
    PayloadTooLarge,
    RequestTracing,
    Shed,
    Usage,
    error_response,
    guess_first_token,
    is_anthropic,
    is_model_call,
    spec_for,
)

if TYPE_CHECKING:
    from opentelemetry.trace import Span

log = logging.getLogger(__name__)


class PickStream:
    def __init__(self, shared: PickShared) -> None:
        self.s = shared
        self.rid = f"epp-{next(shared.ids)}"  # the router's request id
        self.full_duplex_request = duplex = shared.default_full_duplex
        self.response_mode = proto.FULL_DUPLEX_STREAMED if duplex else proto.BUFFERED  # body mode
        self.headers: dict[str, str] = {}
        self._headers_seen = False  # the request's headers came (epp._order)
        self._body_mode: int | None = None  # the request body mode Envoy says it uses
        self.subset: list[str] | None = None
        self.admission: Admission | None = None  # the tenant, once admitted
        self.refused = False  # answered with an error: the rest of the request is ignored
        self._body: list[bytes] = []
        self._body_bytes: int | None = None  # of the request body so far (None: no message)
        self.decision: Decision | None = None
        self.destinations: list[str] = []  # what the proxy was told: primary, then fallbacks
        self.served: ReplicaId | None = None  # the replica the proxy says answered
        self.status = 0  # the response's status (0 until its headers)
        self._reader: AnswerReader | None = None  # the answer's first token and usage
        self._first_token = False
        self._usage_asked = False  # we asked for the usage: its event is kept from the client
        self._marked = False  # a replica was marked failed for this request (one at most)
        self._view: RequestView | None = None  # what was routed
        self._reason = ""  # the pick's reason (metrics, decision log)
        self._untimed = False  # routed again once answered (a fallback): no TTFT to learn
        self._span: Span | None = None  # the request's trace span (otlp_endpoint)
        self._done = False  # accounting ended (complete was called), or nothing to account
        self._plain = False  # no stream asked: its first token guessed, its whole time learned
        self._guess: FirstTokenGuess | None = None  # the guess when due (gateway._accounting)
        self._stored: StoredNote | None = None  # a Responses call: its answer's id (_stored)
        self._fetch = False  # a stored response's GET or cancel: its answer teaches nothing

    # --- the messages -----------------------------------------------------------------------
    async def handle(self, req: proto.Request) -> list[proto.Response]:
        kind = req.WhichOneof("request")
        if req.HasField("protocol_config"):
            cfg = req.protocol_config
            self.full_duplex_request = cfg.request_body_mode == proto.FULL_DUPLEX_STREAMED
            self.response_mode, self._body_mode = cfg.response_body_mode, cfg.request_body_mode
        if self.refused and kind in ("request_body", "request_trailers"):
            return []  # Envoy answered the client already; what still comes is not routed
        end = kind == "request_headers" and req.request_headers.end_of_stream
        wrong = misordered(kind, self._headers_seen, self._body_mode, end)
        if wrong is not None:
            return [self._error(wrong)]
        if kind == "request_headers":
            return await self._request_headers(req)
        if kind == "request_body":
            return await self._request_body(req.request_body)
        if kind == "request_trailers":
            out = await self._pick(end_of_body=False) if self.decision is None else []
            return out if self.refused else out + [proto.request_trailers_response()]
        if kind == "response_headers":
            return self._response_headers(req)
        if kind == "response_body":
            return self._response_body(req.response_body)
        if kind == "response_trailers":
            self._finish()
            return [proto.response_trailers_response()]
        return []

    def close(self) -> None:
        """The gRPC stream ended: a request in flight ends here (once), its tenant's slot freed;
        one whose answer had started is counted as serve counts a cut stream (no replica judged)."""
        decision = self.decision
        if decision is not None and not self._done and self.status and self._counted:
            self._count(self.served or decision.replica, self.status, decision)
        self._end_span(self.status)
        self._release(None)
        if self.admission is not None:
            self.admission.release()

    async def _request_headers(self, req: proto.Request) -> list[proto.Response]:
        self.headers, self._headers_seen = proto.headers_of(req.request_headers), True
        self.subset = proto.subset_of(req)
        tracing = self.s.state.tracing
        if tracing is not None:  # otlp_endpoint: a span per request, as serve's (_tracing)
            method = self.headers.get(":method", "")
            self._span = tracing.start_request(method, self._path, self.headers)
        try:
            self.admission = admit(self.s.tenants, self.headers, self.s.clock())
        except PrefixrouteError as exc:
            return [self._error(exc)]
        if req.request_headers.end_of_stream:  # no body: route on load alone
            return await self._pick(end_of_body=True, headers_only=True)
        if self.full_duplex_request:
            return []  # answered with the body's end
        # The pick comes with the body; the client's own destination never goes on (_order).
        return [proto.request_headers_response({}, remove=[proto.DESTINATION_HEADER])]

    async def _request_body(self, body: proto.Body) -> list[proto.Response]:
        if self.decision is not None:  # a last chunk sent again (Envoy >= 1.35): picked once
            return []
        self._body.append(body.body)
        self._body_bytes = (self._body_bytes or 0) + len(body.body)
        limit = self.s.state.config.max_body_bytes
        if self._body_bytes > limit:  # as serve's 413, before the body is all held here
            return [self._error(PayloadTooLarge(f"the request body exceeds {limit} bytes"))]
        if self.full_duplex_request and not body.end_of_stream:
            return []
        if (cut := split_body(self._body_mode, body.end_of_stream)) is not None:
            return [self._error(cut)]
        # Buffered, one message is the whole body: trailers may follow (end_of_stream false),
        # and Envoy waits for this answer before it sends them.
        return await self._pick(end_of_body=body.end_of_stream)

    # --- picking --------------------------------------------------------------------------
    async def _pick(self, end_of_body: bool, headers_only: bool = False) -> list[proto.Response]:
        body = b"".join(self._body)
        self._body = []
        try:
            scope = self.admission.scope if self.admission is not None else None
            keyed = body if self._posts else b""  # no prompt in another method's body
            key, replaced, self._usage_asked = await request_key(
                self.s.state, self._endpoint(), keyed, scope, self.headers.get("content-type", ""),
                ask_usage=self._editable_answer,  # the usage event can be kept back
            )  # fmt: skip
            owner, self._stored = stored_owner(self.s.state, self._path, key, body, scope)
            self._untimed = self._fetch = owner is not None and self._stored is None  # (_stored)
            started = time.perf_counter()  # the decision's time includes hashing, as serve's
            view = self._view = key.view(self.s.router, self.rid)
            if self.admission is not None:  # the tenant's prompt-token budget
                self.admission.scope.charge_prompt(view.prompt_tokens)
            self.destinations = self._route(view, started, owner)
            self._plain = not key.stream  # no first token to see (gateway._accounting)
            if self._plain:
                self._guess = guess_first_token(self.s.router, self.s.sync, self.rid, self.s.clock)
        except PrefixrouteError as exc:
            return [self._error(exc)]
        return self._answer(body, replaced, end_of_body, headers_only)

    def _count(self, replica: ReplicaId, status: int, decision: Decision) -> None:
        predicted = decision.predicted_cached_tokens
        count_answer(self.s, replica, status, self._reason, predicted, self._path)

    @property
    def _path(self) -> str:
        """The request's path, without its query."""
        return self.headers.get(":path", "").partition("?")[0]

    @property
    def _editable_answer(self) -> bool:
        """Chunks handed back (full duplex) or the whole body replaceable (buffered)."""
        return self.response_mode in (proto.FULL_DUPLEX_STREAMED, proto.BUFFERED)

    @property
    def _counted(self) -> bool:
        """A call counted as the gateway counts them (not a probe or a model listing)."""
        return is_model_call(self._path)

    def _endpoint(self) -> Endpoint:
        # Only a POST carries a prompt. A browser's CORS preflight (OPTIONS) or a GET of a
        # prompt path was refused 400 "not valid JSON"; it goes on, routed on load alone, and
        # the replica answers it, as the reference picker lets a body-less request through.
        return PROMPT_ENDPOINTS.get(self._path, Endpoint.OTHER) if self._posts else Endpoint.OTHER

    @property
    def _posts(self) -> bool:
        """The request is a POST, the only method whose body can carry a prompt."""
        return self.headers.get(":method", "POST").upper() == "POST"

    def _answer(
        self, body: bytes, replaced: bytes | None, end_of_body: bool, headers_only: bool
    ) -> list[proto.Response]:
        """The pick as Envoy takes it, in the body mode of this request."""
        value = proto.destination(self.destinations)
        headers = {proto.DESTINATION_HEADER: value}
        remove: list[str] = []
        if self.admission is not None:
            headers.update(self.admission.set_headers)
            remove = self.admission.remove_headers
        if replaced is not None:  # the body changed length: say so, as the protocol's EPP does
            headers["content-length"] = str(len(replaced))
        if self._usage_asked:  # a compressed stream could not be read to keep that usage back
            headers["accept-encoding"] = "identity"
        if self._span is not None:  # the replica continues our trace (vLLM's --otlp-traces-...)
            headers.update(RequestTracing.traceparent(self._span))
        # Trailers with no body before them (not end_of_body, nothing read): headers only, too.
        headers_only = headers_only or (self._body_bytes is None and not end_of_body)
        return proto.pick_responses(
            headers, value, remove, self.full_duplex_request, headers_only,
            body, replaced, end_of_body,
        )  # fmt: skip

    def _route(self, view: RequestView, started: float, owner: ReplicaId | None) -> list[str]:
        """Route ``view``: the primary's endpoint, then the fallbacks' (``started``: when its
        hashing began, ``perf_counter``; ``owner``: the one replica it may go to)."""
        s = self.s
        candidates = eligible(s.registry, view, self.subset, owner)
        now = s.clock()
        span, tracing = self._span, s.state.tracing
        decision = s.router.route(view, now, candidates, explain=span is not None)
        if span is not None and tracing is not None:
            tracing.record_decision(span, decision, s.registry.public_name, s.router.policy.name)
        chosen = [decision.replica]
        chosen += fallbacks(s.router, view, now, candidates, decision.replica, s.fallbacks)
        s.metrics.decision_seconds.observe(time.perf_counter() - started)
        self.decision, self._reason = decision, decision.reason.value
        if s.sync is not None:
            try:  # the others miss one decision; this request still goes out (as serve's)
                s.sync.routed(view, decision)
            except Exception:
                log.exception("%s: sharing the decision failed", self.rid)
        return [endpoint_of(rid) for rid in chosen]

    def _error(self, exc: PrefixrouteError) -> proto.Response:
        """The gateway's answer to ``exc`` (status, Retry-After, JSON body), from the picker."""
        self.refused = True
        if self.decision is not None and not self._done:  # routed, now never sent (_order)
            self.s.router.withdraw(self.rid)
            if self.s.sync is not None:  # the others take its blocks back too, as in _finish
                self.s.sync.withdrawn(self.rid)
            self._release(None)
        self._done = True  # nothing (more) to account
        if type(exc) is Overloaded:  # the protocol's answer to a request shed under load
            exc = Shed(str(exc))
        answer = error_response(exc, self.s.state.config.retry_after_s, is_anthropic(self._path))
        self._end_span(answer.status)
        if self._counted:
            self.s.metrics.count_request("none", answer.status, "none")
        headers = {k.lower(): v for k, v in answer.headers.items() if k.lower() != "content-length"}
        body = answer.body if isinstance(answer.body, bytes) else b""
        spec = spec_for(exc)  # every row names a code; the type stands in for one that did not
        details = spec.code or spec.type
        return proto.immediate_response(answer.status, body, headers, details=details)

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
        note_served(self, proto.served_of(req), decision)
        reading = ("content-encoding" in headers, self._usage_asked, self._stored is not None)
        self._reader = AnswerReader(headers.get("content-type", ""), *reading)
        extra = {
            REPLICA_HEADER: self.s.registry.public_name(self.served or decision.replica),
            REASON_HEADER: decision.reason.value,
            PREDICTED_HEADER: str(decision.predicted_cached_tokens),
        }
        out = [proto.response_headers_response(extra)]
        if req.response_headers.end_of_stream:
            self._finish()
        return out

    def _response_body(self, body: proto.Body) -> list[proto.Response]:
        chunk, reader = body.body, self._reader
        if reader is not None and self.decision is not None and not self._done:
            chunk, output = reader.feed(chunk, body.end_of_stream)  # our usage event kept back
            if self._stored is not None and self.status == 200:  # a Responses answer's id
                self._stored.read(reader, self.served or self.decision.replica, body.end_of_stream)
            if output:
                self._first()
            if body.end_of_stream:
                self._finish()
        if self.response_mode == proto.FULL_DUPLEX_STREAMED:
            return [proto.response_body_response(chunk, body.end_of_stream)]
        if reader is not None and reader.edits:  # buffered: the whole answer, replaced
            return [proto.response_body_response(replaced=chunk)]
        return [proto.response_body_response()]

    def _first(self) -> None:
        """The first token came back (once)."""
        if not self._first_token:
            self._first_token = True
            # Streamed modes pass chunks as the replica sends them; BUFFERED holds the whole
            # answer to its end, where its first chunk's time is no first token's.
            timed = self.response_mode in (proto.STREAMED, proto.FULL_DUPLEX_STREAMED)
            measured = timed and not self._untimed
            self.s.router.first_token(self.rid, self.s.clock(), measured=measured)
            if self.s.sync is not None:
                self.s.sync.first_token(self.rid)

    def _finish(self) -> None:
        """The answer ended cleanly: learn from its usage, count it, release the request."""
        decision = self.decision
        if decision is None or self._done:
            return
        reader = self._reader
        usage = reader.usage() if reader is not None and not self._fetch else None
        replica, s = self.served or decision.replica, self.s
        status = self.status
        if self._usage_asked and status == 200:  # its 400s naming them are requests' own
            s.state.stream_usage_taken(s.registry.public_name(replica))
        if status == 400 and reader is not None:
            refused(s, replica, reader, self._usage_asked)
        if self._counted:
            self._count(replica, status, decision)
        error = reader.error_status if reader is not None else None
        if status == 200 and error is None and self._endpoint() is not Endpoint.OTHER:
            cached, prompt = (usage.cached_tokens, usage.prompt_tokens) if usage else (None, None)
            s.metrics.observe_usage(replica, decision.predicted_cached_tokens, cached, prompt)
        if s.registry.router.has_replica(replica):
            busy = reader is not None and reader.busy(status)
            judge_answer(s, replica, status, marked=self._marked, error_status=error, busy=busy)
        if status in TURNED_AWAY:  # the replica computed none of the prompt (gateway._proxy)
            s.router.withdraw(self.rid)
            if s.sync is not None:
                s.sync.withdrawn(self.rid)
        self._end_span(status)
        self._release(usage if status == 200 else None, later=True)

    def _end_span(self, status: int) -> None:
        """End the request's span (once) with the answer's status; 0: none came."""
        span, self._span = self._span, None
        if span is not None and status:
            RequestTracing.finish(span, status)
        elif span is not None:
            RequestTracing.abandon(span)

    def _release(self, usage: Usage | None, later: bool = False) -> None:
        if self._done or self.decision is None:
            return
        self._done = True
        if self._guess is not None:
            self._guess.cancel()
        whole = self._plain and usage is not None and not self._untimed  # a fallback: unsent
        self.s.end(self.rid, usage, whole, later)  # later: a clean end (PickShared.later)
        if usage is not None and self.admission and self._view and not self._fetch:  # as serve
            self.admission.scope.settle_prompt(self._view.prompt_tokens, usage)
