"""A stream's first-byte deadline, which a replica still at work does not miss.

The deadline is there for a replica that stopped: a hung engine still takes connections (and
may still answer its health probe), and a request queued there would wait for the read timeout
(300 s) before going anywhere else. It is ``clamp(4 x predicted TTFT, floor, cap)``
(``Proxy.first_byte_s``). A replica can also be slower than predicted and still working: in a
burst its queue holds minutes of prefill. Abandoning a request there throws away its place in
that queue (and what of it was computed: vLLM and SGLang abort a request whose client left),
and each such timeout counted against the replica, so three of them took it out, and then every
request waiting on it moved at once to queues as long. On replicas written by others (half the
fleet 4x slower, the Mooncake trace at a load the slow pair could not keep up with), round robin
had 47 first-byte timeouts on one slow replica and took it out 5 times in one run
(docs/results.md, "A third replica written by others").

So when the deadline comes and the replica has sent another request's first token or finished
another answer since the attempt was sent (or since the deadline last moved), it was working,
and the deadline moves on by the same period (``prefixroute_first_byte_extensions_total``);
only a replica that showed no such progress for a whole period times out. The read timeout
still bounds any silence, so a request waits no longer than it would with no deadline at all.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from prefixroute.core import ReplicaId

if TYPE_CHECKING:
    from prefixroute.gateway._metrics import GatewayMetrics
    from prefixroute.gateway._registry import ReplicaRegistry


def arm(
    timer: asyncio.Timeout,
    registry: ReplicaRegistry,
    replica: ReplicaId,
    period_s: float | None,
    metrics: GatewayMetrics,
) -> Callable[[], None]:
    """Arm ``timer`` for one attempt on ``replica``: it expires at once if the replica is taken
    out while we wait (by probes, or by other requests' deadlines: nobody waits on a replica
    declared dead) and, for a stream (``period_s``: None for an answer that comes whole, which
    has no deadline), when the replica shows no progress for a period. Returns what disarms
    both (idempotent)."""
    loop = asyncio.get_running_loop()
    unwatch = registry.on_ejected(replica, lambda: timer.reschedule(loop.time()))
    if period_s is None:
        return unwatch
    deadline = FirstByteDeadline(
        timer,
        period_s,
        lambda: registry.progress_at(replica),
        lambda: metrics.first_byte_extensions.labels(replica).inc(),
    )

    def disarm() -> None:
        deadline.cancel()
        unwatch()

    return disarm


class FirstByteDeadline:
    """Expires ``timer`` once ``period_s`` passes with no progress from the replica
    (``progress_at``: the monotonic time of its last first token or answer, any request's)."""

    __slots__ = ("_handle", "_on_extended", "_period_s", "_progress_at", "_since", "_timer")

    def __init__(
        self,
        timer: asyncio.Timeout,
        period_s: float,
        progress_at: Callable[[], float],
        on_extended: Callable[[], None],
    ) -> None:
        self._timer = timer
        self._period_s = period_s
        self._progress_at = progress_at
        self._on_extended = on_extended  # counts a deadline moved on
        self._since = time.monotonic()
        self._handle: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(
            period_s, self._due
        )

    def _due(self) -> None:
        loop = asyncio.get_running_loop()
        if self._progress_at() > self._since:  # working: another period
            self._since = time.monotonic()
            self._handle = loop.call_later(self._period_s, self._due)
            self._on_extended()
            return
        self._handle = None
        self._timer.reschedule(loop.time())  # no progress for a whole period: time out now

    def cancel(self) -> None:
        """The first byte came, or the attempt ended: no deadline any more."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
