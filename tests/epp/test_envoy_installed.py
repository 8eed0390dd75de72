"""Says whether the Envoy tests ran: a skip without Envoy, a failure if it was required."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.envoy


def test_envoy_is_installed(envoy_path: str) -> None:
    assert envoy_path
