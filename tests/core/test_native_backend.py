"""Which hot path runs (core/_native/__init__.py): the compiled one when it is built, unless
``PREFIXROUTE_PURE_PYTHON=1``; the choice is made once per process, at import, silently."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from prefixroute.core import _native
from prefixroute.core._lru import ReplicaLRU, lru_factory

PROBE = (
    "from prefixroute.core import _native;"
    "print(_native.LRU is None, _native.chain_xxh3 is None, _native.missing())"
)
BUILT = importlib.util.find_spec("prefixroute.core._native._hotpath") is not None


def probe(**env: str) -> tuple[str, str]:
    clean = {k: v for k, v in os.environ.items() if k != "PREFIXROUTE_PURE_PYTHON"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=clean | env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip(), done.stderr


def test_the_switch_forces_the_pure_python_path_without_a_warning() -> None:
    out, err = probe(PREFIXROUTE_PURE_PYTHON="1")
    assert out == "True True PREFIXROUTE_PURE_PYTHON is set"
    assert err == ""


@pytest.mark.skipif(not BUILT, reason="the extension is not built (no C compiler)")
@pytest.mark.parametrize("value", [None, "0", ""])
def test_the_built_extension_is_used_unless_switched_off(value: str | None) -> None:
    out, err = probe() if value is None else probe(PREFIXROUTE_PURE_PYTHON=value)
    assert out == "False False None"
    assert err == ""


def test_the_reference_lru_is_used_when_not_compiled_or_not_built() -> None:
    assert lru_factory(False) is ReplicaLRU
    assert (lru_factory(True) is ReplicaLRU) == (_native.LRU is None)
