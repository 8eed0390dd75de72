"""Errors raised by prefixroute.

Hierarchy (catch at the level you can handle)::

    PrefixrouteError            base of everything we raise on purpose
    ├── ConfigError             a bad parameter, flag or config value
    │   ├── UnknownPolicy       a policy name that is not in the registry
    │   └── UnknownWorkload     a workload name that is not in the registry
    ├── NoReplicaAvailable      no candidate replica to route to
    └── RequestTooLarge         a request that can never fit a replica's KV cache

Foreign exceptions are translated at the module that meets them (``raise ... from``).
"""

from __future__ import annotations


class PrefixrouteError(Exception):
    """Base class of every error prefixroute raises on purpose."""


class ConfigError(PrefixrouteError):
    """A parameter, flag or configuration value is invalid."""


class UnknownPolicy(ConfigError):
    """A policy name is not in the registry; the message lists the valid names."""


class UnknownWorkload(ConfigError):
    """A workload name is not in the registry; the message lists the valid names."""


class NoReplicaAvailable(PrefixrouteError):
    """No candidate replica can take the request (none registered, healthy or serving the model)."""


class RequestTooLarge(PrefixrouteError):
    """A request needs more KV blocks than a replica has in total."""
