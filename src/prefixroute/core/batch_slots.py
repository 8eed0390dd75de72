"""A replica's batch slots: how many requests its engine runs at once, and the wait for one.

An engine runs at most so many requests in its batch (vLLM's ``max_num_seqs``, SGLang's
``max_running_requests``). Once every slot is taken, a request waits for running ones to finish
before its prefill can start, however short the prefill queue ahead of it: at 8 slots that wait
is seconds of decode, and a prediction made of queued prefill tokens and batch steps does not
see it (docs/results.md, "Routing at few batch slots").

The slot count is told (a replica's ``max_running`` prior: its operator set it), said by the
engine itself (SGLang's ``/get_server_info``: the gateway reads it, gateway/_server_info.py), or
learned from what the engine reports of itself, each scrape or step: the largest running count
it ever reported, once it has reported that same count with requests still waiting
``FULL_REPORTS`` times. In that order: an operator's word over the engine's, either over an
estimate. A batch at its cap stays there while requests wait, report after report; a large batch
with spare slots shows a few waiting requests too (those that arrived during a step, admitted at
the next), but its running count then grows past any value it had held, and a count it has
exceeded is no cap. vLLM also keeps requests waiting while a long prompt takes a step's token
budget, with few running: the largest count, not the latest, keeps that from reading as a batch
of one. Learning needs a batch that fills and stays full, so it comes after the first requests
that waited for a slot; an engine that says its size is routed around its full batch from the
start.

With ``in_flight`` requests on a replica of ``slots`` slots, a request sent there now starts when
``in_flight - slots + 1`` of them have finished: :meth:`BatchSlots.wait_s` counts that many at the
replica's recent completion rate (a full batch finishes requests at its throughput, whatever
their sizes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Reports at the largest running count with requests waiting that make it a full batch: as
# many as the speed model wants observations before an estimate is its own (SpeedConfig's
# min_observations). One was too few in the simulator: at 256 slots, requests that arrived
# during a step made caps of a few dozen, and the wait they implied held the batch there.
FULL_REPORTS = 8
RATE_WINDOW_S = 10.0  # seconds; time constant of the decaying completion rate


@dataclass(slots=True)
class BatchSlots:
    """One replica's batch size (told or learned) and recent completion rate."""

    told: int | None = None  # slots its operator gave (None: learn them from its reports)
    said: int | None = None  # slots its engine said it has (None: it did not say)
    # Requests the engine runs at once, told or learned (None: not known); kept up to date by
    # tell and report, an attribute because every decision reads it for every candidate.
    size: int | None = None
    _largest: int = 0  # the largest running count it reported, requests
    _full: int = 0  # reports at that count with requests waiting
    _done_acc: float = 0.0  # decayed count of completions, requests
    _done_at: float = 0.0  # time of the last decay, seconds

    def __post_init__(self) -> None:
        self.size = self.told

    def tell(self, slots: int) -> None:
        """Its operator gave the batch size: it holds whatever the engine reports."""
        self.told = self.size = slots

    @property
    def source(self) -> str | None:
        """Where :attr:`size` comes from: ``"told"`` (its operator), ``"engine"`` (it said so),
        ``"learned"`` (its reports of a full batch), or None while it is not known."""
        if self.size is None:
            return None
        return "told" if self.told is not None else "engine" if self.said is not None else "learned"

    def _known(self) -> int | None:
        """Told, else said, else learned (module docstring)."""
        if self.told is not None:
            return self.told
        if self.said is not None:
            return self.said
        return self._largest if self._full >= FULL_REPORTS else None

    def report(
        self, running: int | None, waiting: int | None, max_running: int | None = None
    ) -> None:
        """The engine reported ``running`` requests in its batch and ``waiting`` queued, and
        (``max_running``, where it says it) how many it runs at once."""
        if max_running is not None:
            self.said = max_running
        if running is not None:
            if running > self._largest:
                self._largest, self._full = running, 0  # a count it exceeded was no cap
            if 0 < running == self._largest and waiting:
                self._full += 1
        self.size = self._known()

    def completed(self, now: float) -> None:
        """One of its requests ended at ``now``."""
        self._done_acc = self._done_by(now) + 1.0
        self._done_at = max(now, self._done_at)

    def completion_rate(self, now: float) -> float:
        """Recent completions per second, exponentially decayed."""
        return self._done_by(now) / RATE_WINDOW_S

    def _done_by(self, now: float) -> float:
        """The decayed count of completions as of ``now`` (an end heard late, with a time
        before the last one's, counts as at that one's)."""
        if now <= self._done_at:
            return self._done_acc
        return self._done_acc * math.exp(-(now - self._done_at) / RATE_WINDOW_S)

    def full(self, in_flight: int) -> bool:
        """A request sent now behind ``in_flight`` would wait for a slot (size known)."""
        return self.size is not None and in_flight >= self.size

    def wait_s(self, in_flight: int, now: float) -> float:
        """Seconds a request sent now waits for a slot behind ``in_flight`` requests (0 while
        a slot is free or the batch size is not known). A replica that finished nothing in the
        last window counts one completion per window: slow, not stalled."""
        slots = self.size
        if slots is None or in_flight < slots:
            return 0.0
        rate = max(self.completion_rate(now), 1.0 / RATE_WINDOW_S)
        return (in_flight - slots + 1) / rate
