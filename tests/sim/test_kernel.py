"""The simulator kernel: ordering, determinism, errors."""

from __future__ import annotations

import pytest

from prefixroute.sim.kernel import URGENT, Kernel


def test_events_run_in_time_then_priority_then_fifo_order() -> None:
    k = Kernel()
    seen: list[str] = []
    k.at(2.0, lambda: seen.append("late"))
    k.at(1.0, lambda: seen.append("a"))
    k.at(1.0, lambda: seen.append("b"))
    k.at(1.0, lambda: seen.append("urgent"), URGENT)
    k.run()
    assert seen == ["urgent", "a", "b", "late"]
    assert k.now == 2.0
    assert k.processed == 4


def test_run_until_stops_before_later_events() -> None:
    k = Kernel()
    seen: list[float] = []
    for t in (1.0, 2.0, 3.0):
        k.at(t, lambda t=t: seen.append(t))
    k.run(until=2.5)
    assert seen == [1.0, 2.0]
    assert k.now == 2.5
    assert k.peek() == 3.0


def test_events_scheduled_by_events_run() -> None:
    k = Kernel()
    seen: list[float] = []

    def tick() -> None:
        seen.append(k.now)
        if len(seen) < 3:
            k.after(0.5, tick)

    k.at(0.0, tick)
    k.run()
    assert seen == [0.0, 0.5, 1.0]


def test_failed_event_stops_the_run() -> None:
    k = Kernel()
    k.at(1.0, lambda: 1 / 0)  # type: ignore[func-returns-value]
    k.at(2.0, lambda: None)
    with pytest.raises(ZeroDivisionError):
        k.run()
    assert k.now == 1.0


def test_cannot_schedule_in_the_past() -> None:
    k = Kernel()
    k.at(1.0, lambda: None)
    k.run()
    with pytest.raises(ValueError):
        k.at(0.5, lambda: None)
