"""Fallback endpoints (protocol v1.0.0): ``ip:port,ip:port,...``, the primary first, in the
header and the ``envoy.lb`` metadata alike; the fallbacks are the policy's next choices."""

from __future__ import annotations

import json
from typing import Any

import pytest

from prefixroute.core import DEFAULT_POLICY
from prefixroute.epp import EppConfig, PickStream
from prefixroute.gateway import GatewayConfig

from .support import (
    ENDPOINTS,
    pick,
    picked,
    request_body,
    request_headers,
    response_body,
    response_headers,
    shared,
)

FOUR = (*ENDPOINTS, "10.0.0.4:8000")


def completion(n: int, tag: str = "w") -> bytes:
    prompt = " ".join(f"{tag}{i}" for i in range(n))
    return json.dumps({"model": "m", "prompt": prompt, "max_tokens": 4}).encode()


def destinations(out: list[Any]) -> list[str]:
    header, meta = picked(out)
    assert header is not None and header == meta  # never two different values
    return header.split(",")


@pytest.mark.parametrize("policy", ["round_robin", "least_loaded", DEFAULT_POLICY])
async def test_the_list_names_distinct_endpoints_primary_first(policy: str) -> None:
    s = shared(policy, FOUR, fallbacks=2)
    stream = PickStream(s)
    names = destinations(await pick(stream, completion(50)))
    assert len(names) == 3 and len(set(names)) == 3 and set(names) <= set(FOUR)
    assert stream.decision is not None and names[0] == stream.decision.replica.split("//")[1]
    assert s.router.loads.get(stream.decision.replica).in_flight == 1  # only the primary's


async def test_fallbacks_do_not_change_the_primary() -> None:
    """The same requests, with and without fallbacks, go to the same primaries (explaining
    the next choices uses up no turn or draw of the policy)."""
    plain, listed = shared("random", FOUR), shared("random", FOUR, fallbacks=3)
    for n in range(8):
        body = completion(20 + n, tag=f"t{n}")
        one = destinations(await pick(PickStream(plain), body))
        many = destinations(await pick(PickStream(listed), body))
        assert len(one) == 1 and len(many) == 4 and many[0] == one[0]


async def test_the_first_fallback_is_the_policys_next_choice() -> None:
    """Least loaded, the first two endpoints busy: primary and fallback are the two idle ones
    (not the next in the pool's order, which is busy)."""
    s = shared("least_loaded", FOUR, fallbacks=1)
    for busy in FOUR[:2]:
        stream = PickStream(s)
        assert await stream.handle(request_headers(subset=[busy])) == []
        await stream.handle(request_body(completion(10, tag=busy)))
    names = destinations(await pick(PickStream(s), completion(10)))
    assert sorted(names) == sorted(FOUR[2:])


async def test_the_list_stays_within_the_subset_and_the_candidates() -> None:
    s = shared("round_robin", FOUR, fallbacks=5)
    stream = PickStream(s)
    assert await stream.handle(request_headers(subset=[FOUR[1], FOUR[3]])) == []
    names = destinations(await stream.handle(request_body(completion(10))))
    assert sorted(names) == sorted([FOUR[1], FOUR[3]])  # fewer than asked: all there are
    s.registry.record_probe(f"http://{FOUR[0]}", False, 100.0)  # type: ignore[arg-type]
    for _ in range(3):
        s.registry.record_failure(f"http://{FOUR[0]}", 100.0, "probe")  # type: ignore[arg-type]
    names = destinations(await pick(PickStream(s), completion(10)))
    assert FOUR[0] not in names and len(names) == 3  # an ejected endpoint is nobody's fallback


async def answer_served_by(stream: PickStream, endpoint: str) -> None:
    """Envoy reports the answer as served by ``endpoint`` (the protocol's metadata entry), and
    the answer ends."""
    served = response_headers()
    meta = served.metadata_context.filter_metadata["envoy.lb"]
    meta.update({"x-gateway-destination-endpoint-served": endpoint})
    await stream.handle(served)
    await stream.handle(response_body(b"{}", end_of_stream=True))


async def test_without_fallbacks_one_endpoint_is_sent() -> None:
    names = destinations(await pick(PickStream(shared("round_robin", FOUR)), completion(10)))
    assert len(names) == 1


@pytest.mark.parametrize("served_by", ["fallback", "primary"])
async def test_an_answer_served_by_a_fallback_counts_against_the_primary(served_by: str) -> None:
    """Served by the fallback: the primary gets the failure, the fallback the answer; served
    by the primary, nothing changes."""
    s = shared("round_robin", FOUR, fallbacks=1)
    stream = PickStream(s)
    primary, fallback = destinations(await pick(stream, completion(10)))
    server = fallback if served_by == "fallback" else primary
    await answer_served_by(stream, server)
    assert s.registry.get(f"http://{primary}").failures == (server != primary)  # type: ignore[arg-type]
    assert s.registry.get(f"http://{fallback}").failures == 0  # type: ignore[arg-type]
    requests = s.metrics.registry.get_sample_value(
        "prefixroute_requests_total",
        {"replica": s.registry.public_name(f"http://{server}"), "status": "200",  # type: ignore[arg-type]
         "reason": "round_robin"},
    )  # fmt: skip
    assert requests == 1


def test_fallbacks_is_a_count() -> None:
    with pytest.raises(Exception, match="fallbacks"):
        EppConfig(GatewayConfig(), fallbacks=-1)
