"""Policies simulated at once in worker processes (sim/parallel.py, compare_policies(jobs=)):
the same results as one at a time, in policy order; a run's error and a dead worker reach the
caller; the workers stop when the caller stops waiting."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from prefixroute.core import PrefixrouteError
from prefixroute.sim import (
    PolicyMetrics,
    compare_policies,
    make_workload,
    plan_comparison,
    run_comparisons,
)
from prefixroute.sim.parallel import simulate_each

TIMED = {"decision_us"}  # measured wall time, so it differs between any two runs


def _scores(m: PolicyMetrics) -> dict[str, object]:
    return {k: v for k, v in dataclasses.asdict(m).items() if k not in TIMED}


def test_parallel_runs_give_the_sequential_results_in_policy_order() -> None:
    workload = make_workload("multi-turn", 3, {"sessions": "40"})
    policies = ["predicted_ttft", "round_robin", "cache_aware"]
    seen: list[str] = []
    one = compare_policies(workload, policies, progress=False, jobs=1)
    many = compare_policies(
        workload, policies, progress=False, jobs=3, on_result=lambda m: seen.append(m.policy)
    )
    assert seen == policies
    assert [m.policy for m in many.metrics] == policies
    assert [_scores(m) for m in many.metrics] == [_scores(m) for m in one.metrics]
    assert many.ttfts_ms == one.ttfts_ms
    # The policies really differ here, so a mixed-up order would show.
    assert len({m.prefill_tokens for m in one.metrics}) > 1


@dataclasses.dataclass
class _Run:
    """A stand-in simulation: sleeps, then answers, raises or kills its worker."""

    seconds: float = 0.0
    then: str = "answer"

    def simulate(self, progress: Callable[[int], None] | None) -> str:
        time.sleep(self.seconds)
        if self.then == "raise":
            raise ValueError("this run failed")
        if self.then == "die":
            os._exit(9)  # as the OOM killer would end it: no exception, no cleanup
        return f"slept {self.seconds}"


def _each(runs: list[_Run], jobs: int = 2) -> list[str]:
    return list(
        simulate_each(runs, jobs, [f"run {i}" for i in range(len(runs))], [1] * len(runs), False)
    )


def test_results_come_in_order_even_when_a_later_run_ends_first() -> None:
    assert _each([_Run(0.5), _Run(0.0)]) == ["slept 0.5", "slept 0.0"]


def test_a_runs_error_reaches_the_caller() -> None:
    with pytest.raises(ValueError, match="this run failed"):
        _each([_Run(0.0), _Run(0.0, "raise")])


def test_a_dead_worker_is_an_error_not_a_wait() -> None:
    t0 = time.monotonic()
    with pytest.raises(PrefixrouteError, match="worker process died"):
        _each([_Run(0.0, "die"), _Run(0.0)])
    assert time.monotonic() - t0 < 30


def test_workers_stop_when_the_caller_stops_waiting() -> None:
    results = simulate_each([_Run(0.0), _Run(120.0)], 2, ["a", "b"], [1, 1], False)
    assert next(results) == "slept 0.0"
    t0 = time.monotonic()
    results.close()  # the caller gives up (an interrupt, its own error) with a run still going
    assert time.monotonic() - t0 < 30  # not the 120 s the run would take


def test_cli_jobs_simulates_alike_and_refuses_a_negative_count() -> None:
    exe = [str(Path(sys.executable).with_name("prefixroute")), "simulate", "-w", "multi-turn"]
    args = ["--set", "sessions=30", "-p", "round_robin,predicted_ttft", "--markdown"]
    one = subprocess.run([*exe, *args, "-j", "1"], capture_output=True, text=True, check=True)
    two = subprocess.run([*exe, *args, "-j", "2"], capture_output=True, text=True, check=True)
    assert one.stdout == two.stdout  # the markdown table has no timed column
    assert "predicted_ttft" in one.stdout
    bad = subprocess.run([*exe, *args, "-j", "-1"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "prefixroute: error: --jobs must be 0 (one per CPU) or more, got -1"
    ]


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups, pgrep")
def test_ctrl_c_ends_every_worker_with_one_line() -> None:
    exe = str(Path(sys.executable).with_name("prefixroute"))
    cmd = [exe, "simulate", "-w", "mooncake", "-p", "all", "-j", "2", "--json"]
    # As a terminal starts it: with Ctrl-C's default action. A command started in the
    # background of a shell without job control inherits SIGINT ignored, and Python leaves an
    # ignored SIGINT ignored, so a suite run that way would see the run finish (exit 0).
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=_default_sigint,
    )
    deadline = time.monotonic() + 60
    while len(workers := _children(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(workers) >= 2, "the workers never started"
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal reaches the whole group
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert err.strip().splitlines() == ["prefixroute: interrupted"]
    deadline = time.monotonic() + 10  # the parent ended them; init reaps them
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in workers)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "zombie" not in status


def test_with_other_threads_running_the_workers_are_spawned_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fork copies no thread but every lock: with a thread of the caller's running, the
    workers are spawned, and the results are the same."""
    import multiprocessing
    import threading

    methods: list[str | None] = []
    real = multiprocessing.get_context

    def recorded(method: str | None = None) -> object:
        methods.append(method)
        return real(method)

    monkeypatch.setattr("prefixroute.sim.parallel.multiprocessing.get_context", recorded)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert _each([_Run(0.2), _Run(0.0)]) == ["slept 0.2", "slept 0.0"]
    finally:
        stop.set()
        other.join()
    assert methods == ["spawn"]
    if sys.platform.startswith("linux") and threading.active_count() == 1:  # alone: forked
        assert _each([_Run(0.0)], jobs=1) == ["slept 0.0"]
        assert methods == ["spawn", "fork"]


def test_runs_of_several_workloads_share_one_pool_and_each_comparison_is_its_own() -> None:
    """run_comparisons: every plan's runs in one pool, each plan's Comparison as it would be
    alone (same scores, its own oracle floor), in plan order."""
    plans = [
        plan_comparison(make_workload("multi-turn", 1, {"sessions": "20"}), ["round_robin"]),
        plan_comparison(
            make_workload("no-sharing", 1, {"requests": "150"}), ["round_robin", "cache_aware"]
        ),
    ]
    alone = [next(run_comparisons([plan], progress=False)) for plan in plans]
    pooled = list(run_comparisons(plans, progress=False, jobs=3))
    assert [c.workload.name for c in pooled] == ["multi-turn", "no-sharing"]
    for a, b in zip(alone, pooled, strict=True):
        assert [_scores(m) for m in a.metrics] == [_scores(m) for m in b.metrics]
    assert pooled[0].metrics[0].oracle_floor != pooled[1].metrics[0].oracle_floor


def test_workers_the_system_refuses_are_one_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr("prefixroute.sim.parallel.ProcessPoolExecutor.submit", refuse)
    with pytest.raises(PrefixrouteError, match=r"cannot start worker processes .*try --jobs 1"):
        _each([_Run(0.0), _Run(0.0)])
