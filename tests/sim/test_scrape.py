"""The simulator's engine-metrics scrape (sim/scrape.py).

From its docstring: every ``scrape_s`` simulated seconds the router gets each replica's interval
of vLLM's prefill totals (requests that finished, their admission-to-first-token seconds, their
prompt tokens less cached ones), as a gateway's health round reads them; an interval in which
no request finished gives nothing; 0 never scrapes.
"""

from __future__ import annotations

import math

import pytest

from prefixroute.cli import main
from prefixroute.core import ConfigError, ReplicaId, make_policy
from prefixroute.sim import ClusterSim, ReplicaConfig, make_workload, parse_fleet
from prefixroute.sim.replica import EngineRequest
from prefixroute.sim.scrape import EngineScrapes

R0, R1 = ReplicaId("r0"), ReplicaId("r1")


class _Router:
    def __init__(self) -> None:
        self.seen: list[tuple[ReplicaId, float, int, float]] = []  # (and preemptions)

    def observe_engine_prefill(
        self, replica: ReplicaId, *, tokens: float, requests: int, seconds: float
    ) -> None:
        self.seen.append((replica, tokens, requests, seconds))

    def observe_preemptions(self, replica: ReplicaId, preemptions: int, now: float) -> int:
        self.seen.append((replica, "preempted", preemptions, now))  # type: ignore[arg-type]
        return 0


def _done(start: float, first: float, prompt: int, cached: int) -> EngineRequest:
    req = EngineRequest("q", list(range(prompt)), 4, arrival_s=start)  # type: ignore[arg-type]
    req.start_s, req.first_token_s, req.cached_tokens = start, first, cached
    return req


def test_each_scrape_gives_the_interval_since_the_last() -> None:
    scrapes, router = EngineScrapes(), _Router()
    scrapes.finished(R0, _done(0.0, 0.25, 1000, 200))
    scrapes.finished(R0, _done(1.0, 1.5, 600, 0))
    scrapes.scrape(router, [(R0, 0), (R1, 0)], 1.0)  # r1 finished nothing: nothing of it
    assert router.seen == [(R0, 1400, 2, pytest.approx(0.75))]
    router.seen = []
    scrapes.scrape(router, [(R0, 0)], 2.0)  # nothing finished since
    assert router.seen == [(R0, "preempted", 0, 2.0)]
    scrapes.finished(R0, _done(2.0, 2.1, 300, 100))
    scrapes.scrape(router, [(R0, 0)], 3.0)
    assert router.seen[1:] == [(R0, 200, 1, pytest.approx(0.1)), (R0, "preempted", 0, 3.0)]


def test_preemptions_are_the_interval_s_after_its_prefill_times() -> None:
    scrapes, router = EngineScrapes(), _Router()
    scrapes.scrape(router, [(R0, 5)], 1.0)  # the engine's count so far: a baseline, no news
    assert router.seen == []
    scrapes.finished(R0, _done(1.0, 1.5, 600, 0))
    scrapes.scrape(router, [(R0, 7)], 2.0)
    assert router.seen == [(R0, 600, 1, pytest.approx(0.5)), (R0, "preempted", 2, 2.0)]


def test_a_request_without_a_first_token_is_not_counted() -> None:
    scrapes, router = EngineScrapes(), _Router()
    req = _done(0.0, 0.2, 100, 0)
    req.first_token_s = None
    scrapes.finished(R0, req)
    scrapes.scrape(router, [(R0, 0)], 2.0)
    assert router.seen == []


def _run(scrape_s: float) -> list[float]:
    """Each replica's learned prefill rate at the end, tokens/s: a fleet half 4x slower, every
    answer plain (no first token is ever seen)."""
    fleet = parse_fleet("2:prefill=20000+2:prefill=5000", ReplicaConfig())
    workload = make_workload("no-sharing", 0, {"requests": "1200"})
    sim = ClusterSim(
        workload, make_policy("predicted_ttft"), fleet=fleet, plain=1.0, scrape_s=scrape_s
    )
    return [r.learned_prefill_tokens_per_s for r in sim.run().replicas]


def test_a_fleet_sent_only_plain_answers_learns_from_scrapes() -> None:
    """Without scrapes every replica stays at the 10,000 prior. With them, the fast pair is
    told from the slow pair and each estimate moves towards its truth. (Not closer than 50%:
    a request's time in an engine's prefill is mostly the batch steps it shares, so these
    observations pin the rate loosely; docs/results.md.)"""
    assert _run(0.0) == [10_000.0] * 4
    fast1, fast2, slow1, slow2 = _run(2.0)
    assert min(fast1, fast2) > 2 * max(slow1, slow2)
    for learned, true in ((fast1, 20_000), (fast2, 20_000), (slow1, 5_000), (slow2, 5_000)):
        assert 0.5 * true <= learned <= 1.5 * true


@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan])
def test_the_interval_is_checked(bad: float) -> None:
    workload = make_workload("no-sharing", 0, {"requests": "10"})
    with pytest.raises(ConfigError, match="scrape"):
        ClusterSim(workload, make_policy("round_robin"), scrape_s=bad)


def test_simulate_scrape_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "-w", "seed-conversation", "--scrape", "-2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--scrape" in err, err
    assert main(["simulate", "-w", "seed-conversation", "--scrape", "1", "--json"]) == 0
