"""Fixtures shared by more than one test package."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway.redis_server import RedisServer


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A real ``redis-server`` for the instances' sync (skips without one, unless
    ``PREFIXROUTE_REDIS_REQUIRED=1``)."""
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()
