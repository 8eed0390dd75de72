"""Background tasks: the one way their owners stop them, and the one periodic loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

STOP_WAIT_S = 1.0  # a task still running this long after its cancellation is cancelled again


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (None: nothing to do) and wait until it has really ended; an exception
    it ended with, other than its cancellation, is raised here, as ``await task`` would.

    Waiting matters: a task cancelled but not awaited may still be closing sockets or touching
    its owner's state after ``stop()`` returned. A cancellation can also be lost inside a
    client library (seen once in CI: a shutdown waited on a Redis subscription that went on
    PINGing for ten minutes), so a task still running ``STOP_WAIT_S`` after its cancellation
    is cancelled again, until it ends.
    """
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait((task,), timeout=STOP_WAIT_S)
    if not task.cancelled():
        task.result()


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
