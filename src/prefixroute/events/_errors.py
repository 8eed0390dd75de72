"""Errors of the KV-event adapter; foreign ones (msgspec, zmq) are translated where they occur.

Hierarchy::

    PrefixrouteError
    ├── ConfigError
    │   └── BadEndpoint         a KV-event endpoint spec that does not parse
    └── EventStreamError        something wrong with what an engine sent
        └── EventDecodeError    frames or a payload that are not a vLLM KV-event batch
"""

from __future__ import annotations

from prefixroute.core import ConfigError, PrefixrouteError


class BadEndpoint(ConfigError):
    """A KV-event endpoint spec (``bind:tcp://...``) is malformed."""


class EventStreamError(PrefixrouteError):
    """An engine's KV-event stream carried something we cannot use."""


class EventDecodeError(EventStreamError):
    """A message is not ``[topic, 8-byte sequence, msgpack KVEventBatch]``."""
