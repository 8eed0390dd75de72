"""Errors raised by prefixroute: the one hierarchy, drawn here for every package.

Every error we raise on purpose descends from :class:`PrefixrouteError`, so ``cli.main`` turns
any of them into one line on stderr. The classes defined in this module are the core's; the
others live beside the code that raises them (the module named on the right) and subclass a
class here, so callers catch at the level they can handle::

    PrefixrouteError                  base of everything we raise on purpose
    ├── ConfigError                   a bad parameter, flag or config value
    │   ├── UnknownPolicy             a policy name that is not in the registry
    │   ├── UnknownWorkload           a workload name not in the registry (sim.workloads)
    │   └── BadEndpoint               a KV-event endpoint spec that does not parse (events)
    ├── NoReplicaAvailable            no candidate replica to route to
    ├── RequestTooLarge               a request that can never fit a replica's KV cache
    ├── ModelNotFound                 no replica (or not this replica) serves the model asked for
    ├── InvalidPrompt                 a request the router cannot key (also a ValueError)
    │   └── UnroutableRequest         a Serve request with no prompt at all (ray_serve)
    ├── EventStreamError              an engine's KV-event stream carried garbage (events)
    │   └── EventDecodeError          frames that are not a KV-event batch (events)
    ├── EngineStopped                 the emulated engine's loop is not running (emulate)
    ├── EmulateError                  the emulated replica refuses a request (emulate)
    │   └── InvalidRequest            malformed JSON or a bad field (emulate)
    └── GatewayError                  the gateway refuses or fails a request (gateway._errors:
        ├── BadRequest                its docstring draws this branch in full, with statuses)
        │   ├── InvalidJSON
        │   └── MalformedBody
        ├── Unauthorized, RequestTimeout, NotFound, Conflict, PayloadTooLarge
        ├── TooManyRequests
        │   └── RateLimited
        ├── Overloaded, ShuttingDown
        └── UpstreamError
            └── UpstreamTimeout
                └── AnswerTimeout

Foreign exceptions are translated at the module that meets them (``raise ... from``). Each HTTP
edge (the gateway, the emulated replica) answers errors from one table of :class:`ErrorSpec`
rows keyed by class and looked up along the exception's MRO (:func:`spec_along_mro`), so a
subclass without a row of its own answers as its parent does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


class PrefixrouteError(Exception):
    """Base class of every error prefixroute raises on purpose."""


class ConfigError(PrefixrouteError):
    """A parameter, flag or configuration value is invalid."""


class UnknownPolicy(ConfigError):
    """A policy name is not in the registry; the message lists the valid names."""


class NoReplicaAvailable(PrefixrouteError):
    """No candidate replica can take the request (none registered, healthy or serving the model)."""


class RequestTooLarge(PrefixrouteError):
    """A request needs more KV blocks than a replica has in total."""


class ModelNotFound(PrefixrouteError):
    """The request names a model that no replica serves (gateway), or that this one does not
    (emulated replica): a 404 at either edge."""


class InvalidPrompt(PrefixrouteError, ValueError):
    """A request's ``messages`` or ``prompt`` cannot be read; the message says which and why.

    Each front end translates it into its own error (HTTP 400, a failed Serve request)."""


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    """How an HTTP edge answers one error class (OpenAI-style error bodies)."""

    status: int  # HTTP status
    type: str  # OpenAI error ``type``
    code: str | None = None  # OpenAI error ``code`` (None: the edge fills its own)
    retry_after: bool = False  # add Retry-After


def spec_along_mro(
    table: Mapping[type[BaseException], ErrorSpec], exc: BaseException, default: ErrorSpec
) -> ErrorSpec:
    """The row of the nearest class on ``exc``'s MRO, else ``default`` (the catch-all)."""
    for cls in type(exc).__mro__:
        spec = table.get(cls)
        if spec is not None:
            return spec
    return default
