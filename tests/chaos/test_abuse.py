"""Poison bodies, path tricks and slow readers against real processes, at CI size."""

from __future__ import annotations

from pathlib import Path

import pytest

from . import abuse
from .test_faults import report

pytestmark = pytest.mark.slow


def test_traversal_paths_cover_every_form() -> None:
    paths = abuse.traversal_paths()
    for must in ("/v1/../reset_prefix_cache", "/v1/%2e%2e/metrics", "/v1/%2E./health",
                 "/v1/%252e%252e/metrics", "/v1/chat/%2e%2e/completions", "/v1//health",
                 "/v1/..\\metrics"):  # fmt: skip
        assert must in paths
    assert len(set(paths)) == len(paths)


async def test_poison_requests_eject_no_replica(tmp_path: Path) -> None:
    result = await abuse.poison(tmp_path, per_kind=100)
    assert not result.missed, report(result, tmp_path)


async def test_no_path_trick_reaches_a_replica(tmp_path: Path) -> None:
    result = await abuse.paths(tmp_path)
    assert not result.missed, report(result, tmp_path)


async def test_slow_readers_hold_no_replica_slot(tmp_path: Path) -> None:
    result = await abuse.slow_readers(tmp_path, readers=16, canary_s=3.0)
    assert not result.missed, report(result, tmp_path)
