"""Tests for prefixroute.events._sequence: in order, gap or restart."""

from __future__ import annotations

from prefixroute.events import SeqOutcome, SequenceTracker


def test_classifies_each_number_against_the_last() -> None:
    t = SequenceTracker()
    assert t.missing(5) == range(0)
    assert [t.observe(s) for s in (5, 6, 7)] == [
        SeqOutcome.FIRST,
        SeqOutcome.NEXT,
        SeqOutcome.NEXT,
    ]
    assert t.missing(10) == range(8, 10)
    assert t.observe(10) is SeqOutcome.GAP
    assert t.observe(0) is SeqOutcome.RESTART  # a new publisher counts from 0
    assert t.observe(1) is SeqOutcome.NEXT
    assert t.observe(1) is SeqOutcome.RESTART  # not above the last: never trusted as "next"
