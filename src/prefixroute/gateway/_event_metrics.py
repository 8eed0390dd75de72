"""Precise mode's KV-event streams in /metrics, read from the subscribers at scrape time.

Per replica: batches and events applied, gaps, replays (and the replays that failed), the
batches caught up from before a stream was first heard, entries cleared by cause, undecodable
messages, unknown event types, blocks by fate, the stream's state, and the age of its last
batch. A publisher that died says nothing on a SUB socket: a stream whose last batch ages past
what the engine's traffic explains is the sign (an idle engine publishes nothing either, so
alert on the age together with the replica's own traffic).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from prefixroute.events import StreamState

if TYPE_CHECKING:
    from prefixroute.gateway._precise import PreciseMode

RESYNC_CAUSES = ("gap", "restart", "reconnect", "cleared", "error")


class EventCollector(Collector):
    """Precise mode's KV-event streams, read from the subscribers at scrape time."""

    def __init__(self, precise: PreciseMode) -> None:
        self.precise = precise

    def collect(self) -> Iterator[Metric]:
        def counter(name: str, doc: str, *labels: str) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=["replica", *labels])

        batches = counter("prefixroute_kv_event_batches", "KV-event batches applied.")
        events = counter("prefixroute_kv_events", "KV events applied, by type.", "type")
        gaps = counter("prefixroute_kv_event_gaps", "Sequence gaps (lost batches).")
        replayed = counter("prefixroute_kv_event_replayed", "Batches recovered by replay.")
        failed = counter("prefixroute_kv_event_replay_failures", "Gaps the replay did not close.")
        caught_up = counter("prefixroute_kv_event_caught_up", "Batches replayed at a late join.")
        age = GaugeMetricFamily(
            "prefixroute_kv_event_last_batch_age_seconds",
            "Seconds since the stream's last batch (absent before its first).",
            labels=["replica"],
        )
        resyncs = counter("prefixroute_kv_event_resyncs", "Entries cleared, by cause.", "cause")
        errors = counter("prefixroute_kv_event_decode_errors", "Undecodable messages.")
        unknown = counter("prefixroute_kv_event_unknown", "Events of unknown types, skipped.")
        blocks = counter("prefixroute_kv_event_blocks", "Blocks in KV events, by fate.", "kind")
        state = GaugeMetricFamily(
            "prefixroute_kv_event_stream_state",
            "1 for the stream's current state (waiting, live, resyncing).",
            labels=["replica", "state"],
        )
        speculative = self.precise.router.speculative_entries()
        now = time.monotonic()
        for replica, sub in self.precise.subscribers.items():
            st, ix = sub.stats, sub.indexer.stats
            batches.add_metric([replica], st.batches)
            events.add_metric([replica, "BlockStored"], ix.stored_events)
            events.add_metric([replica, "BlockRemoved"], ix.removed_events)
            events.add_metric([replica, "AllBlocksCleared"], ix.cleared_events)
            gaps.add_metric([replica], st.gaps)
            replayed.add_metric([replica], st.replayed)
            failed.add_metric([replica], st.replay_failures)
            caught_up.add_metric([replica], st.caught_up)
            if st.last_batch_at is not None:
                age.add_metric([replica], now - st.last_batch_at)
            for cause in RESYNC_CAUSES:
                resyncs.add_metric([replica, cause], st.resyncs.get(cause, 0))
            errors.add_metric([replica], st.decode_errors)
            unknown.add_metric([replica], st.unknown_events)
            blocks.add_metric([replica, "stored"], ix.stored_blocks)
            blocks.add_metric([replica, "removed"], ix.removed_blocks)
            blocks.add_metric([replica, "orphan"], ix.orphan_blocks)
            blocks.add_metric([replica, "skipped"], ix.skipped_blocks)
            blocks.add_metric([replica, "recalled"], ix.recalled_blocks)
            for s in StreamState:
                state.add_metric([replica, s.value], 1.0 if sub.state is s else 0.0)
        yield from (batches, events, gaps, replayed, failed, caught_up, resyncs, errors, unknown)
        yield from (blocks, state, age)
        if speculative is not None:
            yield GaugeMetricFamily(
                "prefixroute_speculative_entries",
                "(replica, block) speculative entries not yet expired.",
                speculative,
            )
