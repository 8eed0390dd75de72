"""The real-time kernel: the simulator's kernel, advanced as the wall clock reaches each event.

Nothing here asserts how fast anything ran. Waiting is checked from below only (an event never
runs before the wall clock reaches its time), and lateness with a clock the test moves by hand.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial

import pytest

from prefixroute.sim.kernel import URGENT, Kernel
from prefixroute.sim.realtime import FellBehind, RealtimeKernel


class HandClock:
    """A wall clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_an_event_waits_for_the_wall_clock_and_keeps_its_own_time() -> None:
    k = RealtimeKernel(factor=0.01)  # 10 ms of wall time per kernel second
    start = time.monotonic()
    seen: list[tuple[float, float]] = []
    for t in (2.0, 1.0):
        k.at(t, lambda: seen.append((k.now, time.monotonic() - start)))
    await asyncio.wait_for(k.run_realtime(until=3.0), 5)
    assert [now for now, _ in seen] == [1.0, 2.0]
    assert seen[0][1] >= 0.01 - 1e-3 and seen[1][1] >= 0.02 - 1e-3  # never early
    assert k.now == 3.0  # like Kernel.run(until=)


async def test_it_orders_events_as_the_simulated_kernel_does() -> None:
    clock = HandClock()
    order: list[list[str]] = []
    for kernel in (Kernel(), RealtimeKernel(clock=clock)):
        seen: list[str] = []
        kernel.at(1.0, partial(seen.append, "a"))
        kernel.at(1.0, partial(seen.append, "b"))
        kernel.at(1.0, partial(seen.append, "urgent"), URGENT)
        kernel.at(0.5, partial(seen.append, "early"))
        if isinstance(kernel, RealtimeKernel):
            clock.now += 2.0  # everything is due
            await kernel.run_realtime(until=1.5)
        else:
            kernel.run(until=1.5)
        order.append(seen)
    assert order[0] == order[1] == ["early", "urgent", "a", "b"]


async def test_late_events_catch_up_with_their_own_times() -> None:
    clock = HandClock()
    k = RealtimeKernel(factor=1.0, clock=clock)
    times: list[float] = []
    for t in (1.0, 2.0, 3.0):
        k.at(t, lambda: times.append(k.now))
    clock.now += 50.0  # the loop stalled far past all three
    await k.run_realtime(until=4.0)
    assert times == [1.0, 2.0, 3.0]


async def test_other_tasks_run_between_events_that_are_all_due() -> None:
    clock = HandClock()
    k = RealtimeKernel(clock=clock)
    seen: list[str] = []
    for t in (1.0, 2.0, 3.0):
        k.at(t, partial(seen.append, f"event {t:g}"))
    clock.now += 10.0

    async def handler() -> None:
        seen.append("handler")

    task = asyncio.create_task(handler())
    await k.run_realtime(until=5.0)
    await task
    assert seen == ["event 1", "handler", "event 2", "event 3"]


async def test_strict_complains_when_it_falls_behind() -> None:
    clock = HandClock()
    k = RealtimeKernel(factor=1.0, strict=True, clock=clock)
    seen: list[float] = []

    def slow() -> None:
        seen.append(k.now)
        clock.now += 2.0  # this event kept the loop busy for two seconds

    k.at(1.0, slow)
    k.at(2.0, lambda: seen.append(k.now))
    clock.now += 1.5  # 0.5 s late for the first event: within one time unit, it runs
    with pytest.raises(FellBehind):
        await k.run_realtime(until=3.0)  # the clock is past 3 by then: no wait either way
    assert seen == [1.0]  # the second was 1.5 s late: over one unit, so it never ran
    assert k.peek() == 2.0


async def test_an_outside_call_wakes_an_idle_kernel_at_the_wall_clocks_time() -> None:
    clock = HandClock()
    k = RealtimeKernel(factor=0.5, clock=clock)
    seen: list[float] = []
    runner = asyncio.create_task(k.run_realtime())
    try:
        await asyncio.sleep(0)  # the runner is now asleep with nothing scheduled
        clock.now += 3.0  # 6 kernel seconds later
        assert k.wall_now() == 6.0
        k.call_now(lambda: seen.append(k.now))
        async with asyncio.timeout(5):
            while not seen:
                await asyncio.sleep(0)
    finally:
        runner.cancel()
    assert seen == [6.0]


async def test_an_earlier_event_wakes_a_kernel_asleep_until_a_later_one() -> None:
    k = RealtimeKernel(factor=1.0)
    seen: list[str] = []
    k.at(3600.0, lambda: seen.append("in an hour"))
    runner = asyncio.create_task(k.run_realtime())
    try:
        await asyncio.sleep(0)
        k.call_now(lambda: seen.append("now"))
        async with asyncio.timeout(5):
            while not seen:
                await asyncio.sleep(0.001)
    finally:
        runner.cancel()
    assert seen == ["now"]


async def test_wall_now_never_goes_before_the_kernels_now() -> None:
    clock = HandClock()
    k = RealtimeKernel(clock=clock)
    k.at(5.0, lambda: None)
    clock.now += 10.0
    await k.run_realtime(until=5.0)
    # Rounding can read the wall clock an ulp before the event just run; a clock set back
    # shows it plainly. call_now must not schedule in the past (Kernel.at would refuse).
    clock.now -= 8.0
    assert k.wall_now() == 5.0
    k.call_now(lambda: None)
    assert k.peek() == 5.0


async def test_a_failed_event_ends_the_run_with_its_error() -> None:
    clock = HandClock()
    k = RealtimeKernel(clock=clock)

    def fail() -> None:
        raise ZeroDivisionError

    k.at(1.0, fail)
    k.at(2.0, lambda: None)
    clock.now += 5.0
    with pytest.raises(ZeroDivisionError):
        await k.run_realtime()
    assert k.now == 1.0


def test_the_factor_must_be_positive() -> None:
    with pytest.raises(ValueError):
        RealtimeKernel(factor=0.0)
