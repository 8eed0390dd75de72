"""One proxied request: ask the router, send it upstream, relay, account; retry once.

The four steps of a handler (parse, ask the core, proxy, account) are split so that this module
holds the last three. Accounting goes through the router's one bookkeeping path:
``route`` counts the request in flight, the first SSE event with output is ``first_token``,
and ``complete`` runs in ``finally``, so a disconnect, a cancellation or an error releases it
the same way. An answer that went out is ended a loop turn after its last bytes were handed to
the transport (``Release.after_answer``): what the router learns from it is not the client's
wait.

Retry rule: if the upstream fails before any byte reached the client (refused, reset, timed out,
or answered 5xx), the request is routed again among the remaining candidates, once. A replica
that answers 429 is full, not failing: the request goes to another, as long as there is one,
without counting as the retry and without blame (``_upstream_answers``); so does a prompt over
a replica's context window, to a larger one (``_context_window``). A replica that turned
a request away (a 429, any 4xx, a refused connection) computed none of it, so the router takes
back the blocks its decision added to the index (``Router.withdraw``). Before that,
a request whose pooled connection the replica had closed is sent to it again (``_pool.send``):
the replica never read it, so that is no failure of anyone's.

Whose fault a failure was, and whether it marks the replica, is ``_verdict``'s (its module
docstring has the rules: client garbage cannot take replicas out, since each poison request
fails the same way everywhere); this module feeds it each attempt's failure or answer.

First-byte deadline: a stream's first event must arrive within ``clamp(4 x predicted TTFT,
first_byte_floor_s, first_byte_cap_s)`` (the replica's queued prefill, ours included, at its
learned speed), or, if the replica sent others' first tokens or answers meanwhile, within
another such period (busy, not stopped: ``_first_byte``); past it the attempt is a timeout and
is retried elsewhere. A plain answer arrives whole, at the end of decoding: no such deadline,
and silent past read_timeout_s while its replica answered others it is a 504, not retried
(``_verdict``); any attempt waiting on a replica taken out (by failed probes, or others'
deadlines) is abandoned at once and retried.

Calibration: each answer's ``usage`` goes to the router (``observe_usage``, then ``complete``
with the completion tokens) when the replica's response ends, and a stream's first event is
its measured first token, so the router learns every replica's prefill rate and decode step
from real traffic (``core.speed``). A plain answer's first token is guessed when due, and its
whole time teaches at its end (``_accounting``). The replica of each Responses answer is noted,
and a call naming a stored response goes there only (``_responses``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from opentelemetry.trace import Span

from prefixroute._pool import send
from prefixroute.core import (
    Decision,
    NoReplicaAvailable,
    ReplicaId,
    RequestView,
    Router,
)
from prefixroute.gateway import _context_window as window
from prefixroute.gateway._accounting import Release
from prefixroute.gateway._admission import REQUEST_ID_HEADER
from prefixroute.gateway._config import GatewayConfig
from prefixroute.gateway._errors import Overloaded, UpstreamError, spec_for
from prefixroute.gateway._failures import upstream_error
from prefixroute.gateway._first_byte import arm
from prefixroute.gateway._listener import RouteListener
from prefixroute.gateway._metrics import GatewayMetrics
from prefixroute.gateway._paths import upstream_target
from prefixroute.gateway._registry import ReplicaRegistry
from prefixroute.gateway._relay import (
    RelayResult,
    StreamControl,
    is_event_stream,
    relay_stream,
)
from prefixroute.gateway._relay_plain import relay_plain
from prefixroute.gateway._requests import Admitted, Endpoint, payload_of
from prefixroute.gateway._responses import ResponseOwners, pinned
from prefixroute.gateway._tracing import RequestTracing, attempt_headers
from prefixroute.gateway._upstream_answers import (
    ReplicaBusy,
    UsageRefused,
    kind_of,
    not_for_the_client,
)
from prefixroute.gateway._usage import without_stream_usage
from prefixroute.gateway._verdict import Verdict

log = logging.getLogger(__name__)

REPLICA_HEADER = "x-prefixroute-replica"
REASON_HEADER = "x-prefixroute-reason"
PREDICTED_HEADER = "x-prefixroute-predicted-cached-tokens"  # the decision's prediction, tokens
MAX_ATTEMPTS = 2  # the first try and one retry
CLIENT_GONE = 499  # a traced request cancelled before its answer (nginx's "client closed")
# Answers of a replica that did not take the request (full, or refusing it): it computed no
# block of the prompt, so the router takes back what its decision added (Router.withdraw).
TURNED_AWAY = frozenset(range(400, 500))
# First-byte deadline: this many times the predicted TTFT (then clamped to the configured floor
# and cap), leaving room for an estimate that is still learning.
FIRST_BYTE_FACTOR = 4.0


@dataclass(slots=True)
class RequestOutcome:
    """Labels of a request's final answer, for the requests counter."""

    replica: str = "none"  # replica of the last attempt
    reason: str = "none"  # decision reason of the last attempt


OUTCOME = web.RequestKey("prefixroute.outcome", RequestOutcome)


@dataclass(frozen=True, slots=True)
class _Call:
    """One request as every attempt sends it: the same body and headers to each replica."""

    request: web.Request
    admitted: Admitted  # the request as the handler read it: key, body, headers, tenant
    rid: str  # the router's id of the request
    view: RequestView  # what the router routes on
    span: Span | None = None  # its trace span, when tracing is on
    can_move: bool = True  # the attempt under way has another replica to go to (a 429)


class Proxy:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        router: Router,
        registry: ReplicaRegistry,
        metrics: GatewayMetrics,
        listener: RouteListener | None = None,
        is_cutting: Callable[[], bool] = lambda: False,
        tracing: RequestTracing | None = None,
        on_usage_refused: Callable[[str], None] = lambda replica: None,
        on_usage_taken: Callable[[str], None] = lambda replica: None,
        responses: ResponseOwners | None = None,
    ) -> None:
        self.session = session
        self.listener = listener
        self.router = router
        self.registry = registry
        self.metrics = metrics
        self.config: GatewayConfig = registry.config
        self.is_cutting = is_cutting  # the shutdown drain bound has passed
        self.tracing = tracing  # otlp_endpoint: a span per request (_tracing)
        self.on_usage_refused = on_usage_refused  # (its name) refused stream_options: stop asking
        self.on_usage_taken = on_usage_taken  # (its name) answered 200 to stream_options
        self.responses = responses if responses is not None else ResponseOwners()  # stored ones
        self._ids = itertools.count()

    async def forward(self, request: web.Request, admitted: Admitted) -> web.StreamResponse:
        """Route and relay one request, as the handler read it (``_app._admit``)."""
        request[OUTCOME] = RequestOutcome()
        rid = f"{admitted.request_id or 'gw'}-{next(self._ids)}"  # unique for the router
        started = time.perf_counter()
        view = admitted.key.view(self.router, rid)  # in the key's tenant and adapter space
        hash_s = time.perf_counter() - started
        if admitted.scope is not None:
            admitted.scope.charge_prompt(view.prompt_tokens)
        span = None
        if self.tracing is not None:  # a span per request, carried by the request's one call
            span = self.tracing.start_request(request.method, request.path, request.headers)
        call = _Call(request, admitted, rid, view, span)
        if span is None:
            return await self._attempts(call, hash_s)
        status = CLIENT_GONE  # cancelled: the client went away
        try:
            response = await self._attempts(call, hash_s)
            status = response.status
            return response
        except Exception as exc:
            status = spec_for(exc).status
            raise
        finally:
            RequestTracing.finish(span, status)

    async def _attempts(self, call: _Call, hash_s: float) -> web.StreamResponse:
        """Send ``call`` to a replica, and once more elsewhere if the first fails before any
        byte reached the client (the retry rule, module docstring). ``hash_s``: the prompt's
        hashing time, counted into the first decision's time."""
        verdict = Verdict(self.registry, self.metrics)
        failed: list[ReplicaId] = []
        last: UpstreamError | None = None
        attempt = 0  # failed attempts so far (a busy replica's 429 is not one)
        needed = window.needed_tokens(call.view)  # the context window it takes, tokens
        while True:
            try:
                # A stored response's owner is picked out before the cap: up but full is
                # Overloaded (retry later), not "not available".
                ready = self.registry.ready(call.admitted.key.model, failed)
                ready = pinned(call.admitted.owner, ready)
                candidates = window.fitting(self.registry, self.registry.with_room(ready), needed)
            except (NoReplicaAvailable, Overloaded):
                if last is not None:  # nowhere left to retry: report the upstream failure
                    raise last from None
                raise
            decision = self._route(call, candidates, hash_s)
            hash_s = 0.0
            if call.can_move != (len(candidates) > 1):  # (rarely: a copy only then)
                call = dataclasses.replace(call, can_move=len(candidates) > 1)
            larger = window.larger_window(self.registry, decision.replica, candidates)
            verdict.alone = not call.can_move  # no other replica could judge a failure here
            can_retry = attempt + 1 < MAX_ATTEMPTS and call.can_move
            release = Release(self.router, self.listener, call.rid, not call.admitted.key.stream)
            try:
                result = await self._attempt(call, decision, can_retry, release, larger)
                if result.status in TURNED_AWAY:  # (before the end, which waits a loop turn)
                    self._withdraw(call.rid)
                release.after_answer(result.read_usage)  # a plain answer's (a stream: its own)
            except (ReplicaBusy, window.OverWindow) as moved:  # elsewhere, unblamed (module doc)
                self._withdraw(call.rid)
                failed.append(decision.replica)
                self.metrics.upstream_failures.labels(decision.replica, moved.kind).inc()
                self.metrics.retries.labels(moved.kind).inc()
                if isinstance(moved, window.OverWindow):  # it takes more than that window
                    needed = max(needed, moved.window + 1)
                    window.learned_window(self.registry, decision.replica, moved.window)
                continue
            except UpstreamError as exc:
                kind = kind_of(exc)
                if kind == "connect":  # it never reached the replica
                    self._withdraw(call.rid)
                attempt += 1
                if verdict.failed(decision.replica, kind, can_retry):
                    raise  # the request's own fault: no replica would serve it
                if not can_retry:
                    raise
                failed.append(decision.replica)
                last = exc
                self.metrics.retries.labels(kind).inc()
                log.info("%s: retrying after %s on %s", call.rid, kind, decision.replica)
                continue
            finally:
                release(None)
            self._account(call.rid, call.admitted, decision, result, verdict)
            return result.response

    def _route(self, call: _Call, candidates: list[ReplicaId], hash_s: float) -> Decision:
        """Ask the router where ``call`` goes among ``candidates``; the request's outcome labels
        name that replica from now on."""
        t0 = time.perf_counter()
        explain = call.span is not None  # a traced request carries every candidate's score
        decision = self.router.route(call.view, time.monotonic(), candidates, explain=explain)
        self.metrics.decision_seconds.observe(time.perf_counter() - t0 + hash_s)
        if call.span is not None and self.tracing is not None:
            name_of, policy = self.registry.public_name, self.router.policy.name
            self.tracing.record_decision(call.span, decision, name_of, policy)
        if self.listener is not None:
            try:  # the request is counted in flight now: its end must come (Release)
                self.listener.routed(call.view, decision)
            except Exception:  # the others miss one decision; this request still goes out
                log.exception("%s: the route listener failed", call.rid)
        outcome = call.request[OUTCOME]
        outcome.replica, outcome.reason = decision.replica, decision.reason.value
        return decision

    def _withdraw(self, rid: str) -> None:
        """The replica turned ``rid`` away: its blocks leave the index, here and elsewhere."""
        self.router.withdraw(rid)
        if self.listener is not None:
            self.listener.withdrawn(rid)

    def first_byte_s(self, decision: Decision) -> float:
        """The first-byte deadline of a stream sent to ``decision.replica``, seconds (see the
        module docstring). Called after routing, so the queued work includes this request."""
        predicted = self.router.queued_prefill_s(decision.replica, time.monotonic())
        cfg = self.config
        return min(max(FIRST_BYTE_FACTOR * predicted, cfg.first_byte_floor_s), cfg.first_byte_cap_s)

    async def _attempt(
        self,
        call: _Call,
        decision: Decision,
        can_retry: bool,
        release: Release,
        larger_window: int = 0,
    ) -> RelayResult:
        """One attempt on ``decision.replica``; a replica that refuses the ``stream_options`` we
        added gets it again as sent, and unless that fails alike (a 400: the request's own
        fault, which named our field only in quoting the body) the gateway stops asking (a 400
        is worse than no usage). ``larger_window``: the other candidates' largest window."""
        try:
            result = await self._send(call, decision, can_retry, release, larger_window)
        except UsageRefused:
            plain = without_stream_usage(call.admitted.body)
            admitted = dataclasses.replace(call.admitted, body=plain, usage_asked=False)
            result = await self._send(dataclasses.replace(call, admitted=admitted), decision,
                                      can_retry, release, larger_window)  # fmt: skip
            if result.status != 400:
                self.on_usage_refused(self.registry.public_name(decision.replica))
            return result
        if call.admitted.usage_asked and result.status == 200:
            self.on_usage_taken(self.registry.public_name(decision.replica))
        return result

    async def _send(
        self, call: _Call, decision: Decision, can_retry: bool, release: Release,
        larger_window: int = 0,
    ) -> RelayResult:  # fmt: skip
        request, rid, admitted = call.request, call.rid, call.admitted
        stream, replica = admitted.key.stream, decision.replica
        name = self.registry.public_name(replica)
        extra = {
            REPLICA_HEADER: name,
            REASON_HEADER: decision.reason.value,
            REQUEST_ID_HEADER: admitted.request_id or rid,
            PREDICTED_HEADER: str(decision.predicted_cached_tokens),
        }
        url = replica + upstream_target(request)  # the route's own path: never the raw one
        loop = asyncio.get_running_loop()
        cfg = self.config
        release.learns = admitted.learns  # a stored response's fetch learns nothing (_responses)
        if (scope := admitted.scope) is not None:  # its prompt budget, charged on an estimate
            release.settle = functools.partial(scope.settle_prompt, call.view.prompt_tokens)

        def first_token() -> None:  # timed now; the router's work once the bytes went out
            loop.call_soon(self._first_token, rid, replica, time.monotonic(), admitted.learns)

        sent = time.monotonic()
        try:
            async with asyncio.timeout(None) as timer:
                period = self.first_byte_s(decision) if stream else None  # whole: no deadline
                disarm = arm(timer, self.registry, replica, period, self.metrics)

                def started() -> None:  # the client's response began: no deadline, no retry
                    timer.reschedule(None)
                    disarm()

                try:
                    traced = attempt_headers(self.tracing, call.span, name, admitted.headers)
                    with traced as headers:
                        async with await send(
                            self.session, request.method, url,
                            lambda: payload_of(admitted.body), self.metrics.resends.inc,
                            headers=headers,
                            allow_redirects=False,  # a replica's 3xx is the client's to follow
                        ) as resp:  # fmt: skip
                            await not_for_the_client(
                                resp, admitted.usage_asked, can_retry, call.can_move, name,
                                larger_window,
                            )
                            if is_event_stream(resp):
                                ctl = StreamControl(
                                    name, started, first_token, release.after_answer,
                                    self.is_cutting, cfg.client_buffer_bytes,
                                    cfg.client_write_timeout_s, admitted.usage_asked,
                                    self.responses.recorder(admitted, replica), call.can_move,
                                )  # fmt: skip
                                return await relay_stream(request, resp, extra, ctl)
                            return await relay_plain(request, resp, extra, cfg)
                finally:
                    disarm()
        except (aiohttp.ClientError, TimeoutError) as exc:
            busy = not stream and self.registry.progress_at(replica) > sent  # a long answer
            raise upstream_error(exc, name, cfg.read_timeout_s if busy else None) from exc

    def _first_token(self, rid: str, replica: ReplicaId, now: float, measured: bool) -> None:
        """``rid``'s first token came from ``replica`` at ``now`` (``measured``: a token, not a
        stored answer's replay). Run on the loop's turn after its first bytes were written: the
        client's first token does not wait for what the router learns from it."""
        self.registry.progressed(replica, now)
        self.router.first_token(rid, now, measured)
        if self.listener is not None:
            self.listener.first_token(rid)

    def _account(
        self, rid: str, admitted: Admitted, decision: Decision, result: RelayResult,
        verdict: Verdict,
    ) -> None:  # fmt: skip
        if result.cut is not None:
            self.metrics.cut_streams.labels(result.cut).inc()
        verdict.answered(decision.replica, result)
        # What its usage says, once the answer has gone out (RelayResult.read_usage).
        asyncio.get_running_loop().call_soon(self._usage, rid, admitted, decision, result)

    def _usage(self, rid: str, admitted: Admitted, decision: Decision, result: RelayResult) -> None:
        replica, usage, endpoint = decision.replica, result.read_usage(), admitted.endpoint
        if endpoint is Endpoint.RESPONSES and result.response_id and result.status == 200:
            self.responses.answered(admitted.key.tenant, result.response_id, replica)  # stored
        # Usage is judged missing only of an answer that ended as the replica meant it to.
        whole = not (result.failure or result.cut or result.client_gone or result.error_status)
        if endpoint is not Endpoint.OTHER and result.status == 200 and whole:
            prompt = usage.prompt_tokens if usage is not None else None
            self.metrics.observe_usage(
                replica, decision.predicted_cached_tokens, result.cached_tokens, prompt
            )
        log.debug("%s -> %s (%s) status=%d predicted_cached=%d cached=%s", rid, replica,
                  decision.reason.value, result.status, decision.predicted_cached_tokens,
                  result.cached_tokens)  # fmt: skip
