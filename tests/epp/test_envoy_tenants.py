"""Tenants through a real Envoy: the client gets the gateway's refusals, and an isolated
tenant's re-encoded body (its ``cache_salt``, a new ``content-length``) reaches the replica,
whose cache keeps the tenants apart as vLLM's does (emulated replicas honour ``cache_salt``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import aiohttp
import pytest
from gateway.helpers import FAST_GATEWAY, STEADY, send, words

from prefixroute.core import DEFAULT_POLICY
from prefixroute.emulate import EmulatedCluster
from prefixroute.epp import EppConfig
from prefixroute.gateway import TenancyConfig, TenantSpec, hash_api_key

from .conftest import PickerStarter, StackFactory
from .envoy import Envoy

pytestmark = pytest.mark.envoy
KEY = "pr-" + "k" * 40
SECRET = "0123456789abcdef-tenant-salt-secret"


async def test_a_missing_key_is_the_gateways_401_at_the_client(
    make_stack: StackFactory, session: aiohttp.ClientSession
) -> None:
    tenancy = TenancyConfig(tenants=(TenantSpec("acme", (hash_api_key(KEY),)),))
    stack = await make_stack(DEFAULT_POLICY, tenancy=tenancy)
    body = {"model": "emulated", "prompt": "hello", "max_tokens": 2}
    refused = await send(session, stack.url, "/v1/completions", body)
    assert refused.status == 401 and refused.error is not None
    assert refused.error["code"] == "invalid_api_key"
    passed = await send(
        session, stack.url, "/v1/completions", body, headers={"Authorization": f"Bearer {KEY}"}
    )
    assert passed.status == 200 and passed.usage is not None


@pytest.mark.parametrize("body_mode", ["FULL_DUPLEX_STREAMED", "BUFFERED"])
async def test_isolated_tenants_share_nothing_at_the_replica(
    cluster: EmulatedCluster,
    start_picker: PickerStarter,
    envoy_path: str,
    tmp_path: Path,
    session: aiohttp.ClientSession,
    body_mode: str,
) -> None:
    tenancy = TenancyConfig(isolation=True, cache_salt_secret=SECRET)
    routing = dataclasses.replace(
        FAST_GATEWAY, replicas=tuple(cluster.urls[:1]), tenancy=tenancy, **STEADY
    )  # one replica: both tenants land on it, only the salt keeps them apart
    epp = await start_picker(EppConfig(routing, grpc_port=0, http_port=None))
    envoy = Envoy(envoy_path, epp.grpc_port, tmp_path, body_mode)
    envoy.start()
    try:
        body = {"model": "emulated", "prompt": words(300), "max_tokens": 2}

        async def cached(tenant: str) -> int:
            reply = await send(
                session, envoy.url, "/v1/completions", body, headers={"x-tenant-id": tenant}
            )
            assert reply.status == 200 and reply.usage is not None, reply
            return int(reply.usage["prompt_tokens_details"]["cached_tokens"])

        assert await cached("a") == 0
        assert await cached("a") > 0  # the same tenant's prefix is cached
        assert await cached("b") == 0  # another tenant's salt: nothing shared
    finally:
        envoy.stop()
