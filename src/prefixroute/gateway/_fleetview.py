"""What the fleet page (``/dashboard``) and ``prefixroute top`` show: one JSON document.

:func:`fleet_state` reads the numbers where they already live (the router's load view and
learned speeds, the prefix index, the registry's health, the Prometheus counters), so the page
and ``/metrics`` never disagree. Two things are kept here because nothing else keeps them:

* :class:`DecisionLog`, the last ``DECISIONS_KEPT`` routing decisions with their reasons, fed
  by the app's response observer (one ``deque.append`` per request: the only cost a request
  pays for the dashboard);
* :class:`History`, samples of every replica's numbers for the charts. A sample is taken when
  a client reads the state, at most once per ``SAMPLE_EVERY_S``, and ``HISTORY_KEPT`` are
  kept (5 minutes at one a second), so the charts cover the minutes someone was watching and
  a gateway nobody watches does no work for them. ``since`` lets a polling client fetch only
  the samples it has not seen.

The document's shape (``version`` 1)::

    {"version": 1, "time": 1767225600.0, "policy": "predicted_ttft", "mode": "approximate",
     "totals": {"requests", "in_flight", "prompt_tokens", "predicted_cached", "actual_cached",
                "index_entries"},
     "replicas": [{"id", "name", "status", "in_flight", "prefilling", "queued_prefill_tokens",
                   "queued_prefill_s", "speed": {...}, "index_blocks",
                   "index_capacity_blocks", "requests",
                   "prompt_tokens", "predicted_cached", "actual_cached", "kv_usage",
                   "num_waiting", "num_running"}, ...],
     "decisions": [{"time", "replica", "reason", "status", "predicted_cached", "path"}, ...],
     "history": [{"time", "replicas": {id: {"in_flight", "queued_prefill_s", "requests",
                                            "prompt_tokens", "predicted_cached",
                                            "actual_cached"}}}, ...]}

Token counts are tokens, times are seconds (``time``: Unix time, for display only); counters
(``requests``, ``*_tokens``, ``*_cached``) count since the gateway started, so a reader takes
rates from two samples. Decisions come newest first.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import Counter

from prefixroute.core import ReplicaId, Router
from prefixroute.gateway._metrics import GatewayMetrics
from prefixroute.gateway._proxy import PREDICTED_HEADER, RequestOutcome
from prefixroute.gateway._registry import ReplicaRecord
from prefixroute.gateway._state import GatewayState

DECISIONS_KEPT = 50  # recent decisions shown, newest first
HISTORY_KEPT = 300  # chart samples kept: 5 minutes at one a second
SAMPLE_EVERY_S = 1.0  # the closest two chart samples may be, seconds
STATE_VERSION = 1


@dataclass(frozen=True, slots=True)
class DecisionEntry:
    time: float  # when the answer went out, Unix seconds
    replica: str  # the replica's id (its URL)
    reason: str  # the decision's reason (the x-prefixroute-reason value)
    status: int  # the HTTP status the client got
    predicted_cached: int | None  # tokens the router predicted cached (None: not sent)
    path: str  # the endpoint, e.g. /v1/chat/completions


class DecisionLog:
    """The last ``capacity`` decisions (a bounded ring: memory never grows with traffic)."""

    def __init__(self, capacity: int = DECISIONS_KEPT) -> None:
        self._entries: deque[DecisionEntry] = deque(maxlen=capacity)

    def record(self, entry: DecisionEntry) -> None:
        self._entries.append(entry)

    def recent(self) -> list[DecisionEntry]:
        """Newest first."""
        return list(reversed(self._entries))

    def __len__(self) -> int:
        return len(self._entries)


class History:
    """Per-replica samples for the charts, taken on read (see the module docstring)."""

    def __init__(self, capacity: int = HISTORY_KEPT, every_s: float = SAMPLE_EVERY_S) -> None:
        self._samples: deque[dict[str, Any]] = deque(maxlen=capacity)
        self.every_s = every_s

    def offer(self, sample: dict[str, Any]) -> None:
        """Keep ``sample`` unless the last one is less than ``every_s`` older."""
        if self._samples and sample["time"] - self._samples[-1]["time"] < self.every_s:
            return
        self._samples.append(sample)

    def since(self, t: float | None) -> list[dict[str, Any]]:
        """Samples taken after ``t`` (all of them for None), oldest first."""
        if t is None:
            return list(self._samples)
        return [s for s in self._samples if s["time"] > t]


class FleetView:
    """The dashboard's own memory, one per gateway app (shared with its admin listener)."""

    def __init__(self) -> None:
        self.decisions = DecisionLog()
        self.history = History()

    def decided(self, path: str, outcome: RequestOutcome, response: web.StreamResponse) -> None:
        """A request was answered (the app's response observer calls this); one refused
        before any decision (no replica free, say) has none to show."""
        if outcome.replica == "none":
            return
        predicted = response.headers.get(PREDICTED_HEADER)
        self.decisions.record(
            DecisionEntry(
                time.time(), outcome.replica, outcome.reason, response.status,
                int(predicted) if predicted is not None and predicted.isdigit() else None, path,
            )
        )  # fmt: skip


FLEET = web.AppKey("prefixroute.gateway.fleet", FleetView)


def _by_replica(metric: Counter, label: str = "replica") -> dict[str, float]:
    """A labelled counter's totals per ``label`` value (summed over its other labels)."""
    out: dict[str, float] = {}
    for family in metric.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                key = sample.labels[label]
                out[key] = out.get(key, 0.0) + sample.value
    return out


def _total(values: Iterable[float]) -> int:
    return int(sum(values))


@dataclass(frozen=True, slots=True)
class _Counts:
    """The Prometheus counters' totals per replica id, read once per document."""

    requests: dict[str, float]
    prompt: dict[str, float]  # tokens
    predicted: dict[str, float]  # tokens
    actual: dict[str, float]  # tokens

    @classmethod
    def of(cls, metrics: GatewayMetrics) -> _Counts:
        return cls(
            _by_replica(metrics.requests),
            _by_replica(metrics.prompt_tokens),
            _by_replica(metrics.predicted_cached),
            _by_replica(metrics.actual_cached),
        )


def fleet_state(
    state: GatewayState,
    fleet: FleetView,
    since: float | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The document described in the module docstring. ``now``: Unix time (tests pin it)."""
    now = time.time() if now is None else now
    mono = time.monotonic()
    router, cfg = state.router, state.config
    counts = _Counts.of(state.metrics)
    replicas: list[dict[str, Any]] = []
    sample: dict[str, dict[str, float]] = {}
    for record in state.registry:
        numbers = sample[record.id] = _charted(router, record.id, counts, mono)
        replicas.append(_replica_row(router, record, numbers))
    fleet.history.offer({"time": now, "replicas": sample})
    mode = "precise" if cfg.precise else "tokens" if state.tokenizer is not None else "approximate"
    return {
        "version": STATE_VERSION,
        "time": now,
        "policy": cfg.policy,
        "mode": mode,
        "totals": {
            "requests": _total(counts.requests.values()),
            "in_flight": sum(r["in_flight"] for r in replicas),
            "prompt_tokens": _total(counts.prompt.values()),
            "predicted_cached": _total(counts.predicted.values()),
            "actual_cached": _total(counts.actual.values()),
            "index_entries": router.index_entries(),
        },
        "replicas": replicas,
        "decisions": [_decision_row(d) for d in fleet.decisions.recent()],
        "history": fleet.history.since(since),
    }


def _charted(router: Router, rid: ReplicaId, counts: _Counts, mono: float) -> dict[str, float]:
    """The numbers of one replica that the charts sample (its row shows them too)."""
    return {
        "in_flight": router.replica_load(rid).in_flight,
        "queued_prefill_s": round(router.queued_prefill_s(rid, mono), 6),
        "requests": int(counts.requests.get(rid, 0)),
        "prompt_tokens": int(counts.prompt.get(rid, 0)),
        "predicted_cached": int(counts.predicted.get(rid, 0)),
        "actual_cached": int(counts.actual.get(rid, 0)),
    }


def _replica_row(
    router: Router, record: ReplicaRecord, numbers: dict[str, float]
) -> dict[str, Any]:
    load = router.replica_load(record.id)
    return {
        "id": record.url,
        "name": record.name,
        "status": record.status.value,
        **numbers,
        "prefilling": load.prefilling,
        "queued_prefill_tokens": load.queued_prefill_tokens,
        "speed": load.speed_report(),
        "index_blocks": router.indexed_blocks(record.id),
        # None: unbounded (precise mode); else index_capacity_blocks or its engine's KV cache
        "index_capacity_blocks": router.index_size(record.id),
        "kv_usage": load.kv_usage,
        "num_waiting": load.num_waiting,
        "num_running": load.num_running,
    }


def _decision_row(d: DecisionEntry) -> dict[str, Any]:
    return {
        "time": d.time,
        "replica": d.replica,
        "reason": d.reason,
        "status": d.status,
        "predicted_cached": d.predicted_cached,
        "path": d.path,
    }
