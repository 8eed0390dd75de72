"""A task body that loses cancellations, as a client library that turns one into a timeout
does: what ``_tasks.cancel_and_wait`` must outlast (tests/test_tasks.py, and the Redis sync's
stop in tests/gateway/test_sync_faults.py)."""

from __future__ import annotations

import asyncio


class Stubborn:
    """``await stubborn.run()`` sleeps until its ``takes``-th cancellation; ``swallowed``
    counts the cancellations it has seen."""

    def __init__(self, takes: int) -> None:
        self.takes = takes
        self.swallowed = 0

    async def run(self, *_: object) -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.swallowed += 1
                if self.swallowed >= self.takes:
                    raise
