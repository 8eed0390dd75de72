"""Waiting in tests for something another task or process does: poll a condition until it
holds, and fail the test (not hang it) when it never does; ask whether a server is up yet."""

from __future__ import annotations

import asyncio
import inspect
import urllib.request
from collections.abc import Awaitable, Callable


async def until(
    cond: Callable[[], bool | Awaitable[bool]], timeout_s: float = 10.0, every_s: float = 0.005
) -> None:
    """Return once ``cond()`` (a plain or an async callable) is true; an AssertionError after
    ``timeout_s`` seconds of it being false."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        held = cond()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(every_s)


def answers_200(url: str, timeout_s: float) -> bool:
    """Whether ``GET url`` answers 200 within ``timeout_s``; False when it cannot connect yet."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False
