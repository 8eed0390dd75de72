"""Progress bars on stderr for simulations long enough to want one: a run (one process) or
several runs at once (worker processes, :mod:`prefixroute.sim.parallel`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

PROGRESS_AFTER_S = 1.0  # a bar appears only on runs longer than this, seconds


def _progress() -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(file=sys.stderr),
        transient=True,
    )


class LazyProgress:
    """A rich progress bar on stderr that appears only once a run has taken a second."""

    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.total, self.label, self.enabled = total, label, enabled
        self._t0 = time.perf_counter()
        self._bar: Any = None
        self._task: Any = None

    def update(self, done: int) -> None:
        if not self.enabled or done % 50:
            return
        if self._bar is None:
            if time.perf_counter() - self._t0 < PROGRESS_AFTER_S:
                return
            self._bar = _progress()
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total)
        self._bar.update(self._task, completed=done)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


class Bars:
    """Bars for runs in worker processes that report their completed requests (``show``'s
    ``done``): one per run in progress, appearing once the runs have taken a second and gone
    when the run is done, so that a hundred runs on a few cores take a few lines."""

    def __init__(self, labels: Sequence[str], totals: Sequence[int], enabled: bool) -> None:
        self.labels, self.totals, self.enabled = labels, totals, enabled
        self._t0 = time.perf_counter()
        self._bar: Any = None
        self._tasks: dict[int, Any] = {}  # run -> its bar's task, while it shows

    def show(self, done: Sequence[int]) -> None:
        if not self.enabled or time.perf_counter() - self._t0 < PROGRESS_AFTER_S:
            return
        if self._bar is None:
            self._bar = _progress()
            self._bar.start()
        for run, (completed, total) in enumerate(zip(done, self.totals, strict=True)):
            task = self._tasks.get(run)
            if completed >= total and task is not None:
                self._bar.remove_task(self._tasks.pop(run))
            elif 0 < completed < total:
                if task is None:
                    task = self._tasks[run] = self._bar.add_task(self.labels[run], total=total)
                self._bar.update(task, completed=completed)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
