"""Fixtures the event tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import zmq.asyncio


@pytest.fixture
async def context() -> AsyncIterator[zmq.asyncio.Context]:
    ctx = zmq.asyncio.Context()
    yield ctx
    ctx.destroy(linger=0)  # closes any socket a failed test left open; term() would wait on it
