"""Says whether the Ray Serve tests ran: a skip without ray, a failure if it was required."""

from __future__ import annotations

import pytest

from .support import RAY_MISSING, REQUIRED

pytestmark = pytest.mark.ray


def test_ray_is_installed() -> None:
    if RAY_MISSING:
        why = "ray is not installed here: `make test-ray` runs these tests in .cache/ray-venv"
        if REQUIRED:
            pytest.fail(why)
        pytest.skip(why)
