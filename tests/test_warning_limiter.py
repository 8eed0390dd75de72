"""``WarningLimiter`` (prefixroute/_tracebacks.py): a warning at most once per kind per
``every_s``, the ones held back counted into the next one logged."""

from __future__ import annotations

import logging

import pytest

from prefixroute._tracebacks import WarningLimiter


def test_one_warning_per_kind_per_period_and_the_count_rides_on_the_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    said = WarningLimiter(logging.getLogger("limited"), every_s=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, "limited"):
        for _ in range(3):
            said.warning("gap", "stream %s: gap", "r1")
        said.warning("decode", "stream %s: bad message", "r1")  # another kind: its own period
        now[0] += 59.9
        said.warning("gap", "stream %s: gap", "r1")
        now[0] += 0.2
        said.warning("gap", "stream %s: gap", "r1")
    assert [r.getMessage() for r in caplog.records] == [
        "stream r1: gap",
        "stream r1: bad message",
        "stream r1: gap (3 more like it since the last one, not shown)",
    ]
