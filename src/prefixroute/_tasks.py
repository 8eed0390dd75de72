"""Background tasks: the one way their owners stop them."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (None: nothing to do) and wait until it has really ended.

    Waiting matters: a task cancelled but not awaited may still be closing sockets or touching
    its owner's state after ``stop()`` returned.
    """
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
