"""Precise mode's KV-event streams in /metrics, read from the subscribers at scrape time.

Per replica: batches and events applied, gaps, replays (and the replays that failed), the
batches caught up from before a stream was first heard, entries cleared by cause, undecodable
messages, unknown event types, blocks by fate, the stream's state, and the age of its last
batch. A publisher that died says nothing on a SUB socket: a stream whose last batch ages past
what the engine's traffic explains is the sign (an idle engine publishes nothing either, so
alert on the age together with the replica's own traffic).

A removed replica's counters stay until the process ends, and a replica added again at the
same URL continues them (Prometheus counters must not go back): they sum its streams, the
removed ones' counts kept by ``PreciseMode.retired``. Its gauges (state, age) go with it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from prefixroute.events import IndexerStats, StreamState, StreamStats

if TYPE_CHECKING:
    from prefixroute.gateway._precise import PreciseMode

RESYNC_CAUSES = ("gap", "restart", "reconnect", "cleared", "error")
_EVENT_FIELDS = (("BlockStored", "stored_events"), ("BlockRemoved", "removed_events"),
                 ("AllBlocksCleared", "cleared_events"))  # fmt: skip
Parts = tuple[StreamStats, IndexerStats]  # one stream's counts
# Per replica, a count of its stream's (StreamStats field), each its own counter.
_STREAM_COUNTERS = (
    ("prefixroute_kv_event_batches", "KV-event batches applied.", "batches"),
    ("prefixroute_kv_event_gaps", "Sequence gaps (lost batches).", "gaps"),
    ("prefixroute_kv_event_replayed", "Batches recovered by replay.", "replayed"),
    ("prefixroute_kv_event_replay_failures", "Gaps the replay did not close.", "replay_failures"),
    ("prefixroute_kv_event_caught_up", "Batches replayed at a late join.", "caught_up"),
    ("prefixroute_kv_event_decode_errors", "Undecodable messages.", "decode_errors"),
    ("prefixroute_kv_event_unknown", "Events of unknown types, skipped.", "unknown_events"),
)


class EventCollector(Collector):
    """Precise mode's KV-event streams, read from the subscribers at scrape time."""

    def __init__(self, precise: PreciseMode) -> None:
        self.precise = precise

    def collect(self) -> Iterator[Metric]:
        def counter(name: str, doc: str, *labels: str) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=["replica", *labels])

        plain = [(counter(name, doc), field) for name, doc, field in _STREAM_COUNTERS]
        events = counter("prefixroute_kv_events", "KV events applied, by type.", "type")
        age = GaugeMetricFamily(
            "prefixroute_kv_event_last_batch_age_seconds",
            "Seconds since the stream's last batch (absent before its first).",
            labels=["replica"],
        )
        resyncs = counter("prefixroute_kv_event_resyncs", "Entries cleared, by cause.", "cause")
        blocks = counter("prefixroute_kv_event_blocks", "Blocks in KV events, by fate.", "kind")
        state = GaugeMetricFamily(
            "prefixroute_kv_event_stream_state",
            "1 for the stream's current state (waiting, live, resyncing).",
            labels=["replica", "state"],
        )
        speculative = self.precise.router.speculative_entries()
        now = time.monotonic()
        precise = self.precise
        for replica in {**precise.retired, **precise.subscribers}:
            sub = precise.subscribers.get(replica)
            # Counters sum the replica's streams: removed ones (kept) and its live one.
            parts: list[Parts] = [*precise.retired.get(replica, ())]
            if sub is not None:
                parts.append((sub.stats, sub.indexer.stats))
            for family, field in plain:
                family.add_metric([replica], sum(getattr(st, field) for st, _ in parts))
            for kind, field in _EVENT_FIELDS:
                events.add_metric([replica, kind], sum(getattr(ix, field) for _, ix in parts))
            for cause in RESYNC_CAUSES:
                cleared = sum(st.resyncs.get(cause, 0) for st, _ in parts)
                resyncs.add_metric([replica, cause], cleared)
            for kind in ("stored", "removed", "orphan", "skipped", "wrong_size", "recalled"):
                done = sum(getattr(ix, f"{kind}_blocks") for _, ix in parts)
                blocks.add_metric([replica, kind], done)
            unknown = sum(ix.unknown_removals for _, ix in parts)
            blocks.add_metric([replica, "unknown_removed"], unknown)
            if sub is None:
                continue  # gone: its gauges go with it
            if sub.stats.last_batch_at is not None:
                age.add_metric([replica], now - sub.stats.last_batch_at)
            for s in StreamState:
                state.add_metric([replica, s.value], 1.0 if sub.state is s else 0.0)
        yield from (family for family, _ in plain)
        yield from (events, resyncs, blocks, state, age)
        if speculative is not None:
            yield GaugeMetricFamily(
                "prefixroute_speculative_entries",
                "(replica, block) speculative entries not yet expired.",
                speculative,
            )
