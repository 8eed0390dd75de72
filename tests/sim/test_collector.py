"""The cyclic collector during a run (sim/collector.py): off for the run, the young generations
collected every so many completed requests, and left as it was found, even when the run fails."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from prefixroute.core import make_policy
from prefixroute.sim import collector
from prefixroute.sim.cluster import ClusterSim
from prefixroute.sim.replica import ReplicaConfig
from prefixroute.sim.workloads import make_workload


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """Generations of the collections that ran, as gc reports them."""
    seen: list[int] = []

    def note(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    was = gc.isenabled()
    gc.callbacks.append(note)
    yield seen
    gc.callbacks.remove(note)
    gc.enable() if was else gc.disable()


def sim(requests: int) -> ClusterSim:
    workload = make_workload("no-sharing", 0, {"requests": str(requests)})
    return ClusterSim(workload, make_policy("predicted_ttft"), 4, ReplicaConfig(), 0)


@pytest.mark.parametrize("enabled", [True, False])
def test_a_run_leaves_the_collector_as_it_found_it(enabled: bool, collections: list[int]) -> None:
    gc.enable() if enabled else gc.disable()
    seen_during: list[bool] = []
    run = sim(40)
    run.on_progress = lambda done: seen_during.append(gc.isenabled())
    result = run.run()
    assert len(result.records) == 40
    assert seen_during and not any(seen_during)  # off while the run ran
    assert gc.isenabled() is enabled


def test_the_young_generations_are_collected_every_so_many_requests(
    monkeypatch: pytest.MonkeyPatch, collections: list[int]
) -> None:
    gc.enable()
    monkeypatch.setattr(collector, "YOUNG_EVERY", 10)
    run = sim(40)
    collections.clear()  # building the workload may have collected, automatically
    run.run()
    assert collections.count(1) == 4  # after requests 10, 20, 30 and 40: young only
    assert 2 not in collections  # never a full collection during the run


def test_a_failing_run_gives_the_collector_back(collections: list[int]) -> None:
    gc.enable()
    run = sim(20)

    def fail(done: int) -> None:
        raise RuntimeError("a policy failed")

    run.on_progress = fail
    with pytest.raises(RuntimeError, match="a policy failed"):
        run.run()
    assert gc.isenabled()
