"""A replica's progress as the verdict notes it (``Verdict.answered``,
``ReplicaRegistry.progressed``): an answer that went out clean is a sign the replica is at work,
which moves other requests' first-byte deadlines on (``gateway._first_byte``); an answer that
broke mid-stream, carried an error in-band, or was an error status is not (a stopped engine's
HTTP server may still answer)."""

from __future__ import annotations

import pytest
from aiohttp import web

from prefixroute.core import ReplicaId, Router, make_policy
from prefixroute.gateway import GatewayConfig, ReplicaRegistry
from prefixroute.gateway._metrics import GatewayMetrics
from prefixroute.gateway._relay import RelayResult
from prefixroute.gateway._verdict import Verdict

A, B = ReplicaId("http://a:1"), ReplicaId("http://b:2")


def _verdict() -> Verdict:
    router = Router(make_policy("round_robin"))
    registry = ReplicaRegistry(router, GatewayConfig())
    registry.add(A)
    registry.add(B)
    return Verdict(registry, GatewayMetrics(router, registry))


def test_a_clean_answer_is_progress_on_its_own_replica() -> None:
    verdict = _verdict()
    verdict.answered(A, RelayResult(web.Response(), 200, None))
    assert verdict.registry.progress_at(A) > 0.0
    assert verdict.registry.progress_at(B) == 0.0


@pytest.mark.parametrize(
    "result",
    [
        RelayResult(web.Response(), 200, None, failure="disconnect"),  # broke mid-stream
        RelayResult(web.Response(), 200, None, error_status=503),  # an error in-band
        RelayResult(web.Response(), 503, None),
        RelayResult(web.Response(), 400, None),
    ],
)
def test_a_broken_or_error_answer_is_no_progress(result: RelayResult) -> None:
    verdict = _verdict()
    verdict.answered(A, result)
    assert verdict.registry.progress_at(A) == 0.0
