"""Health probes of servers written by others: one without ``/health`` is probed on
``/v1/models`` (every OpenAI-compatible server has it), and ``health_path`` names another path."""

from __future__ import annotations

import aiohttp
import pytest

from prefixroute.core import ConfigError
from prefixroute.gateway import GatewayConfig

from .helpers import FakeFactory, GatewayFactory, send


async def test_a_replica_without_health_is_probed_on_its_models_and_serves(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    # Before: every probe failed with 404, the replica was never in rotation, and every request
    # was refused with a 503.
    fake = await make_fake(health=False)
    gw = await make_gateway([fake.url])
    reply = await send(session, gw.url, "/v1/completions", {"prompt": "hello", "max_tokens": 1})
    assert reply.status == 200, reply
    assert gw.registry.get(fake.url).healthy  # type: ignore[union-attr]


async def test_a_replica_that_answers_neither_is_not_healthy(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    fake = await make_fake(health=False, models_endpoint=False)
    gw = await make_gateway([fake.url])
    assert not gw.registry.get(fake.url).healthy  # type: ignore[union-attr]
    reply = await send(session, gw.url, "/v1/completions", {"prompt": "hello", "max_tokens": 1})
    assert reply.status == 503


async def test_health_path_names_the_probe(
    make_fake: FakeFactory, make_gateway: GatewayFactory
) -> None:
    fake = await make_fake(health=False)
    gw = await make_gateway([fake.url], health_path="/ping")
    assert gw.registry.get(fake.url).healthy  # type: ignore[union-attr]
    assert ("GET", "/ping") in {(s.method, s.path) for s in fake.seen}


@pytest.mark.parametrize("path", ["health", "", "//evil.example/health", "/a b"])
def test_a_health_path_must_be_a_path(path: str) -> None:
    with pytest.raises(ConfigError, match="health_path"):
        GatewayConfig(health_path=path)
