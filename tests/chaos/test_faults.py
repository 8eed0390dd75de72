"""Kill, freeze and shutdown against real processes, at CI size (each about 10-25 s).

The targets are the benchmark's (``benchmarks/chaos_bench.py`` runs the same scenarios full size);
a failure prints the scenario's row of the table and the gateway's log.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from . import faults
from .harness import Result, table

pytestmark = pytest.mark.slow


def report(result: Result, log_dir: Path) -> str:
    log = log_dir / "gateway.log"
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:]) if log.exists() else ""
    return f"\n{table([result])}\n--- gateway log (tail) ---\n{tail}"


async def test_kill_9_replicas_under_load(tmp_path: Path) -> None:
    # Two kills (at 8 s and 16 s), each replica back 2 s later; 20 clients throughout.
    result = await faults.kill(tmp_path, duration_s=19.0, clients=20, timeout_s=30.0)
    assert result.sent > 100, report(result, tmp_path)
    assert not result.missed, report(result, tmp_path)


async def test_frozen_replica_delays_nobody_past_the_bound(tmp_path: Path) -> None:
    result = await faults.freeze(
        tmp_path, freeze_s=12.0, bound_s=10.0, clients=12, warmup_s=3.0, after_s=2.0
    )
    assert not result.missed, report(result, tmp_path)


async def test_sigterm_drains_within_the_bound(tmp_path: Path) -> None:
    result = await faults.shutdown(tmp_path, bound_s=3.0)
    assert not result.missed, report(result, tmp_path)
