"""The compiled hot path: chained block hashing, a replica's LRU and the speed model's normal
equations in C (``*.c`` here).

``pip install -e .`` builds it (``setup.py``) when a C compiler is there; without one the
install goes on and the pure-Python references run instead, with the same results:
``BlockHasher._hash_bytes`` and ``_packed`` (core/hashing.py), ``ReplicaLRU``
(core/_lru.py; ``match_each`` is a loop of its ``match``) and
``add_observations(compiled=False)`` (core/_solve.py); the simulator's KV
block pool (``kvcache.c``, a module of its own) has ``KVCache`` (sim/kv_cache.py).
``PREFIXROUTE_PURE_PYTHON=1`` switches the compiled path off (mutation testing mutates the
Python, so its tests must run it). The choice is made once, at import, and never warned about
there: ``make install`` says once that the extension is missing (:func:`missing`).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prefixroute.core._native._hotpath import LRU as NativeLRU
    from prefixroute.core._native._kvcache import KVCache as NativeKVCache

__all__ = [
    "LRU",
    "KVCache",
    "PURE_PYTHON_ENV",
    "ChainFn",
    "add_observations",
    "context_per_token",
    "solve_feasible",
    "chain_xxh3",
    "distinct_blocks",
    "match_each",
    "missing",
    "pack_u32",
]

PURE_PYTHON_ENV = "PREFIXROUTE_PURE_PYTHON"

ChainFn = Callable[[bytes | memoryview, int, int, int, int], list[int]]


def _load() -> tuple[ModuleType | None, str | None]:
    """The extension module, or None and why not."""
    if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        return None, f"{PURE_PYTHON_ENV} is set"
    try:
        return importlib.import_module("prefixroute.core._native._hotpath"), None
    except ImportError as exc:  # not built: no compiler when it was installed
        return None, f"the C extension is not built: {exc}"


_ext, _why_not = _load()
chain_xxh3: ChainFn | None = None if _ext is None else _ext.chain_xxh3
pack_u32: Callable[[object], bytes | None] | None = None if _ext is None else _ext.pack_u32
LRU: type[NativeLRU] | None = None if _ext is None else _ext.LRU
# One chain against many compiled LRUs in one call (the reference: a loop of ``ReplicaLRU.match``).
match_each: Callable[[Sequence[object], Sequence[int]], list[int]] | None = (
    None if _ext is None else _ext.match_each
)
# Distinct keys of many compiled LRUs (the reference: the size of a set of their blocks).
distinct_blocks: Callable[[Sequence[object]], int] | None = (
    None if _ext is None else _ext.distinct_blocks
)
# The speed model's normal equations and their solve (solve.c; the references are
# core/_solve.py's and core/speed_fit.py's).
add_observations: Callable[..., int | None] | None = None if _ext is None else _ext.add_observations
solve_feasible: Callable[..., list[float]] | None = None if _ext is None else _ext.solve_feasible
context_per_token: Callable[..., float] | None = None if _ext is None else _ext.context_per_token


def _load_kv_cache() -> type[NativeKVCache] | None:
    """The simulator's KV block pool in C (``kvcache.c``, its own module: the reference is
    ``sim/kv_cache.py``), or None under the same switch, or when it is not built."""
    if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        return None
    try:
        module = importlib.import_module("prefixroute.core._native._kvcache")
    except ImportError:  # not built: no compiler when it was installed
        return None
    native: type[NativeKVCache] = module.KVCache
    return native


KVCache: type[NativeKVCache] | None = _load_kv_cache()


def missing() -> str | None:
    """Why the compiled hot path is not in use, or None when it is."""
    return _why_not
