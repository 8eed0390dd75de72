"""One proxied request: ask the router, send it upstream, relay, account; retry once.

The four steps of a handler (parse, ask the core, proxy, account) are split so that this module
holds the last three. Accounting goes through the router's one bookkeeping path:
``route`` counts the request in flight, the first SSE event is ``first_token``, and ``complete``
runs in ``finally``, so a disconnect, a cancellation or an error releases it the same way.

Retry rule: if the upstream fails before any byte reached the client (refused, reset, timed out,
or answered 5xx), the request is routed again among the remaining candidates, once.

Whose fault (as Envoy's outlier detection tells local from upstream failures): a refused
connection is the replica's, at once (the request never reached it). Any other failure is
*suspected* until the retry tells: if the same request fails the same way on the second replica,
or the second replica refuses it as a bad request, the request is at fault and neither replica
is marked; if the retry succeeds, the first replica is marked. A failure with no retry to judge
it marks the replica when it is a timeout, a broken connection or a gateway status (502, 503,
504); any other 5xx only counts in the replica's error rate (``ReplicaRegistry.record_error``),
which takes it out only as an outlier among its peers. One request marks at most one replica.
So client garbage cannot take replicas out: each poison request fails the same way everywhere.

First-byte deadline: a stream's first event must arrive within ``clamp(4 x predicted TTFT,
first_byte_floor_s, first_byte_cap_s)``, where the prediction is the replica's queued prefill
work (ours included) in seconds at the replica's own learned speed; past it the attempt is a
timeout and is retried elsewhere. A plain answer arrives whole, at the end of decoding, so it
has no such deadline; any attempt still waiting on a replica that gets taken out (by failed
probes, or by other requests' deadlines) is abandoned at once and retried, so none waits on a
frozen replica.

Calibration: each answer's ``usage`` goes to the router (``observe_usage``, then ``complete``
with the completion tokens) when the replica's response ends, and a stream's first event is
its measured first token, so the router learns every replica's prefill rate and decode step
from real traffic (``core.speed``).
"""

from __future__ import annotations

import asyncio
import io
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp
from aiohttp import web

from prefixroute.core import (
    Decision,
    NoReplicaAvailable,
    ReplicaId,
    RequestView,
    Router,
)
from prefixroute.gateway._bodylog import log_request_body, log_response_body
from prefixroute.gateway._config import GatewayConfig
from prefixroute.gateway._errors import Overloaded, UpstreamError
from prefixroute.gateway._metrics import GatewayMetrics
from prefixroute.gateway._paths import upstream_target
from prefixroute.gateway._registry import ReplicaRegistry
from prefixroute.gateway._relay import (
    RelayResult,
    StreamControl,
    failure_kind,
    is_event_stream,
    relay_plain,
    relay_stream,
    upstream_error,
)
from prefixroute.gateway._request_id import REQUEST_ID_HEADER, request_id_of
from prefixroute.gateway._requests import Endpoint, RouteKey, encode_body
from prefixroute.gateway._tenants import TENANT_SCOPE, upstream_headers
from prefixroute.gateway._usage import Usage

log = logging.getLogger(__name__)

REPLICA_HEADER = "x-prefixroute-replica"
REASON_HEADER = "x-prefixroute-reason"
PREDICTED_HEADER = "x-prefixroute-predicted-cached-tokens"  # the decision's prediction, tokens
MAX_ATTEMPTS = 2  # the first try and one retry
LARGE_BODY = 1024 * 1024  # bytes; aiohttp's threshold for sending bytes in one write
# First-byte deadline: this many times the predicted TTFT (then clamped to the configured floor
# and cap), leaving room for an estimate that is still learning.
FIRST_BYTE_FACTOR = 4.0
# Failures that mark a replica even when no retry can tell whose fault they were.
_REPLICA_KINDS = frozenset({"connect", "timeout", "disconnect"})
_GATEWAY_STATUSES = frozenset({502, 503, 504})


class _Status5xx(UpstreamError):
    """The replica answered 5xx before anything was relayed (retryable)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class RequestOutcome:
    """Labels of a request's final answer, for the requests counter."""

    replica: str = "none"  # replica of the last attempt
    reason: str = "none"  # decision reason of the last attempt


OUTCOME = web.RequestKey("prefixroute.outcome", RequestOutcome)


class RouteListener(Protocol):
    """Hears what the router hears about each request (``_sync`` shares it with the other
    instances). Called on the request path: each method must return at once and never raise."""

    def routed(self, view: RequestView, decision: Decision) -> None: ...
    def first_token(self, request_id: str) -> None: ...
    def completed(self, request_id: str) -> None: ...


class Proxy:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        router: Router,
        registry: ReplicaRegistry,
        metrics: GatewayMetrics,
        listener: RouteListener | None = None,
        is_cutting: Callable[[], bool] = lambda: False,
    ) -> None:
        self.session = session
        self.listener = listener
        self.router = router
        self.registry = registry
        self.metrics = metrics
        self.config: GatewayConfig = registry.config
        self.is_cutting = is_cutting  # the shutdown drain bound has passed
        self._ids = itertools.count()

    async def forward(
        self,
        request: web.Request,
        body: bytes,
        endpoint: Endpoint,
        key: RouteKey,
        obj: object | None = None,
    ) -> web.StreamResponse:
        """Route and relay one request. ``obj``: the parsed JSON body, when it is JSON; the
        replica then gets it re-encoded (with the tenant's ``cache_salt``), never ``body``."""
        outcome = request[OUTCOME] = RequestOutcome()
        rid = f"{request_id_of(request) or 'gw'}-{next(self._ids)}"  # unique for the router
        scope = request.get(TENANT_SCOPE)
        headers = upstream_headers(request)
        seed = None
        if obj is not None:
            if scope is not None:
                seed = scope.isolate(endpoint, obj)
            body = encode_body(obj)
            headers["Content-Type"] = "application/json"
        log_request_body(request, body)
        started = time.perf_counter()
        view = self._view(rid, key, seed, scope.tenant.name if scope is not None else None)
        hash_s = time.perf_counter() - started
        if scope is not None:
            scope.charge_prompt(view.prompt_tokens)
        verdict = _Verdict()
        failed: list[ReplicaId] = []
        last: UpstreamError | None = None
        for attempt in range(MAX_ATTEMPTS):
            try:
                candidates = self.registry.candidates(key.model, failed)
            except (NoReplicaAvailable, Overloaded):
                if last is not None:  # nowhere left to retry: report the upstream failure
                    raise last from None
                raise
            t0 = time.perf_counter()
            decision = self.router.route(view, time.monotonic(), candidates)
            self.metrics.decision_seconds.observe(time.perf_counter() - t0 + hash_s)
            hash_s = 0.0
            if self.listener is not None:
                self.listener.routed(view, decision)
            outcome.replica, outcome.reason = decision.replica, decision.reason.value
            can_retry = attempt + 1 < MAX_ATTEMPTS and len(candidates) > 1
            release = self._releaser(rid)
            try:
                result = await self._attempt(
                    request, body, headers, decision, key.stream, can_retry, rid, release
                )
                release(result.usage)  # a plain answer's end (a stream released at its end)
            except UpstreamError as exc:
                kind = _kind(exc)
                self.metrics.upstream_failures.labels(decision.replica, kind).inc()
                if verdict.repeats(kind):  # the same failure twice: the request's own
                    self._request_fault(verdict)
                    raise
                if kind == "connect":
                    self._blame(verdict, decision.replica, kind, force=True)
                elif can_retry:
                    verdict.suspect, verdict.kind = decision.replica, kind
                elif kind in _REPLICA_KINDS or _status_of(exc) in _GATEWAY_STATUSES:
                    self._blame(verdict, decision.replica, kind)
                else:
                    self.registry.record_error(decision.replica, time.monotonic())
                if not can_retry:
                    raise
                failed.append(decision.replica)
                last = exc
                self.metrics.retries.labels(kind).inc()
                log.info("%s: retrying after %s on %s", rid, kind, decision.replica)
                continue
            finally:
                release(None)
            self._account(rid, endpoint, decision, result, verdict)
            log_response_body(request, result.response)
            return result.response
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _view(
        self, rid: str, key: RouteKey, seed: int | None = None, tenant: str | None = None
    ) -> RequestView:
        """``seed``: the tenant's own key space under isolation (None: the common one); a LoRA
        adapter's requests are keyed in the adapter's space within it."""
        adapter = self.registry.adapter_of(key.model)
        if key.tokens is not None:
            return self.router.view(
                rid, tokens=key.tokens, output_tokens=key.max_tokens, model=key.model,
                tenant=tenant, seed=seed, adapter=adapter,
            )  # fmt: skip
        return self.router.view(
            rid, text=key.text or "", output_tokens=key.max_tokens, model=key.model,
            tenant=tenant, seed=seed, adapter=adapter,
        )  # fmt: skip

    def _releaser(self, rid: str) -> Callable[[Usage | None], None]:
        """The call that ends ``rid``'s accounting: at the upstream's end, or in ``finally``,
        whichever comes first (the second call does nothing). With the replica's ``usage``,
        the router learns from it: the uncached tokens it really computed, and its output."""
        done = False

        def release(usage: Usage | None = None) -> None:
            nonlocal done
            if done:
                return
            done = True
            router = self.router
            output = None
            if usage is not None:
                if usage.prompt_tokens is not None:
                    router.observe_usage(rid, usage.prompt_tokens, usage.cached_tokens)
                output = usage.completion_tokens
            router.complete(rid, time.monotonic(), output)
            if self.listener is not None:
                self.listener.completed(rid)

        return release

    def first_byte_s(self, decision: Decision) -> float:
        """The first-byte deadline of a stream sent to ``decision.replica``, seconds (see the
        module docstring). Called after routing, so the queued work includes this request."""
        predicted = self.router.loads.get(decision.replica).queued_prefill_s(time.monotonic())
        cfg = self.config
        return min(max(FIRST_BYTE_FACTOR * predicted, cfg.first_byte_floor_s), cfg.first_byte_cap_s)

    async def _attempt(
        self,
        request: web.Request,
        body: bytes,
        headers: Mapping[str, str],
        decision: Decision,
        stream: bool,
        can_retry: bool,
        rid: str,
        release: Callable[[Usage | None], None],
    ) -> RelayResult:
        replica = decision.replica
        name = self.registry.public_name(replica)
        extra = {
            REPLICA_HEADER: name,
            REASON_HEADER: decision.reason.value,
            REQUEST_ID_HEADER: request_id_of(request) or rid,
            PREDICTED_HEADER: str(decision.predicted_cached_tokens),
        }
        url = replica + upstream_target(request)  # the route's own path: never the raw one
        loop = asyncio.get_running_loop()
        cfg = self.config

        def first_token() -> None:
            self.router.first_token(rid, time.monotonic())
            if self.listener is not None:
                self.listener.first_token(rid)

        try:
            deadline = loop.time() + self.first_byte_s(decision) if stream else None
            async with asyncio.timeout_at(deadline) as timer:
                # Taken out while we wait (probes, other requests' deadlines): stop waiting.
                unwatch = self.registry.on_ejected(replica, lambda: timer.reschedule(loop.time()))

                def started() -> None:  # the client's response began: no deadline, no retry
                    timer.reschedule(None)
                    unwatch()

                try:
                    async with self.session.request(
                        request.method, url, data=_payload(body), headers=headers
                    ) as resp:
                        if resp.status >= 500 and can_retry:
                            raise _Status5xx(f"replica {name} answered {resp.status}", resp.status)
                        if is_event_stream(resp):
                            ctl = StreamControl(
                                name, started, first_token, release, self.is_cutting,
                                cfg.client_buffer_bytes, cfg.client_write_timeout_s,
                            )  # fmt: skip
                            return await relay_stream(request, resp, extra, ctl)
                        return await relay_plain(request, resp, extra, cfg.client_buffer_bytes)
                finally:
                    unwatch()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise upstream_error(exc, name) from exc

    def _blame(
        self, verdict: _Verdict, replica: ReplicaId, kind: str, *, force: bool = False
    ) -> None:
        """Count a failure against ``replica``: one per request, except a refused connection
        (``force``), which no request content can cause."""
        if verdict.marked and not force:
            return
        verdict.marked = True
        self.registry.record_failure(replica, time.monotonic(), kind)

    def _request_fault(self, verdict: _Verdict) -> None:
        self.metrics.request_faults.labels(verdict.kind or "error").inc()
        log.info("a request failed the same way (%s) on two replicas: not theirs", verdict.kind)
        verdict.suspect = None

    def _account(
        self,
        rid: str,
        endpoint: Endpoint,
        decision: Decision,
        result: RelayResult,
        verdict: _Verdict,
    ) -> None:
        replica = decision.replica
        now = time.monotonic()
        if result.cut is not None:
            self.metrics.cut_streams.labels(result.cut).inc()
        if result.failure is not None:  # broke mid-stream: only the replica can do that
            self.metrics.upstream_failures.labels(replica, result.failure).inc()
            self._blame(verdict, replica, result.failure)
        elif result.status >= 500:
            self.metrics.upstream_failures.labels(replica, "status").inc()
            if verdict.repeats("status"):
                self._request_fault(verdict)
            elif result.status in _GATEWAY_STATUSES:
                self._blame(verdict, replica, f"status {result.status}")
            else:
                self.registry.record_error(replica, now)
        elif result.status >= 400 and verdict.suspect is not None:
            self._request_fault(verdict)  # the retry says the request is bad
        elif not result.client_gone and result.cut is None:
            self.registry.record_success(replica, now)
        if verdict.suspect is not None:  # the retry did not fail the same way: the first did
            self._blame(verdict, verdict.suspect, verdict.kind or "error")
        if endpoint is not Endpoint.OTHER and result.status == 200 and result.failure is None:
            prompt = result.usage.prompt_tokens if result.usage is not None else None
            self.metrics.observe_usage(
                replica, decision.predicted_cached_tokens, result.cached_tokens, prompt
            )
        log.debug(
            "%s -> %s (%s) status=%d predicted_cached=%d cached=%s",
            rid,
            replica,
            decision.reason.value,
            result.status,
            decision.predicted_cached_tokens,
            result.cached_tokens,
        )


@dataclass(slots=True)
class _Verdict:
    """Whose fault one request's failures were, as its attempts tell."""

    suspect: ReplicaId | None = None  # failed first, not yet judged
    kind: str | None = None  # how it failed
    marked: bool = False  # a replica was already marked for this request

    def repeats(self, kind: str) -> bool:
        return self.suspect is not None and self.kind == kind


def _payload(body: bytes) -> bytes | io.BytesIO | None:
    """The body as aiohttp should send it: bytes are written in one go, which aiohttp warns
    about past 1 MiB (it would hold the loop), so larger ones go as a stream, a fresh one per
    attempt so that a retry sends it again from the start."""
    if len(body) > LARGE_BODY:
        return io.BytesIO(body)
    return body or None


def _status_of(exc: BaseException) -> int | None:
    return exc.status if isinstance(exc, _Status5xx) else None


def _kind(exc: BaseException) -> str:
    if isinstance(exc, _Status5xx):
        return "status"
    cause = exc.__cause__
    return failure_kind(cause) if cause is not None else "error"
