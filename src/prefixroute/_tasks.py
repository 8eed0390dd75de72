"""Background tasks: the one way their owners stop them, and the one periodic loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
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


def every(
    interval_s: float,
    tick: Callable[[], Awaitable[None]],
    on_error: Callable[[Exception], None],
    name: str,
    errors: tuple[type[Exception], ...] = (Exception,),
) -> asyncio.Task[None]:
    """A background task that awaits ``tick()`` every ``interval_s`` seconds, the first after
    one interval, until cancelled (:func:`cancel_and_wait`).

    ``tick`` raising one of ``errors`` goes to ``on_error``, called inside the ``except`` (so
    ``log.exception`` has the traceback), and the next tick still comes: one bad round must
    not end the loop for good. Any other exception ends the task.
    """

    async def run() -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await tick()
            except errors as exc:
                on_error(exc)

    return asyncio.get_running_loop().create_task(run(), name=name)
