"""Instances that hash prompts otherwise share nothing: said, and their decisions skipped.

From sync/_remote.py: each heartbeat says how its instance cuts and hashes prompts (block size,
and its hash of a fixed probe: the seed and the function); an instance that hashes otherwise
has its decisions skipped (``prefixroute_sync_skipped_total{reason="other_hashing"}``) and is
warned of once. Two gateways given different ``--block-chars`` shared nothing, while each
counted the other as heard (an outside audit, 2026-12-07).
"""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry

from prefixroute.core import BlockHasher, ReplicaId, Router, make_policy
from prefixroute.sync._redis import RouteSync
from prefixroute.sync._remote import hashing_keys
from prefixroute.sync._wire import decode, encode_alive

from .test_sync import remote_decision


def _sync(block: int, registry: CollectorRegistry | None = None) -> tuple[RouteSync, ReplicaId]:
    router = Router(make_policy("round_robin"), BlockHasher(block))
    r = ReplicaId("http://r:1")
    router.add_replica(r)
    return RouteSync("redis://127.0.0.1:9/0", "c", router, registry or CollectorRegistry(),
                     instance_id="me"), r  # fmt: skip


def test_the_keys_tell_block_size_seed_and_function_apart() -> None:
    base = hashing_keys(BlockHasher(64))
    assert base == hashing_keys(BlockHasher(64))
    assert base != hashing_keys(BlockHasher(32))
    assert base != hashing_keys(BlockHasher(64, seed=1))
    assert base != hashing_keys(BlockHasher(64, hash_fn=lambda data, parent: 7))


def test_an_instance_that_hashes_otherwise_is_skipped_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    sync, r = _sync(64, registry)
    other = hashing_keys(BlockHasher(32))
    with caplog.at_level(logging.WARNING, logger="prefixroute.sync._remote"):
        sync.remote.apply(encode_alive("thirty-two", 1, 0, other))
        sync.remote.apply(encode_alive("thirty-two", 2, 0, other))
        assert not sync.remote.apply(remote_decision("thirty-two", "q1", r))
    said = [m for m in caplog.messages if "hashes prompts otherwise" in m]
    assert len(said) == 1 and "thirty-two" in said[0]
    skipped = {"reason": "other_hashing"}
    assert registry.get_sample_value("prefixroute_sync_skipped_total", skipped) == 1
    # Alike, or not telling (an instance that predates the keys): applied as ever.
    sync.remote.apply(encode_alive("alike", 1, 0, sync.remote.keys))
    assert sync.remote.apply(remote_decision("alike", "q2", r))
    assert sync.remote.apply(remote_decision("older", "q3", r))


async def test_the_heartbeat_says_how_this_instance_hashes() -> None:
    sync, _ = _sync(48)
    sync._tasks = [object()]  # type: ignore[list-item]  # (queued, not sent: no Redis here)
    sync._say_alive()
    payload, _ = sync._queue.get_nowait()
    message = decode(payload)
    assert getattr(message, "keys", None) == hashing_keys(BlockHasher(48))
