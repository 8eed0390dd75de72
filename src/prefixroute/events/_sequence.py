"""Sequence numbers of one engine's event stream: in order, a gap, or a restart.

vLLM numbers its batches 0, 1, 2, ... per publisher; a PUB socket drops messages when a
subscriber is slow or not yet connected, and a restarted engine counts from 0 again. The
tracker only classifies; what to do about a gap or a restart is the subscriber's business.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class SeqOutcome(StrEnum):
    FIRST = "first"  # the first number seen: nothing to compare with
    NEXT = "next"  # exactly one more than the last
    GAP = "gap"  # numbers were skipped: batches were lost
    RESTART = "restart"  # a number not above the last: the publisher started over


@dataclass(slots=True)
class SequenceTracker:
    last: int | None = None  # last sequence number accepted

    def observe(self, seq: int) -> SeqOutcome:
        last, self.last = self.last, seq
        if last is None:
            return SeqOutcome.FIRST
        if seq == last + 1:
            return SeqOutcome.NEXT
        return SeqOutcome.GAP if seq > last else SeqOutcome.RESTART

    def missing(self, seq: int) -> range:
        """Numbers between the last accepted one and ``seq`` (call before :meth:`observe`)."""
        return range(self.last + 1, seq) if self.last is not None else range(0)
