"""What every Ray Serve test module shares, importable without ray."""

from __future__ import annotations

import importlib.util
import os

import pytest

RAY_MISSING = importlib.util.find_spec("ray") is None
REQUIRED = os.environ.get("PREFIXROUTE_RAY_REQUIRED") == "1"  # set by `make test-ray`

# ray and pydantic emit deprecation warnings of their own at run time; ours still fail.
MARKS = [pytest.mark.ray, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
