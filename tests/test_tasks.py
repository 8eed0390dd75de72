"""prefixroute._tasks: the periodic loop keeps going through the errors it is told to expect,
and ends on any other; cancel_and_wait really waits."""

from __future__ import annotations

import asyncio

import pytest

from prefixroute._tasks import cancel_and_wait, every


async def test_every_reports_an_expected_error_and_keeps_ticking() -> None:
    ticks: list[int] = []
    errors: list[Exception] = []

    async def tick() -> None:
        ticks.append(len(ticks))
        if len(ticks) % 2:
            raise KeyError(len(ticks))

    task = every(0.0, tick, errors.append, "t", (KeyError,))
    while len(ticks) < 5 and not task.done():
        await asyncio.sleep(0)
    assert not task.done()  # the errors did not end it
    await cancel_and_wait(task)
    assert task.cancelled()
    assert [e.args[0] for e in errors] == [n for n in range(1, len(ticks) + 1) if n % 2]
    assert task.get_name() == "t"


async def test_every_ends_on_an_error_it_was_not_told_of() -> None:
    async def tick() -> None:
        raise ValueError("a bug")

    task = every(0.0, tick, lambda exc: None, "t", (KeyError,))
    with pytest.raises(ValueError, match="a bug"):
        await task


async def test_every_waits_one_interval_before_the_first_tick() -> None:
    ticks: list[None] = []

    async def tick() -> None:
        ticks.append(None)

    task = every(3600.0, tick, lambda exc: None, "t")
    for _ in range(10):
        await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert ticks == []
