"""Asking vLLM to report a request's cached prefix again while a stream is lost
(gateway/_kv_report.py): ``vllm_xargs.kv_cache_report_mode = "full"``, which vLLM 0.32 reads
into the request's ``extra_args`` and answers with a ``BlockStored`` of the whole cached prefix,
from its root (``vllm/v1/core/kv_cache_manager.py``)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from prefixroute.core import Endpoint, ReplicaId
from prefixroute.emulate import EmulatedTokenizer
from prefixroute.events import StreamState
from prefixroute.gateway._kv_report import ask_full_report

from .helpers import FakeFactory, GatewayFactory

FULL = {"kv_cache_report_mode": "full"}


@pytest.mark.parametrize("endpoint", [Endpoint.CHAT, Endpoint.COMPLETIONS, Endpoint.MESSAGES])
def test_the_request_asks_for_a_full_report_where_vllm_reads_vllm_xargs(
    endpoint: Endpoint,
) -> None:
    body: dict[str, Any] = {"prompt": "x"}
    assert ask_full_report(endpoint, body) and body["vllm_xargs"] == FULL
    body = {"prompt": "x", "vllm_xargs": {"session_id": "s"}}  # the client's own: kept
    assert ask_full_report(endpoint, body)
    assert body["vllm_xargs"] == {"session_id": "s", **FULL}


def test_left_alone_elsewhere_and_where_the_client_chose() -> None:
    for endpoint in (Endpoint.RESPONSES, Endpoint.GENERATE, Endpoint.OTHER):
        body: dict[str, Any] = {"input": "x"}
        assert not ask_full_report(endpoint, body) and "vllm_xargs" not in body
    chosen = {"vllm_xargs": {"kv_cache_report_mode": "incremental"}}
    assert not ask_full_report(Endpoint.CHAT, chosen)
    assert chosen["vllm_xargs"] == {"kv_cache_report_mode": "incremental"}
    odd = {"vllm_xargs": "not an object"}  # the replica's to refuse
    assert not ask_full_report(Endpoint.CHAT, odd) and odd["vllm_xargs"] == "not an object"
    assert not ask_full_report(Endpoint.CHAT, ["a list"])


async def test_the_gateway_asks_only_while_a_stream_is_resyncing(
    make_gateway: GatewayFactory, make_fake: FakeFactory, session: aiohttp.ClientSession
) -> None:
    fake = await make_fake()
    gw = await make_gateway(
        [fake.url], kv_events=(f"{fake.url}=connect:tcp://127.0.0.1:9",), kv_block_size=4,
        tokenizer_object=EmulatedTokenizer(),
    )  # fmt: skip
    stream = gw.event_streams[ReplicaId(fake.url)]

    async def sent_xargs() -> object:
        async with session.post(gw.url + "/v1/completions", json={"prompt": "hello there"}) as r:
            assert r.status == 200
        return json.loads(fake.seen[-1].body).get("vllm_xargs")

    assert stream.state is StreamState.WAITING
    assert await sent_xargs() is None
    stream.state = StreamState.RESYNCING  # as after a batch lost without replay
    assert await sent_xargs() == FULL
    stream.state = StreamState.LIVE
    assert await sent_xargs() is None


async def test_the_picker_sends_the_body_with_the_ask_in_its_place() -> None:
    """The picker hands Envoy a body to send only where it changed one: while a stream is
    resyncing, the one that asks for the full report (epp/_admit.py)."""
    from types import SimpleNamespace

    from prefixroute.epp._admit import request_key
    from prefixroute.gateway import GatewayConfig, gateway_state

    state = gateway_state(GatewayConfig(replicas=("http://a:1",)), None)
    body = json.dumps({"prompt": "hello"}).encode()
    _, replaced, _ = await request_key(state, Endpoint.COMPLETIONS, body, None, "application/json")
    assert replaced is None  # not in precise mode: as the client sent it
    state.precise = SimpleNamespace(recovering=lambda: True)  # type: ignore[assignment]
    _, replaced, _ = await request_key(state, Endpoint.COMPLETIONS, body, None, "application/json")
    assert replaced is not None and json.loads(replaced)["vllm_xargs"] == FULL
