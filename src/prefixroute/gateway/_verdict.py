"""Whose fault one request's failures were, as its attempts tell (the proxy's fault rules).

The rules, as in ``_proxy``'s module docstring (Envoy's outlier detection tells local from
upstream failures the same way): a refused connection is the replica's, at once (the request
never reached it). Any other failure before the first byte is *suspected* until the retry tells:
if the same request fails the same way on the second replica, or the second replica refuses it as
a bad request (4xx), the request is at fault and neither replica is marked; if the retry does not
fail the same way, the first replica is marked (a retry that was only told "busy", or whose
client left, shows nothing and marks no one). A failure on the last attempt marks the replica
when it is a timeout, a broken connection or a gateway status (502, 503, 504); any other 5xx
only counts in the replica's error rate (``ReplicaRegistry.record_error``). A request that could
go *nowhere else* (``alone``: a stored response's owner, the only replica serving its model or
with room) is judged by nothing but a refused connection: request content can cause every other
failure, and a few pinned requests that took a replica 10 s to prefill (or that it answered
with a 5xx) took it out, and with it every request it served (an outside audit, 2026-12-07);
the requests that can move, and the health checks, still judge it. A stream that
breaks after it started is its replica's (only a replica can do that). A stream that reports an
error in-band (``_sse``) is judged by the code it reports: a 5xx counts in the error rate, as a
5xx answer does (SGLang reports some bad requests so too, so one request cannot take a replica
out), a 4xx is the request's; neither is a success. One request marks at most
one replica, except that a refused connection is always marked.

A plain answer whose replica sent nothing for ``read_timeout_s`` while it sent others' first
tokens or answers (``answer_timeout``: busy, not stopped) is not retried and marks no replica:
such an answer arrives whole when decoding ends, so a healthy replica writing a long one looks
exactly so, and another replica would take as long. It counts in the replica's error rate only,
so long answers asked of every replica take none out, while one replica that stops answering
them (and nothing else) stands out from its peers. A plain answer's replica that sent nothing to
anyone meanwhile timed out as any other (``timeout``: retried, suspected).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from prefixroute.core import ReplicaId
from prefixroute.gateway._metrics import GatewayMetrics
from prefixroute.gateway._registry import ReplicaRegistry
from prefixroute.gateway._relay import RelayResult
from prefixroute.gateway._upstream_answers import ANSWER_TIMEOUT

log = logging.getLogger(__name__)

# Failures that mark a replica even when no retry can tell whose fault they were.
REPLICA_KINDS = frozenset({"connect", "timeout", "disconnect"})
GATEWAY_STATUSES = frozenset({502, 503, 504})


def judge_error_event(
    metrics: GatewayMetrics, registry: ReplicaRegistry, replica: ReplicaId, status: int, now: float
) -> None:
    """A stream's in-band error of ``status`` (module docstring): a 5xx counts in the replica's
    error rate and its failures metric, a 4xx (the request's) against nothing. The gateway's
    verdict and the endpoint picker's judge both."""
    if status >= 500:
        metrics.upstream_failures.labels(replica, "error_event").inc()
        registry.record_error(replica, now)


@dataclass(slots=True)
class Verdict:
    """One request's judge: hears each attempt's failure or answer, marks at most one replica."""

    registry: ReplicaRegistry
    metrics: GatewayMetrics
    suspect: ReplicaId | None = None  # failed first, not yet judged
    kind: str | None = None  # how it failed
    marked: bool = False  # a replica was already marked for this request
    alone: bool = False  # the attempt under way could go to no other replica (docstring)

    def repeats(self, kind: str) -> bool:
        """The suspect failed the same way: the request fails alike everywhere."""
        return self.suspect is not None and self.kind == kind

    def failed(self, replica: ReplicaId, kind: str, can_retry: bool) -> bool:
        """An attempt on ``replica`` failed before any byte reached the client (``kind``:
        ``connect``, ``timeout``, ``answer_timeout``, ``disconnect``, ``status`` or ``error``).
        True when it is the request's own fault, or no retry can help: no further attempt. (A
        5xx fails an attempt only when a retry is to come; with none, it is relayed and judged
        by ``answered``.)"""
        self.metrics.upstream_failures.labels(replica, kind).inc()
        if kind == ANSWER_TIMEOUT:  # a long plain answer, most likely (module docstring)
            self.registry.record_error(replica, time.monotonic())
            return True
        if self.repeats(kind):  # the same failure twice: the request's own
            self._request_fault()
            return True
        if kind == "connect":
            self._blame(replica, kind, force=True)
        elif can_retry:
            self.suspect, self.kind = replica, kind
        elif self.alone:
            pass  # nobody to judge it by (module docstring)
        elif kind in REPLICA_KINDS:
            self._blame(replica, kind)
        else:
            self.registry.record_error(replica, time.monotonic())
        return False

    def answered(self, replica: ReplicaId, result: RelayResult) -> None:
        """``replica`` answered (the answer went to the client): judge it, and the suspect."""
        now = time.monotonic()
        if result.status < 300 and result.failure is None and result.error_status is None:
            self.registry.progressed(replica, now)  # it is at work (gateway._first_byte)
        if result.failure is not None:  # broke mid-stream: only the replica can do that
            self.metrics.upstream_failures.labels(replica, result.failure).inc()
            self._blame(replica, result.failure)
        elif result.busy:  # full, not broken (_upstream_answers): relayed, nowhere else to go
            self.metrics.upstream_failures.labels(replica, "busy").inc()
            return  # nor does it tell about the suspect
        elif result.error_status is not None:
            if self.alone:
                self.metrics.upstream_failures.labels(replica, "error_event").inc()
            else:
                judge_error_event(self.metrics, self.registry, replica, result.error_status, now)
            if result.error_status < 500 and self.suspect is not None:
                self._request_fault()  # as a relayed 4xx: the retry says the request is bad
        elif result.status >= 500:
            self.metrics.upstream_failures.labels(replica, "status").inc()
            if self.repeats("status"):
                self._request_fault()
            elif self.alone:
                pass  # nobody to judge it by (module docstring)
            elif result.status in GATEWAY_STATUSES:
                self._blame(replica, f"status {result.status}")
            else:
                self.registry.record_error(replica, now)
        elif result.status >= 400 and self.suspect is not None:
            self._request_fault()  # the retry says the request is bad
        elif not result.client_gone and result.cut is None:
            self.registry.record_success(replica, now)
        elif self.suspect is not None:  # its client left: the retry showed nothing either way
            return
        if self.suspect is not None:  # the retry did not fail the same way: the first did
            self._blame(self.suspect, self.kind or "error")

    def _blame(self, replica: ReplicaId, kind: str, *, force: bool = False) -> None:
        """Count a failure against ``replica``: one per request, except a refused connection
        (``force``), which no request content can cause."""
        if self.marked and not force:
            return
        self.marked = True
        self.registry.record_failure(replica, time.monotonic(), kind)

    def _request_fault(self) -> None:
        self.metrics.request_faults.labels(self.kind or "error").inc()
        log.info("a request failed the same way (%s) on two replicas: not theirs", self.kind)
        self.suspect = None
