"""One proxied request: ask the router, send it upstream, relay, account; retry once.

The four steps of a handler (parse, ask the core, proxy, account) are split so that this module
holds the last three. Accounting goes through the router's one bookkeeping path:
``route`` counts the request in flight, the first SSE event is ``first_token``, and ``complete``
runs in ``finally``, so a disconnect, a cancellation or an error releases it the same way.

Retry rule: if the upstream fails before any byte reached the client (refused, reset, timed out,
or answered 5xx), the request is routed again among the remaining candidates, once. A replica
that fails is reported to the registry, which takes it out after repeated failures.
"""

from __future__ import annotations

import io
import itertools
import logging
import time
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
from prefixroute.gateway._errors import GatewayError, Overloaded, UpstreamError
from prefixroute.gateway._metrics import GatewayMetrics
from prefixroute.gateway._registry import ReplicaRegistry
from prefixroute.gateway._relay import (
    RelayResult,
    failure_kind,
    is_event_stream,
    relay_plain,
    relay_stream,
    upstream_error,
)
from prefixroute.gateway._request_id import REQUEST_ID_HEADER, request_id_of
from prefixroute.gateway._requests import Endpoint, RouteKey
from prefixroute.gateway._tenants import TENANT_SCOPE, upstream_headers

log = logging.getLogger(__name__)

REPLICA_HEADER = "x-prefixroute-replica"
REASON_HEADER = "x-prefixroute-reason"
PREDICTED_HEADER = "x-prefixroute-predicted-cached-tokens"  # the decision's prediction, tokens
MAX_ATTEMPTS = 2  # the first try and one retry
LARGE_BODY = 1024 * 1024  # bytes; aiohttp's threshold for sending bytes in one write


class _Status5xx(UpstreamError):
    """The replica answered 5xx before anything was relayed (retryable)."""


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
    ) -> None:
        self.session = session
        self.listener = listener
        self.router = router
        self.registry = registry
        self.metrics = metrics
        self._ids = itertools.count()

    async def forward(
        self, request: web.Request, body: bytes, endpoint: Endpoint, key: RouteKey
    ) -> web.StreamResponse:
        outcome = request[OUTCOME] = RequestOutcome()
        rid = f"{request_id_of(request) or 'gw'}-{next(self._ids)}"  # unique for the router
        scope = request.get(TENANT_SCOPE)
        seed, body = scope.isolate(endpoint, body) if scope is not None else (None, body)
        log_request_body(request, body)
        started = time.perf_counter()
        view = self._view(rid, key, seed, scope.tenant.name if scope is not None else None)
        hash_s = time.perf_counter() - started
        if scope is not None:
            scope.charge_prompt(view.prompt_tokens)
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
            try:
                result = await self._attempt(request, body, decision, rid, can_retry)
            except UpstreamError as exc:
                self._upstream_failed(decision.replica, exc)
                if not can_retry:
                    raise
                failed.append(decision.replica)
                last = exc
                self.metrics.retries.labels(_kind(exc)).inc()
                log.info("%s: retrying after %s on %s", rid, _kind(exc), decision.replica)
                continue
            finally:
                self.router.complete(rid, time.monotonic())
                if self.listener is not None:
                    self.listener.completed(rid)
            self._account(rid, endpoint, decision, result)
            log_response_body(request, result.response)
            return result.response
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _view(
        self, rid: str, key: RouteKey, seed: int | None = None, tenant: str | None = None
    ) -> RequestView:
        """``seed``: the tenant's own key space under isolation (None: the common one)."""
        if key.tokens is not None:
            return self.router.view(
                rid, tokens=key.tokens, output_tokens=key.max_tokens, model=key.model,
                tenant=tenant, seed=seed,
            )  # fmt: skip
        return self.router.view(
            rid, text=key.text or "", output_tokens=key.max_tokens, model=key.model,
            tenant=tenant, seed=seed,
        )  # fmt: skip

    async def _attempt(
        self, request: web.Request, body: bytes, decision: Decision, rid: str, can_retry: bool
    ) -> RelayResult:
        replica = decision.replica
        extra = {
            REPLICA_HEADER: replica,
            REASON_HEADER: decision.reason.value,
            REQUEST_ID_HEADER: request_id_of(request) or rid,
            PREDICTED_HEADER: str(decision.predicted_cached_tokens),
        }
        url = replica + request.rel_url.raw_path_qs

        def first_token() -> None:
            self.router.first_token(rid, time.monotonic())
            if self.listener is not None:
                self.listener.first_token(rid)

        try:
            async with self.session.request(
                request.method, url, data=_payload(body), headers=upstream_headers(request)
            ) as resp:
                if resp.status >= 500 and can_retry:
                    raise _Status5xx(f"replica {replica} answered {resp.status}")
                if is_event_stream(resp):
                    return await relay_stream(request, resp, extra, replica, first_token)
                return await relay_plain(resp, extra)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise upstream_error(exc, replica) from exc

    def _upstream_failed(self, replica: ReplicaId, exc: GatewayError) -> None:
        self.metrics.upstream_failures.labels(replica, _kind(exc)).inc()
        self.registry.record_failure(replica, time.monotonic(), _kind(exc))

    def _account(
        self, rid: str, endpoint: Endpoint, decision: Decision, result: RelayResult
    ) -> None:
        replica = decision.replica
        if result.failure is not None:
            self.metrics.upstream_failures.labels(replica, result.failure).inc()
            self.registry.record_failure(replica, time.monotonic(), result.failure)
        elif result.status >= 500:
            self.metrics.upstream_failures.labels(replica, "status").inc()
            self.registry.record_failure(replica, time.monotonic(), f"status {result.status}")
        elif not result.client_gone:
            self.registry.record_success(replica)
        if endpoint is not Endpoint.OTHER and result.status == 200 and result.failure is None:
            self.metrics.observe_usage(
                replica, decision.predicted_cached_tokens, result.cached_tokens
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


def _payload(body: bytes) -> bytes | io.BytesIO | None:
    """The body as aiohttp should send it: bytes are written in one go, which aiohttp warns
    about past 1 MiB (it would hold the loop), so larger ones go as a stream, a fresh one per
    attempt so that a retry sends it again from the start."""
    if len(body) > LARGE_BODY:
        return io.BytesIO(body)
    return body or None


def _kind(exc: BaseException) -> str:
    if isinstance(exc, _Status5xx):
        return "status"
    cause = exc.__cause__
    return failure_kind(cause) if cause is not None else "error"
