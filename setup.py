"""Builds the compiled hot path (``src/prefixroute/core/_native/*.c``); every other
setting is in pyproject.toml.

The extension is optional: with no C compiler, or a compiler that fails, the install goes on and
the package runs its pure-Python path, with the same results, only slower. ``make install`` then
says so, once (pip hides a build's own warnings).
"""

from __future__ import annotations

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE = "src/prefixroute/core/_native"


class OptionalBuildExt(build_ext):
    """A failed extension build warns and leaves the pure-Python path; it never fails the
    install. ``optional=True`` alone does not cover a compiler that cannot be found at all."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # any compiler failure: the package still works without it
            self.warn(f"prefixroute: not building {ext.name} ({exc}); pure Python is used")


setup(
    ext_modules=[
        Extension(
            "prefixroute.core._native._hotpath",
            sources=[
                f"{NATIVE}/{name}.c" for name in ("_hotpath", "chain", "lru", "lrus", "solve")
            ],
            depends=[
                f"{NATIVE}/{name}.h"
                for name in ("glue", "hotpath", "match", "oatable", "table", "vendor/xxhash")
            ],
            # solve.c must add and multiply exactly as core/_solve.py does: no fused multiply-add.
            extra_compile_args=["-ffp-contract=off"],
            optional=True,
        ),
        # The simulator's KV block pool (sim/kv_cache.py is its reference).
        Extension(
            "prefixroute.core._native._kvcache",
            sources=[f"{NATIVE}/kvcache.c"],
            depends=[f"{NATIVE}/{name}.h" for name in ("glue", "kvpool", "oatable")],
            optional=True,
        ),
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
