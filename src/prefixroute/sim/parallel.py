"""Several simulations at once, one per process.

A policy comparison's runs are independent: each policy gets its own cluster, seeded alike, and
a run's result does not depend on the process it runs in (the simulator sorts wherever set order
could leak in). So on N cores N policies take about the time of one. The simulator itself stays
one process: its events depend on each other, and splitting one run would change its results.

Workers are forked on Linux when this process runs one thread: a forked worker starts at once
with the modules already imported, and it does not run the caller's main module again, as a
spawned one does (a script that calls :func:`prefixroute.sim.compare_policies` without an
``if __name__ == "__main__"`` guard would start itself over in every worker). No progress bar's
thread is running when they fork (the bars start after). With other threads running (a caller's
own), a fork could copy a lock that one of them holds, so the workers are spawned, as they are
on other systems (macOS's system libraries are not safe to fork, which is why Python spawns
there by default).

Each worker ignores Ctrl-C, so only the parent reacts to it (one message, no traceback per
worker), and the parent stops the workers whenever it stops waiting for them
(an interrupt, a run that failed). A worker that dies (the kernel's OOM killer) fails the
comparison with an error instead of leaving it waiting forever, which is why this uses
``ProcessPoolExecutor`` and not ``multiprocessing.Pool``.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Protocol, TypeVar

from prefixroute.core import PrefixrouteError
from prefixroute.sim.progress import Bars

POLL_S = 0.2  # how often the parent reads the workers' progress while it waits, seconds

_R = TypeVar("_R", covariant=True)


class Simulation(Protocol[_R]):
    """One run: picklable (a worker gets it whole), reporting its completed requests."""

    def simulate(self, progress: Callable[[int], None] | None) -> _R: ...


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# In a worker: every run, and the shared array where each writes how many requests it has
# completed. The runs come once per worker, as its start's arguments (not pickled at all when
# forked), rather than with each task: a workload's prompts are megabytes.
_runs: Sequence[Simulation[Any]] = ()
_done: Any = None


def _start_worker(runs: Sequence[Simulation[Any]], done: Any) -> None:
    global _runs, _done
    _runs, _done = runs, done
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C (module docstring)


def _simulate(index: int) -> Any:
    def progress(completed: int) -> None:
        if completed % 50 == 0:  # as often as the one-process bar looks
            _done[index] = completed

    return _runs[index].simulate(progress)


def simulate_each(
    runs: Sequence[Simulation[_R]],
    jobs: int,
    labels: Sequence[str],
    totals: Sequence[int],
    progress: bool,
) -> Generator[_R, None, None]:
    """Each run's result, in the order of ``runs``, running ``jobs`` of them at a time in
    worker processes. ``labels`` name the runs' progress bars (on stderr, ``totals`` requests
    each, shown for the runs in progress when ``progress`` and they take over a second).
    Raises what a run raised; PrefixrouteError when a worker died. Closing the generator
    early stops the workers."""
    fork = sys.platform.startswith("linux") and threading.active_count() == 1
    ctx = multiprocessing.get_context("fork" if fork else "spawn")
    try:
        done = ctx.Array("q", len(runs), lock=False)  # each worker writes only its own slot
    except OSError as exc:  # no shared memory here
        raise PrefixrouteError(
            f"cannot share progress with worker processes ({exc}); try --jobs 1"
        ) from exc
    pool = ProcessPoolExecutor(
        min(jobs, len(runs)), mp_context=ctx, initializer=_start_worker, initargs=(runs, done)
    )
    bars = Bars(labels, totals, progress)
    futures: list[Future[_R]] = []
    try:
        try:
            futures = [pool.submit(_simulate, i) for i in range(len(runs))]
        except OSError as exc:  # the system refused a process (a limit, memory)
            raise PrefixrouteError(f"cannot start worker processes ({exc}); try --jobs 1") from exc
        for i, future in enumerate(futures):
            result = _wait(future, lambda: bars.show(done))
            done[i] = totals[i]  # its bar ends full, not at its last multiple of 50
            yield result
    except BrokenProcessPool as exc:
        why = f"a simulation's worker process died ({exc}); try --jobs 1"
        raise PrefixrouteError(why) from exc
    finally:
        bars.close()
        # The caller stopped waiting, a run failed, or not every run could start.
        if len(futures) < len(runs) or not all(f.done() for f in futures):
            _stop(pool)
        pool.shutdown(wait=True, cancel_futures=True)


def _wait(future: Future[_R], tick: Callable[[], None]) -> _R:
    while True:
        try:
            return future.result(timeout=POLL_S)
        except TimeoutError:
            tick()


def _stop(pool: ProcessPoolExecutor) -> None:
    """End the workers now: shutdown alone would wait for the runs in progress."""
    terminate = getattr(pool, "terminate_workers", None)  # Python 3.14 and later
    if terminate is not None:
        terminate()
        return
    for process in list(getattr(pool, "_processes", {}).values()):
        process.terminate()
