"""Progress bars for runs in worker processes (sim/progress.py Bars): a bar per run in progress
only, so a hundred runs on a few cores take a few lines."""

from __future__ import annotations

import pytest

from prefixroute.sim.progress import Bars


def shown(bars: Bars) -> list[str]:
    return [task.description for task in bars._bar.tasks]


def test_only_the_runs_in_progress_have_a_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("prefixroute.sim.progress.PROGRESS_AFTER_S", 0.0)
    bars = Bars(["a", "b", "c"], [100, 100, 200], enabled=True)
    try:
        bars.show([50, 0, 0])  # a running; b and c not started
        assert shown(bars) == ["a"]
        bars.show([100, 50, 100])  # a done, b running, c half way (of 200)
        assert shown(bars) == ["b", "c"]
        assert [t.completed for t in bars._bar.tasks] == [50, 100]
    finally:
        bars.close()


def test_no_bar_when_not_enabled_or_before_a_second() -> None:
    quiet = Bars(["a"], [100], enabled=False)
    quiet.show([50])
    assert quiet._bar is None
    early = Bars(["a"], [100], enabled=True)  # the runs have not taken a second yet
    early.show([50])
    assert early._bar is None
