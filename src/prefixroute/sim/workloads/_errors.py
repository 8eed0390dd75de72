"""The simulator's own configuration error: a workload name that is not in the registry."""

from __future__ import annotations

from prefixroute.core import ConfigError


class UnknownWorkload(ConfigError):
    """A workload name is not in the registry; the message lists the valid names.

    A ``ConfigError`` (see the hierarchy in :mod:`prefixroute.core.errors`), so the CLI prints
    it as one line like any other bad flag."""
