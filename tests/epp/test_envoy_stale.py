"""Pooled connections the replica closed, through a real Envoy on the bootstrap we ship.

An engine's server closes a keep-alive connection idle past its timeout (vLLM and SGLang: 5 s),
and a request Envoy writes on it just then is never read. ``ClosingReplica`` makes that race
certain: it closes a connection, unanswered, when a second POST arrives on it. On a bootstrap
without a retry for it, Envoy answered 3 of 6 requests 503 ("disconnect/reset before headers.
reset reason: connection termination") with the picker in BUFFERED mode and on its own round
robin (2026-12-01). In full-duplex mode the request's body was still coming from the picker when
the connection closed, and Envoy resent it by itself. The bootstrap now sends a request reset
before its answer once more (``STALE_RETRY``), so every request is answered in every mode.
"""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path

import aiohttp
import pytest
from gateway.fakes import ClosingReplica
from gateway.helpers import FAST_GATEWAY, STEADY

from prefixroute.epp import EnvoyConfig, EppConfig

from .conftest import PickerStarter
from .envoy import Envoy

pytestmark = pytest.mark.envoy
BODY = {"model": "emulated", "prompt": "a b c", "max_tokens": 1}
REQUESTS = 6


async def _statuses(url: str) -> collections.Counter[int]:
    out: collections.Counter[int] = collections.Counter()
    async with aiohttp.ClientSession() as session:
        for _ in range(REQUESTS):  # one after another: each finds the last one's connection
            async with session.post(url + "/v1/completions", json=BODY) as resp:
                await resp.read()
                out[resp.status] += 1
    return out


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
@pytest.mark.parametrize("mode", ["FULL_DUPLEX_STREAMED", "BUFFERED"])
async def test_through_the_picker_every_request_is_answered(
    envoy_path: str, start_picker: PickerStarter, tmp_path: Path, reset: bool, mode: str
) -> None:
    replica = ClosingReplica(reset=reset)
    await replica.start()
    envoy = None
    try:
        routing = dataclasses.replace(FAST_GATEWAY, replicas=(replica.url,), **STEADY)
        epp = await start_picker(EppConfig(routing, grpc_port=0, http_port=0,
                                           full_duplex=mode != "BUFFERED"))  # fmt: skip
        envoy = Envoy(envoy_path, epp.grpc_port, tmp_path, mode)
        envoy.start()
        statuses = await _statuses(envoy.url)
    finally:
        if envoy is not None:
            envoy.stop()
        await replica.stop()
    assert statuses == {200: REQUESTS}
    assert replica.posts > REQUESTS  # the race did happen: some requests were sent twice


async def test_envoy_s_own_round_robin_answers_every_request(
    envoy_path: str, tmp_path: Path
) -> None:
    """The benchmarks' baseline (no picker) gets the same pool settings."""
    replica = ClosingReplica()
    await replica.start()
    envoy = Envoy(envoy_path, 1, tmp_path, "FULL_DUPLEX_STREAMED")
    endpoint = replica.url.removeprefix("http://")
    envoy.settings = EnvoyConfig(pickers=(), endpoints=[endpoint], listen=f"127.0.0.1:{envoy.port}",
                                 admin_port=envoy.admin_port)  # fmt: skip
    try:
        envoy.start()
        statuses = await _statuses(envoy.url)
    finally:
        envoy.stop()
        await replica.stop()
    assert statuses == {200: REQUESTS}
    assert replica.posts > REQUESTS
