"""A local Ray instance for the Ray Serve tests, and the switch that skips them without ray.

ray is an optional extra that the project's .venv does not have (``make test-ray`` builds
.cache/ray-venv with it). Without ray these modules are not collected, except
``test_ray_installed.py``, whose one test skips, or fails when ``PREFIXROUTE_RAY_REQUIRED=1``
(``make test-ray``): then the other modules are collected too, and fail to import.

ray (and pydantic under it) warn at import; importing it here, warnings ignored, keeps that out
of the tests, which the project runs with warnings as errors.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from .support import RAY_MISSING, REQUIRED

HERE = Path(__file__).parent

collect_ignore = (
    [p.name for p in HERE.glob("test_*.py") if p.name != "test_ray_installed.py"]
    if RAY_MISSING and not REQUIRED
    else []
)

if not RAY_MISSING:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import ray  # noqa: F401
        import ray.serve  # noqa: F401

        import prefixroute.ray_serve  # noqa: F401


@pytest.fixture(scope="session")
def ray_instance() -> Iterator[None]:
    """Ray on this machine only: 4 logical CPUs (replicas ask for none), no dashboard."""
    import ray
    from ray import serve

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        serve.start(http_options={"location": "NoServer"})  # handles only, no HTTP proxy
        yield
    finally:
        serve.shutdown()
        ray.shutdown()
