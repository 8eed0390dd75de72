"""Sessions built on demand: a workload that is never all in memory, with the same results."""

from __future__ import annotations

import weakref

import numpy as np
import pytest

from prefixroute.core import make_policy
from prefixroute.sim.cluster import ClusterSim, RequestRecord
from prefixroute.sim.workload import Session, SessionSource, Turn, Workload
from prefixroute.sim.workloads import make_workload

from .test_workloads import needs_traces


class Alive:
    """Counts the token arrays built by a source that are still referenced somewhere."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self.built = 0

    def track(self, tokens: np.ndarray) -> None:
        self.now += 1
        self.built += 1
        self.peak = max(self.peak, self.now)
        weakref.finalize(tokens, self._gone)

    def _gone(self) -> None:
        self.now -= 1


def source(n: int, alive: Alive, gap_s: float = 0.05, chunk: int = 16) -> SessionSource:
    """``n`` one-turn sessions, ``gap_s`` apart, sharing a 256-token head."""
    head = np.arange(256, dtype=np.uint32)

    def build(i: int) -> Session:
        tokens = np.concatenate([head, np.full(64, 10_000 + i, dtype=np.uint32)])
        alive.track(tokens)
        return Session(f"s{i}", i * gap_s, [Turn(tokens=tokens, output_tokens=4)])

    return SessionSource(n, build, n, chunk)


def test_a_source_reads_like_a_list() -> None:
    alive = Alive()
    src = source(10, alive)
    assert len(src) == 10 and alive.built == 0  # nothing built until read
    assert src[3].session_id == "s3" and src[-1].session_id == "s9"
    assert [s.session_id for s in src[2:5]] == ["s2", "s3", "s4"]
    assert [s.start_s for s in src] == pytest.approx([i * 0.05 for i in range(10)])
    with pytest.raises(IndexError):
        src[10]
    for chunk in (1, 3, 10, 64):  # iterated a chunk at a time: the same sessions, in order
        ids = [s.session_id for s in source(10, alive, chunk=chunk)]
        assert ids == [f"s{i}" for i in range(10)]
    w = Workload("w", src)
    assert w.num_requests == 10
    assert [s.session_id for s in w.by_start()] == [f"s{i}" for i in range(10)]


def test_the_simulator_holds_only_the_sessions_in_flight() -> None:
    alive = Alive()
    workload = Workload("streamed", source(2_000, alive))
    result = ClusterSim(workload, make_policy("predicted_ttft"), replicas=4).run()
    assert len(result.records) == 2_000 and all(r.finish_s is not None for r in result.records)
    assert alive.built == 2_000
    # A list would hold all 2,000 prompts for the whole run; read on demand, only those of the
    # requests in flight (a handful at this load) and of the chunk being read are alive at once.
    assert alive.peak < 16 + 50, alive.peak


def test_a_listed_and_a_streamed_workload_simulate_alike() -> None:
    alive = Alive()
    src = source(300, alive, gap_s=0.01)
    listed = Workload("w", list(src))
    streamed = Workload("w", src)
    # Listed out of order: the simulator takes sessions by start time either way.
    listed.sessions = list(reversed(list(listed.sessions)))
    runs = [
        ClusterSim(w, make_policy("predicted_ttft"), replicas=3, seed=1).run()
        for w in (listed, streamed)
    ]

    def digest(records: list[RequestRecord]) -> list[tuple[str, str, float | None, int]]:
        return sorted((r.request_id, r.replica, r.first_token_s, r.cached_tokens) for r in records)

    assert digest(runs[0].records) == digest(runs[1].records)
    assert sum(r.cached_tokens for r in runs[1].records) > 0


@needs_traces
def test_mooncake_is_streamed_in_arrival_order() -> None:
    w = make_workload("mooncake", overrides={"limit": "500", "copies": "2"})
    assert isinstance(w.sessions, SessionSource)
    assert w.num_requests == 1_000 == len(w.sessions)
    starts = [s.start_s for s in w.by_start()]
    assert starts == sorted(starts)
    again = w.sessions[123]  # the same session, built again
    assert np.array_equal(again.turns[0].tokens, w.sessions[123].turns[0].tokens)
    assert not again.turns[0].tokens.flags.writeable
