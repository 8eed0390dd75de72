"""prefixroute._tasks: the periodic loop keeps going through the errors it is told to expect,
and ends on any other; cancel_and_wait really waits."""

from __future__ import annotations

import asyncio

import pytest
from stubborn import Stubborn

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


async def test_cancel_and_wait_cancels_again_a_task_that_lost_its_cancellation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client library can swallow a cancellation (turning it into a timeout, say): the
    task is cancelled again until it ends, so a shutdown cannot hang on it."""
    import prefixroute._tasks as tasks

    monkeypatch.setattr(tasks, "STOP_WAIT_S", 0.01)
    stubborn = Stubborn(takes=3)
    task = asyncio.get_running_loop().create_task(stubborn.run())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task), timeout=5)
    assert task.cancelled() and stubborn.swallowed == 3


async def test_cancel_and_wait_raises_what_the_task_ended_with() -> None:
    """As ``await task`` did: a task that had already failed is not a clean stop."""

    async def broken() -> None:
        raise ValueError("a bug")

    task = asyncio.get_running_loop().create_task(broken())
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="a bug"):
        await cancel_and_wait(task)
    await cancel_and_wait(None)  # nothing to stop: no error


async def test_cancel_and_wait_passes_on_its_own_caller_cancellation() -> None:
    """The stopper being cancelled is not the task's cancellation: it must not be swallowed."""

    hearing = False

    async def deaf() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if hearing:
                    raise

    task = asyncio.get_running_loop().create_task(deaf())
    stopper = asyncio.get_running_loop().create_task(cancel_and_wait(task))
    await asyncio.sleep(0.01)
    stopper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    assert not task.done()
    hearing = True  # now let it end, or the loop's teardown would wait on it for ever
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
